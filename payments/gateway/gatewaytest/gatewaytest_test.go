package gatewaytest_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/goleak"

	"pitlane/payments/gateway/gatewaysim"
	"pitlane/payments/gateway/gatewaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSimulatorHonoursTheContract runs the suite against the simulator over real HTTP, driving
// the customer side through the /_sim control API (so the control API is exercised too).
func TestSimulatorHonoursTheContract(t *testing.T) {
	sim := gatewaysim.New(gatewaysim.Options{APIKey: "sk_contract", CaptureDelay: 0})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { _ = sim.Close() }) // first: releases anything still parked

	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	t.Cleanup(hc.CloseIdleConnections)

	gatewaytest.Run(t, gatewaytest.Target{
		BaseURL:    srv.URL,
		APIKey:     "sk_contract",
		HTTPClient: hc,
		Controls:   gatewaytest.SimControls(gatewaysim.NewRemote(srv.URL, hc)),
	})
}
