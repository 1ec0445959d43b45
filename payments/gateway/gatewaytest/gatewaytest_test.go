package gatewaytest_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
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

// brokenEnv makes the child process of TestTheSuiteCatchesBrokenServers run the suite against
// a deliberately broken server.
const brokenEnv = "GATEWAYTEST_BROKEN"

// TestTheSuiteCatchesBrokenServers is the suite's negative control: against a server with one
// rule broken, the subtests guarding that rule fail (and an unrelated one still passes). The
// suite runs in a child process, since a failing subtest would fail this test too.
func TestTheSuiteCatchesBrokenServers(t *testing.T) {
	if mode := os.Getenv(brokenEnv); mode != "" {
		runBroken(t, mode)
		return
	}
	t.Parallel()
	for _, tc := range []struct {
		mode     string
		wantFail []string
	}{
		{"ignore-keys", []string{"same_key_and_body_replays", "a_key_in_flight_answers_409", "same_key_with_another_body_is_422"}},
		{"no-auth", []string{"401_unauthorized"}},
		{"no-replay-header", []string{"same_key_and_body_replays"}},
		{"search-oldest-first", []string{"search_by_reference_lists_newest_first"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestTheSuiteCatchesBrokenServers$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+tc.mode)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a server with %s:\n%s", tc.mode, out)
			}
			for _, name := range tc.wantFail {
				if !regexp.MustCompile(`--- FAIL: \S+/` + regexp.QuoteMeta(name)).Match(out) {
					t.Errorf("with %s, no failing subtest %q:\n%s", tc.mode, name, out)
				}
			}
			if !bytes.Contains(out, []byte("--- PASS: TestTheSuiteCatchesBrokenServers/register_answers_201")) {
				t.Errorf("with %s, an unrelated rule failed too (the control is not specific):\n%s", tc.mode, out)
			}
		})
	}
}

func runBroken(t *testing.T, mode string) {
	opts := gatewaysim.Options{APIKey: "sk_contract"}
	if mode == "no-auth" {
		opts.APIKey = ""
	}
	sim := gatewaysim.New(opts)
	if mode == "ignore-keys" {
		sim.SetIgnoreIdempotencyKeys(true)
	}
	var h http.Handler = sim
	switch mode {
	case "no-replay-header":
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec := httptest.NewRecorder()
			sim.ServeHTTP(rec, r)
			copyWithout(w, rec, "Idempotent-Replayed", nil)
		})
	case "search-oldest-first":
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec := httptest.NewRecorder()
			sim.ServeHTTP(rec, r)
			if r.Method != http.MethodGet || r.URL.Path != "/v1/payments" {
				copyWithout(w, rec, "", nil)
				return
			}
			var list struct {
				Data []json.RawMessage `json:"data"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &list)
			slices.Reverse(list.Data)
			body, _ := json.Marshal(list)
			copyWithout(w, rec, "Content-Length", body)
		})
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { _ = sim.Close() })
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	t.Cleanup(hc.CloseIdleConnections)
	gatewaytest.Run(t, gatewaytest.Target{
		BaseURL: srv.URL, APIKey: "sk_contract", HTTPClient: hc,
		Controls: gatewaytest.SimControls(gatewaysim.NewRemote(srv.URL, hc)),
	})
}

// copyWithout writes a recorded answer, minus one header, with body if not nil.
func copyWithout(w http.ResponseWriter, rec *httptest.ResponseRecorder, header string, body []byte) {
	for k, v := range rec.Header() {
		if !strings.EqualFold(k, header) {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(rec.Code)
	if body == nil {
		body = rec.Body.Bytes()
	}
	_, _ = w.Write(body)
}
