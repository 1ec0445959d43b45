package gatewaysim_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
)

// TestStateSurvivesARestart: a simulator started from the state another one saved knows its
// payments (statuses, references, the capture still due), its refunds and its finished keys, and
// goes on numbering as if it had never stopped. Without it (`pitlane dev` restarted on the same
// database), every demo session pointed at a payment the gateway answered 404 for.
func TestStateSurvivesARestart(t *testing.T) {
	t.Parallel()
	clock := payments.NewManualClock(epoch)
	opts := gatewaysim.Options{Now: clock.Now, CaptureDelay: time.Minute}
	path := filepath.Join(t.TempDir(), "dev", "gatewaysim.json") // its directory does not exist yet
	ctx := context.Background()

	first := start(t, opts)
	paid := first.mustRegister(t, "reg-paid", "order-1")
	waiting := first.mustRegister(t, "reg-waiting", "order-2")
	authorized := first.mustRegister(t, "reg-auth", "order-3")
	if _, err := first.sim.Succeed(paid); err != nil {
		t.Fatal(err)
	}
	if _, err := first.sim.Approve(authorized); err != nil {
		t.Fatal(err)
	}
	refund := first.call(ctx, "POST", "/v1/payments/"+paid+"/refunds", "rf-1", `{"amount":500}`)
	if refund.status != http.StatusCreated {
		t.Fatalf("refund: %d %v", refund.status, refund.body)
	}
	if err := first.sim.SaveState(path); err != nil {
		t.Fatal(err)
	}

	second := start(t, opts)
	if err := second.sim.LoadState(path); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{paid: "succeeded", waiting: "pending", authorized: "authorized"} {
		if got := second.statusOf(t, id); got != want {
			t.Errorf("%s after the restart: %s, want %s", id, got, want)
		}
	}
	// The same key and body: the same payment, replayed, not a second one.
	if a := second.register(t, "reg-waiting", "order-2"); a.status != http.StatusOK || a.body["id"] != waiting {
		t.Fatalf("register replayed after the restart: %d %v", a.status, a.body)
	}
	if a := second.call(ctx, "POST", "/v1/payments/"+paid+"/refunds", "rf-1", `{"amount":500}`); a.status != http.StatusOK || a.body["id"] != refund.body["id"] {
		t.Fatalf("refund replayed after the restart: %d %v", a.status, a.body)
	}
	// What is left to refund was kept: 1999 - 500.
	if a := second.call(ctx, "POST", "/v1/payments/"+paid+"/refunds", "rf-2", `{"amount":1500}`); a.status != http.StatusConflict {
		t.Fatalf("a refund past the remaining amount after the restart: %d %v", a.status, a.body)
	}
	if a := second.call(ctx, "GET", "/v1/payments?reference=order-2", "", ""); a.status != http.StatusOK || len(a.body["data"].([]any)) != 1 {
		t.Fatalf("by reference after the restart: %d %v", a.status, a.body)
	}
	// The capture that was due goes on with the clock.
	clock.Advance(time.Minute)
	second.sim.Tick()
	if got := second.statusOf(t, authorized); got != "succeeded" {
		t.Fatalf("the authorized payment a capture delay later: %s", got)
	}
	// A new payment does not reuse anything of the first run.
	if id := second.mustRegister(t, "reg-new", "order-4"); id == paid || id == waiting || id == authorized {
		t.Fatalf("new payment id %s reused", id)
	}
	if n := len(second.sim.Payments()); n != 4 {
		t.Fatalf("%d payments, want 4", n)
	}
}

// TestLoadStateOfNothing: no file is the first start (empty, no error); a file that is not a
// state is an error naming it, and leaves the simulator as it was.
func TestLoadStateOfNothing(t *testing.T) {
	t.Parallel()
	e := start(t, gatewaysim.Options{})
	dir := t.TempDir()
	if err := e.sim.LoadState(filepath.Join(dir, "missing.json")); err != nil {
		t.Fatalf("missing file: %v", err)
	}
	id := e.mustRegister(t, "k", "r")
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.LoadState(bad); err == nil {
		t.Fatal("a file that is not a state was loaded")
	}
	if e.statusOf(t, id) != "pending" {
		t.Fatal("a failed load changed the simulator")
	}
}
