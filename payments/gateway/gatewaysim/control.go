package gatewaysim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"
)

// The control API under /_sim/ mirrors the Go methods for tests and demos that drive the
// simulator over HTTP (Remote is its client). It has no auth: never expose a simulator where
// anyone but you can reach it.
//
//	GET  /_sim/state                          everything below in one object
//	POST /_sim/faults/{op|all}                {"latency_ms","error_rate","fail_next","drop_rate","drop_next"} replaces the op's faults
//	POST /_sim/ignore-idempotency-keys        {"enabled": true|false}
//	POST /_sim/pause/{op}                     park calls of op until released
//	POST /_sim/release/{op}
//	POST /_sim/wait/parked/{op}?count=N&timeout=10s   200 once N calls are parked; 504 on timeout
//	POST /_sim/wait/idle/{op}?timeout=10s     200 once no call of op is being handled
//	GET  /_sim/calls                          {"ops":{op:n},"keys":{key:n}}
//	GET  /_sim/payments[?reference=R]         {"data":[payment + return_url, refunded]}
//	POST /_sim/payments/{id}/approve|decline|succeed|expire   decline takes {"decline_code"}; 409 in the wrong state
//	POST /_sim/tick                           apply capture and expiry rules now
//	GET  /_sim/webhooks                       {"faults":{…},"deliveries":[…]}
//	POST /_sim/webhooks                       {"duplicate","delay_ms","reorder"} replaces the webhook faults
//	POST /_sim/webhooks/flush                 send what Reorder holds
//	POST /_sim/wait/webhooks?timeout=10s      200 once nothing is queued or in flight
//	POST /_sim/reset

// FaultsJSON is Faults on the wire.
type FaultsJSON struct {
	LatencyMS int64   `json:"latency_ms"`
	ErrorRate float64 `json:"error_rate"`
	FailNext  int     `json:"fail_next"`
	DropRate  float64 `json:"drop_rate"`
	DropNext  int     `json:"drop_next"`
}

func faultsToJSON(f Faults) FaultsJSON {
	return FaultsJSON{LatencyMS: f.Latency.Milliseconds(), ErrorRate: f.ErrorRate, FailNext: f.FailNext, DropRate: f.DropRate, DropNext: f.DropNext}
}

func (j FaultsJSON) faults() Faults {
	return Faults{Latency: time.Duration(j.LatencyMS) * time.Millisecond, ErrorRate: j.ErrorRate, FailNext: j.FailNext, DropRate: j.DropRate, DropNext: j.DropNext}
}

// WebhookFaultsJSON is WebhookFaults on the wire.
type WebhookFaultsJSON struct {
	Duplicate int   `json:"duplicate"`
	DelayMS   int64 `json:"delay_ms"`
	Reorder   bool  `json:"reorder"`
}

func webhookFaultsToJSON(f WebhookFaults) WebhookFaultsJSON {
	return WebhookFaultsJSON{Duplicate: f.Duplicate, DelayMS: f.Delay.Milliseconds(), Reorder: f.Reorder}
}

func (j WebhookFaultsJSON) faults() WebhookFaults {
	return WebhookFaults{Duplicate: j.Duplicate, Delay: time.Duration(j.DelayMS) * time.Millisecond, Reorder: j.Reorder}
}

// SimPaymentJSON is a payment as the control API shows it: the contract's object plus what
// only the simulator knows.
type SimPaymentJSON struct {
	paymentJSON
	ReturnURL string `json:"return_url,omitempty"`
	Refunded  int64  `json:"refunded"`
}

func simPaymentToJSON(p Payment) SimPaymentJSON {
	return SimPaymentJSON{paymentJSON: toJSON(p), ReturnURL: p.ReturnURL, Refunded: p.Refunded}
}

// StateJSON is GET /_sim/state.
type StateJSON struct {
	IgnoreIdempotencyKeys bool              `json:"ignore_idempotency_keys"`
	Faults                map[Op]FaultsJSON `json:"faults"`
	Paused                []Op              `json:"paused"`
	Parked                map[Op]int        `json:"parked"`
	Calls                 Calls             `json:"calls"`
	Webhooks              WebhookFaultsJSON `json:"webhooks"`
	Payments              int               `json:"payments"`
}

func (s *Sim) state() StateJSON {
	st := StateJSON{Faults: map[Op]FaultsJSON{}, Parked: map[Op]int{}, Paused: []Op{}}
	s.mu.Lock()
	st.IgnoreIdempotencyKeys = s.ignoreKeys
	for _, op := range Ops {
		if f, ok := s.faults[op]; ok && f != (Faults{}) {
			st.Faults[op] = faultsToJSON(f)
		}
		if s.pauses[op] != nil {
			st.Paused = append(st.Paused, op)
		}
		if n := s.parked[op]; n > 0 {
			st.Parked[op] = n
		}
	}
	st.Payments = len(s.payments)
	s.mu.Unlock()
	st.Calls = s.Calls()
	st.Webhooks = webhookFaultsToJSON(s.WebhookFaults())
	return st
}

func (s *Sim) controlRoutes(mux *http.ServeMux) {
	ok := func(w http.ResponseWriter) { writeJSON(w, http.StatusOK, map[string]bool{"ok": true}) }
	opOf := func(w http.ResponseWriter, r *http.Request) (Op, bool) {
		op := Op(r.PathValue("op"))
		if !validOp(op) {
			writeJSON(w, http.StatusNotFound, errorJSON{Error: "not_found", Message: "unknown operation " + string(op)})
			return "", false
		}
		return op, true
	}

	mux.HandleFunc("GET /_sim/state", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.state())
	})
	mux.HandleFunc("POST /_sim/faults/{op}", func(w http.ResponseWriter, r *http.Request) {
		var j FaultsJSON
		if !decode(w, r, &j) {
			return
		}
		ops := []Op{Op(r.PathValue("op"))}
		if r.PathValue("op") == "all" {
			ops = Ops
		} else if _, valid := opOf(w, r); !valid {
			return
		}
		for _, op := range ops {
			_ = s.SetFaults(op, j.faults())
		}
		ok(w)
	})
	mux.HandleFunc("POST /_sim/ignore-idempotency-keys", func(w http.ResponseWriter, r *http.Request) {
		var j struct {
			Enabled bool `json:"enabled"`
		}
		if !decode(w, r, &j) {
			return
		}
		s.SetIgnoreIdempotencyKeys(j.Enabled)
		ok(w)
	})
	mux.HandleFunc("POST /_sim/pause/{op}", func(w http.ResponseWriter, r *http.Request) {
		if op, valid := opOf(w, r); valid {
			_ = s.Pause(op)
			ok(w)
		}
	})
	mux.HandleFunc("POST /_sim/release/{op}", func(w http.ResponseWriter, r *http.Request) {
		if op, valid := opOf(w, r); valid {
			s.Release(op)
			ok(w)
		}
	})
	mux.HandleFunc("POST /_sim/wait/parked/{op}", func(w http.ResponseWriter, r *http.Request) {
		op, valid := opOf(w, r)
		if !valid {
			return
		}
		n, err := strconv.Atoi(r.URL.Query().Get("count"))
		if err != nil || n < 1 {
			n = 1
		}
		s.wait(w, r, func(ctx context.Context) error { return s.WaitParked(ctx, op, n) },
			func() any { return map[string]int{"parked": s.Parked(op)} })
	})
	mux.HandleFunc("POST /_sim/wait/idle/{op}", func(w http.ResponseWriter, r *http.Request) {
		if op, valid := opOf(w, r); valid {
			s.wait(w, r, func(ctx context.Context) error { return s.WaitIdle(ctx, op) }, nil)
		}
	})
	mux.HandleFunc("POST /_sim/wait/webhooks", func(w http.ResponseWriter, r *http.Request) {
		s.wait(w, r, s.WebhooksIdle, nil)
	})
	mux.HandleFunc("GET /_sim/calls", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Calls())
	})
	mux.HandleFunc("GET /_sim/payments", func(w http.ResponseWriter, r *http.Request) {
		var list []Payment
		if ref := r.URL.Query().Get("reference"); ref != "" {
			list = s.PaymentsByReference(ref)
		} else {
			list = s.Payments()
		}
		data := make([]SimPaymentJSON, len(list))
		for i, p := range list {
			data[i] = simPaymentToJSON(p)
		}
		writeJSON(w, http.StatusOK, map[string]any{"data": data})
	})
	mux.HandleFunc("POST /_sim/payments/{id}/{action}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		var (
			p   Payment
			err error
		)
		switch r.PathValue("action") {
		case "approve":
			p, err = s.Approve(id)
		case "decline":
			var j struct {
				DeclineCode string `json:"decline_code"`
			}
			if !decode(w, r, &j) {
				return
			}
			p, err = s.Decline(id, j.DeclineCode)
		case "succeed":
			p, err = s.Succeed(id)
		case "expire":
			p, err = s.Expire(id)
		default:
			writeJSON(w, http.StatusNotFound, errorJSON{Error: "not_found", Message: "actions: approve, decline, succeed, expire"})
			return
		}
		switch {
		case errors.Is(err, ErrNotFound):
			writeJSON(w, http.StatusNotFound, errorJSON{Error: "not_found", Message: err.Error()})
		case errors.Is(err, ErrWrongState):
			writeJSON(w, http.StatusConflict, errorJSON{Error: "wrong_state", Status: p.Status, Message: err.Error()})
		default:
			writeJSON(w, http.StatusOK, simPaymentToJSON(p))
		}
	})
	mux.HandleFunc("POST /_sim/tick", func(w http.ResponseWriter, r *http.Request) {
		s.Tick()
		ok(w)
	})
	mux.HandleFunc("GET /_sim/webhooks", func(w http.ResponseWriter, r *http.Request) {
		d := s.Deliveries()
		if d == nil {
			d = []Delivery{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"faults": webhookFaultsToJSON(s.WebhookFaults()), "deliveries": d})
	})
	mux.HandleFunc("POST /_sim/webhooks", func(w http.ResponseWriter, r *http.Request) {
		var j WebhookFaultsJSON
		if !decode(w, r, &j) {
			return
		}
		s.SetWebhookFaults(j.faults())
		ok(w)
	})
	mux.HandleFunc("POST /_sim/webhooks/flush", func(w http.ResponseWriter, r *http.Request) {
		s.FlushHeldWebhooks()
		ok(w)
	})
	mux.HandleFunc("POST /_sim/reset", func(w http.ResponseWriter, r *http.Request) {
		s.Reset()
		ok(w)
	})
	mux.HandleFunc("/_sim/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, errorJSON{Error: "not_found", Message: "no such control endpoint"})
	})
}

// wait serves a long poll: 200 when f returns, 504 when ?timeout= (default 10 s, at most
// 60 s) passes first.
func (s *Sim) wait(w http.ResponseWriter, r *http.Request, f func(context.Context) error, result func() any) {
	timeout := 10 * time.Second
	if v := r.URL.Query().Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			writeJSON(w, http.StatusBadRequest, errorJSON{Error: "invalid_request", Message: "timeout must be a Go duration like 5s"})
			return
		}
		timeout = min(d, time.Minute)
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	if err := f(ctx); err != nil {
		writeJSON(w, http.StatusGatewayTimeout, errorJSON{Error: "timeout", Message: err.Error()})
		return
	}
	if result == nil {
		writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
		return
	}
	writeJSON(w, http.StatusOK, result())
}

// decode reads an optional JSON body into v; an empty body leaves v as it is.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBytes))
	if err == nil && len(body) > 0 {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorJSON{Error: "invalid_request", Message: err.Error()})
		return false
	}
	return true
}
