package stripegw

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"pitlane/payments"
)

// wireCall is one request the adapter sent, as the transport saw it.
type wireCall struct {
	Method         string
	Path           string
	Query          url.Values
	Form           url.Values // the decoded POST body
	IdempotencyKey string
	Status         int // 0 when no response arrived
}

// wireRecorder sits under the adapter's transport and records every request and the status it
// got, so tests assert on what was really on the wire (the Idempotency-Key header above all).
type wireRecorder struct {
	base  http.RoundTripper
	mu    sync.Mutex
	calls []wireCall
}

func (r *wireRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	c := wireCall{
		Method:         req.Method,
		Path:           req.URL.Path,
		Query:          req.URL.Query(),
		IdempotencyKey: req.Header.Get("Idempotency-Key"),
	}
	out := req
	if req.Body != nil {
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		if c.Form, err = url.ParseQuery(string(body)); err != nil {
			return nil, err
		}
		out = req.Clone(req.Context())
		out.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := r.base.RoundTrip(out)
	if err == nil {
		c.Status = resp.StatusCode
	}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
	return resp, err
}

func (r *wireRecorder) Calls() []wireCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]wireCall(nil), r.calls...)
}

// newTestGateway builds an adapter for baseURL over its own transport (closed at cleanup, so
// goleak sees no idle connection goroutines) with a recorder underneath.
func newTestGateway(t *testing.T, baseURL string, timeout time.Duration) (*Gateway, *wireRecorder) {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	rec := &wireRecorder{base: tr}
	g, err := New(Options{
		SecretKey:  "sk_test_pitlane",
		BaseURL:    baseURL,
		Timeout:    timeout,
		HTTPClient: &http.Client{Transport: rec},
	})
	if err != nil {
		t.Fatal(err)
	}
	return g, rec
}

// gatewayError unwraps err into the *payments.GatewayError every failure must be.
func gatewayError(t *testing.T, err error) *payments.GatewayError {
	t.Helper()
	if err == nil {
		t.Fatal("expected an error, got nil")
	}
	var ge *payments.GatewayError
	if !errors.As(err, &ge) {
		t.Fatalf("error %v (%T) is not a *payments.GatewayError", err, err)
	}
	return ge
}
