package handlers_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/web"
)

// Anonymous sign-in attempts took every connection of the replica's pool: the throttle lives in
// PostgreSQL, so every attempt (one about to be refused too) holds a connection for its throttle
// transaction, and all of them queue on one busy row (the global bucket, or one address's), and
// nothing bounded how many the anonymous /login path held: a flood starved the API, an
// authenticated read of a payment answered 503 (an outside review, hostile). Sign-ins now use
// at most a quarter of the pool at once (access.signInRoom); the rest wait in the process,
// holding no connection, and are refused as throttled after a few seconds.
//
// The global bucket's row is held here by another transaction: what a flood's queue on that
// row looks like to each waiter (under a flood every attempt waits for all those ahead of it).
// Negative control (run by hand): with room for as many sign-ins as the pool has connections,
// the API read is a 503 after its 2 s limit.
func TestASignInFloodLeavesThePoolToTheAPI(t *testing.T) {
	b := newAPIBench(t)
	p := wantPayment(t, b.do(post(createPath("o-flood"), `{"amount":500,"currency":"EUR"}`)), http.StatusCreated)

	// The replica under attack: a pool of 4 connections, requests bounded at 2 s.
	small := testdb.PoolOf(t, b.pool, 4)
	svc := payments.NewService(small, payments.Config{Gateway: b.gw, Clock: b.clock, ReplicaID: "r-small", CodeSecret: []byte("test-secret")})
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: small, ReplicaID: "r-small", Payments: svc,
		Access: access.New(small, b.clock), SecretKey: []byte(strings.Repeat("s", 32)), RequestTimeout: 2 * time.Second})

	// The global bucket's row exists (one earlier failed sign-in) and is busy.
	if _, err := b.access.SignIn(context.Background(), access.Attempt{Email: "x@example.com", Password: "wrong wrong wrong", Address: "192.0.2.1"}); payments.ErrorCode(err) != payments.EWRONG {
		t.Fatal(err)
	}
	release := holdInTx(t, b.pool, `SELECT 1 FROM login_buckets WHERE scope = 'global' FOR UPDATE`)

	// A flood: sixteen anonymous clients sending sign-ins back to back from sixteen addresses
	// (no CSRF token: Sec-Fetch-Site same-origin, as a script sends it when it likes).
	stop := make(chan struct{})
	answers := make(chan int, 1024)
	var workers []chan struct{}
	for i := range 16 {
		w := make(chan struct{})
		workers = append(workers, w)
		go func() {
			defer close(w)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				form := url.Values{"email": {fmt.Sprintf("guess%d-%d@example.com", i, n)}, "password": {"guess guess guess"}}
				r := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
				r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				r.Header.Set("Sec-Fetch-Site", "same-origin")
				r.RemoteAddr = fmt.Sprintf("198.51.100.%d:4000", i+1)
				rec := httptest.NewRecorder()
				e.ServeHTTP(rec, r)
				select {
				case answers <- rec.Code:
				default:
				}
			}
		}()
	}
	// Steady state: the first round of the flood has been answered.
	throttled := 0
	for range 16 {
		if <-answers == http.StatusTooManyRequests {
			throttled++
		}
	}
	// A good API client reads its payment.
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/api/v1/payments/"+p.ID, nil)
	r.Header.Set("Authorization", "Bearer "+b.key)
	start := time.Now()
	e.ServeHTTP(rec, r)
	t.Logf("api read %d after %v; pool stat total=%d acquired=%d", rec.Code, time.Since(start), small.Stat().TotalConns(), small.Stat().AcquiredConns())
	close(stop)
	release()
	for _, w := range workers {
		<-w
	}
	if rec.Code != http.StatusOK {
		t.Fatalf("an API read while anonymous sign-ins flood the replica: %d, want 200\n%s", rec.Code, rec.Body)
	}
	if throttled == 0 {
		t.Errorf("none of the flood's first answers was a 429: the sign-ins waiting for room were not refused as throttled")
	}
}
