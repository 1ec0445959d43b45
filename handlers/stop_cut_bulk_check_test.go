package handlers_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"pitlane/access"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// The stop's cut (the server's base context cancelled with web.ErrStopping at the shutdown
// grace's end) reaches the stuck list's bulk "Check now", a long route whose checks outlive the
// person's hang-up: the checks in flight end, the ones queued behind them are not started (their
// claims given back), and the request answers (the list's summary) before the server closes its
// connection. Before, CheckNow's work ran under WithoutCancel for its claim's time: the checks
// went on, more started after the cut, and the person got EOF when serve closed the connection.
// A review of this session's stop cut; negative control: CheckNow's work without the cut (as
// before), no answer within web.WriteMargin and six status calls.
func TestTheStopCutEndsTheStuckListsBulkCheck(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	b.deps = func(d *web.Deps) { d.RequestTimeout = web.RequestTimeoutFor(10 * time.Second) }
	_, e := b.replica(b.pool, "replica-stop", b.gw)
	var ids []string
	for _, o := range []string{"o-cut-1", "o-cut-2", "o-cut-3", "o-cut-4", "o-cut-5", "o-cut-6"} {
		ids = append(ids, b.payment(t, o, 100).ID)
	}
	fin := b.agent(t)
	fin.login("fin@example.com")
	fin.h = e
	page(t, fin.get("/finance/stuck"), http.StatusOK) // the CSRF token

	gate := b.gw.Hold(fakegw.OpStatus)
	defer gate.Open()
	stopping, cut := context.WithCancelCause(context.Background())
	form := url.Values{"id": ids, "csrf_token": {fin.csrf}}
	r := httptest.NewRequest(http.MethodPost, "/finance/stuck/check", strings.NewReader(form.Encode())).WithContext(stopping)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- fin.do(r) }()
	for range 4 { // checkNowParallel checks at the gateway
		mustWait(t, gate.Arrived(), "a check at the gateway")
	}
	cut(web.ErrStopping) // the shutdown grace ran out
	select {
	case rec := <-done:
		if rec.Code != http.StatusSeeOther && rec.Code != http.StatusServiceUnavailable {
			t.Errorf("the bulk check cut by the stop: %d, want its summary (303) or 503", rec.Code)
		}
		if n := b.gw.Calls(fakegw.OpStatus); n != 4 {
			t.Errorf("%d status calls, want the 4 in flight at the cut and none started after it", n)
		}
	case <-time.After(web.WriteMargin):
		gate.Open()
		rec := <-done
		t.Fatalf("the bulk check cut by the stop has no answer within web.WriteMargin (%s), when serve closes its connection; "+
			"once the gateway answered: %d, %d status calls (checks started after the cut: %d)",
			web.WriteMargin, rec.Code, b.gw.Calls(fakegw.OpStatus), b.gw.Calls(fakegw.OpStatus)-4)
	}
}
