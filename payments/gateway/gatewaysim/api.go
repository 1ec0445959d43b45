package gatewaysim

import (
	"crypto/subtle"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"
)

// maxRequestBytes bounds request bodies.
const maxRequestBytes = 64 << 10

// maxKeyLen is the contract's limit on Idempotency-Key.
const maxKeyLen = 64

var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

// Wire types of the contract. The client (refgw) has its own on purpose: two independent
// readings of gateway-api.md, checked against each other by the tests.

type paymentJSON struct {
	ID              string  `json:"id"`
	Status          string  `json:"status"`
	Amount          int64   `json:"amount"`
	Currency        string  `json:"currency"`
	Reference       string  `json:"reference"`
	ConfirmationURL string  `json:"confirmation_url"`
	Created         int64   `json:"created"`
	DeclineCode     *string `json:"decline_code"`
}

func toJSON(p Payment) paymentJSON {
	j := paymentJSON{
		ID: p.ID, Status: p.Status, Amount: p.Amount, Currency: p.Currency, Reference: p.Reference,
		ConfirmationURL: p.ConfirmationURL, Created: p.Created.Unix(),
	}
	if p.DeclineCode != "" {
		code := p.DeclineCode
		j.DeclineCode = &code
	}
	return j
}

type refundJSON struct {
	ID        string `json:"id"`
	PaymentID string `json:"payment_id"`
	Amount    int64  `json:"amount"`
	Status    string `json:"status"`
}

func refundToJSON(r Refund) refundJSON {
	return refundJSON(r)
}

type errorJSON struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
	Status  string `json:"status,omitempty"` // not_reversible carries the payment's status
}

// answer is what a call would send back.
type answer struct {
	status   int
	body     any
	replayed bool
}

func errAnswer(status int, code, message string) answer {
	return answer{status: status, body: errorJSON{Error: code, Message: message}}
}

func invalidAnswer(message string) answer {
	return errAnswer(http.StatusBadRequest, "invalid_request", message)
}

// call is one API request on its way through the pipeline.
type call struct {
	op   Op
	r    *http.Request
	key  string
	body []byte
}

// spec describes one operation to the pipeline.
type spec struct {
	op Op
	// mutating operations take an Idempotency-Key (required) and honour it.
	mutating bool
	// validate checks the request and returns the fingerprint of what it asks for (two calls
	// with one key must ask for the same thing), or a 400 answer.
	validate func(c *call) (fingerprint string, bad *answer)
	// exec does the work under s.mu. ok reports success; resourceID is what a replay returns.
	exec func(c *call) (a answer, resourceID string, ok bool)
	// replay builds the answer to a repeated key from the resource's current state, under s.mu.
	replay func(resourceID string) answer
}

// serve runs one API call through the pipeline: count, auth, validate, injected 5xx,
// idempotency key, latency, pause, process, drop-or-answer. The order is deliberate: faults that
// model "the request never got in" come before the key is taken; latency and pauses model a
// slow gateway and so happen while the key is held (a second call meanwhile gets 409).
func (s *Sim) serve(sp spec) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := &call{op: sp.op, r: r, key: r.Header.Get("Idempotency-Key")}

		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			writeJSON(w, http.StatusServiceUnavailable, errorJSON{Error: "unavailable", Message: "simulator is shutting down"})
			return
		}
		s.calls[sp.op]++
		if c.key != "" {
			s.keyCalls[c.key]++
		}
		if sp.op == OpFind {
			s.lookups[r.URL.Query().Get("reference")]++
		}
		s.active[sp.op]++
		s.notifyLocked()
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.active[sp.op]--
			s.notifyLocked()
			s.mu.Unlock()
		}()

		a, processed := s.pipeline(sp, c)
		if processed && s.shouldDrop(sp.op) {
			s.log.Info("gatewaysim: dropping the answer", "op", sp.op, "key", c.key, "status", a.status)
			dropAnswer(w)
			return
		}
		s.log.Debug("gatewaysim: call", "op", sp.op, "key", c.key, "status", a.status)
		if a.replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		writeJSON(w, a.status, a.body)
	}
}

// pipeline returns the answer and whether the call reached processing (or a replay), which is
// when "process, then drop the answer" applies.
func (s *Sim) pipeline(sp spec, c *call) (answer, bool) {
	if !s.authorized(c.r) {
		return errAnswer(http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token"), false
	}
	if c.r.Body != nil {
		body, err := io.ReadAll(io.LimitReader(c.r.Body, maxRequestBytes+1))
		if err != nil {
			return invalidAnswer("could not read the body"), false
		}
		if len(body) > maxRequestBytes {
			return invalidAnswer("body too large"), false
		}
		c.body = body
	}
	if sp.mutating && (c.key == "" || len(c.key) > maxKeyLen) {
		return invalidAnswer("Idempotency-Key header of 1–64 characters is required"), false
	}
	fingerprint, bad := sp.validate(c)
	if bad != nil {
		return *bad, false
	}

	s.mu.Lock()
	f := s.faults[sp.op]
	fail := false
	if f.FailNext > 0 {
		f.FailNext--
		s.faults[sp.op] = f
		fail = true
	} else if f.ErrorRate > 0 && s.rng.Float64() < f.ErrorRate {
		fail = true
	}
	if fail {
		s.mu.Unlock()
		s.log.Info("gatewaysim: injected 5xx", "op", sp.op, "key", c.key)
		return errAnswer(http.StatusServiceUnavailable, "unavailable", "injected failure: not processed"), false
	}

	var rec *idemRecord
	if sp.mutating && !s.ignoreKeys {
		if prev := s.keys[c.key]; prev != nil {
			switch {
			case prev.fingerprint != fingerprint:
				s.mu.Unlock()
				return errAnswer(http.StatusUnprocessableEntity, "idempotency_key_reused", "this key was used for a different request"), false
			case !prev.done:
				s.mu.Unlock()
				return errAnswer(http.StatusConflict, "idempotency_key_in_use", "a request with this key is still being processed"), false
			default:
				a := sp.replay(prev.resourceID)
				a.replayed = true
				s.mu.Unlock()
				return a, true
			}
		}
		rec = &idemRecord{fingerprint: fingerprint}
		s.keys[c.key] = rec
	}
	s.mu.Unlock()

	if f.Latency > 0 {
		t := time.NewTimer(f.Latency)
		select {
		case <-t.C:
		case <-s.done:
			t.Stop()
			s.forget(c.key, rec)
			return errAnswer(http.StatusServiceUnavailable, "unavailable", "simulator is shutting down"), false
		}
	}

	s.mu.Lock()
	if g := s.pauses[sp.op]; g != nil {
		s.parked[sp.op]++
		s.notifyLocked()
		s.mu.Unlock()
		s.log.Info("gatewaysim: call parked", "op", sp.op, "key", c.key)
		<-g.release // Release, Reset and Close all close it
		s.mu.Lock()
		s.parked[sp.op]--
		s.notifyLocked()
		if s.closed {
			s.mu.Unlock()
			s.forget(c.key, rec)
			return errAnswer(http.StatusServiceUnavailable, "unavailable", "simulator is shutting down"), false
		}
	}
	a, resourceID, ok := sp.exec(c)
	if rec != nil && s.keys[c.key] == rec { // a Reset meanwhile dropped the record
		if ok {
			rec.done, rec.resourceID = true, resourceID
		} else {
			// Refusals are not stored: a repeat is evaluated again (and refused again).
			delete(s.keys, c.key)
		}
	}
	s.mu.Unlock()
	return a, true
}

func (s *Sim) forget(key string, rec *idemRecord) {
	if rec == nil {
		return
	}
	s.mu.Lock()
	if s.keys[key] == rec {
		delete(s.keys, key)
	}
	s.mu.Unlock()
}

func (s *Sim) shouldDrop(op Op) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.faults[op]
	if f.DropNext > 0 {
		f.DropNext--
		s.faults[op] = f
		return true
	}
	return f.DropRate > 0 && s.rng.Float64() < f.DropRate
}

// dropAnswer closes the connection without writing a byte, so the client sees a broken
// connection after its request was written: an unknown outcome. Without a hijackable
// connection (HTTP/2, a ResponseRecorder) it aborts the handler, which net/http turns into a
// reset stream or a closed connection, also without an answer.
func dropAnswer(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func (s *Sim) authorized(r *http.Request) bool {
	if s.opts.APIKey == "" {
		return true
	}
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) <= len(prefix) || h[:len(prefix)] != prefix {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(h[len(prefix):]), []byte(s.opts.APIKey)) == 1
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"error":"internal"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="gatewaysim"`)
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// ---- the operations ----

func (s *Sim) registerSpec() spec {
	type body struct {
		Amount    *int64 `json:"amount"`
		Currency  string `json:"currency"`
		Reference string `json:"reference"`
		ReturnURL string `json:"return_url"`
	}
	var parsed = func(c *call) (body, *answer) {
		var b body
		if err := json.Unmarshal(c.body, &b); err != nil {
			a := invalidAnswer("body must be a JSON object with amount, currency, reference: " + err.Error())
			return b, &a
		}
		var msg string
		switch {
		case b.Amount == nil || *b.Amount <= 0:
			msg = "amount must be a positive integer in minor units"
		case !currencyRE.MatchString(b.Currency):
			msg = "currency must be an upper-case ISO 4217 code"
		case b.Reference == "" || len(b.Reference) > 255:
			msg = "reference must be 1–255 characters"
		case b.ReturnURL != "" && !absoluteHTTPURL(b.ReturnURL):
			msg = "return_url must be an absolute http(s) URL"
		}
		if msg != "" {
			a := invalidAnswer(msg)
			return b, &a
		}
		return b, nil
	}
	return spec{
		op:       OpRegister,
		mutating: true,
		validate: func(c *call) (string, *answer) {
			b, bad := parsed(c)
			if bad != nil {
				return "", bad
			}
			fp, _ := json.Marshal([]any{"register", *b.Amount, b.Currency, b.Reference, b.ReturnURL})
			return string(fp), nil
		},
		exec: func(c *call) (answer, string, bool) {
			b, _ := parsed(c)
			now := s.now()
			s.seq++
			id := newID("gp_")
			p := &payment{
				Payment: Payment{
					ID: id, Status: StatusPending, Amount: *b.Amount, Currency: b.Currency,
					Reference: b.Reference, ReturnURL: b.ReturnURL, Created: now,
					ConfirmationURL: s.publicBase(c.r) + "/pay/" + id,
				},
				seq: s.seq,
			}
			s.payments[id] = p
			s.byRef[p.Reference] = append(s.byRef[p.Reference], p)
			s.log.Info("gatewaysim: registered", "payment", id, "reference", p.Reference, "amount", p.Amount, "key", c.key)
			return answer{status: http.StatusCreated, body: toJSON(p.Payment)}, id, true
		},
		replay: func(id string) answer { return s.paymentAnswerLocked(id) },
	}
}

func absoluteHTTPURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// paymentAnswerLocked is the current state of a payment as a 200 answer (or 404).
func (s *Sim) paymentAnswerLocked(id string) answer {
	p := s.payments[id]
	if p == nil {
		return errAnswer(http.StatusNotFound, "not_found", "no such payment")
	}
	s.settleLocked(p, s.now())
	return answer{status: http.StatusOK, body: toJSON(p.Payment)}
}

func noValidation(*call) (string, *answer) { return "", nil }

func (s *Sim) statusSpec() spec {
	return spec{
		op:       OpStatus,
		validate: noValidation,
		exec: func(c *call) (answer, string, bool) {
			a := s.paymentAnswerLocked(c.r.PathValue("id"))
			return a, "", a.status == http.StatusOK
		},
	}
}

func (s *Sim) findSpec() spec {
	return spec{
		op: OpFind,
		validate: func(c *call) (string, *answer) {
			if c.r.URL.Query().Get("reference") == "" {
				a := invalidAnswer("query parameter reference is required")
				return "", &a
			}
			return "", nil
		},
		exec: func(c *call) (answer, string, bool) {
			list := s.byReferenceLocked(c.r.URL.Query().Get("reference"), s.now())
			data := make([]paymentJSON, len(list))
			for i, p := range list {
				data[i] = toJSON(p)
			}
			return answer{status: http.StatusOK, body: map[string]any{"data": data}}, "", true
		},
	}
}

func (s *Sim) reverseSpec() spec {
	return spec{
		op:       OpReverse,
		mutating: true,
		validate: func(c *call) (string, *answer) {
			return "reverse " + c.r.PathValue("id"), nil // the body, if any, is ignored
		},
		exec: func(c *call) (answer, string, bool) {
			id := c.r.PathValue("id")
			p := s.payments[id]
			if p == nil {
				return errAnswer(http.StatusNotFound, "not_found", "no such payment"), "", false
			}
			now := s.now()
			s.settleLocked(p, now)
			switch p.Status {
			case StatusPending, StatusAuthorized:
				s.setStatusLocked(p, StatusReversed, now)
			case StatusReversed:
				// Already voided: the same answer, whoever asks.
			default:
				return answer{status: http.StatusConflict, body: errorJSON{
					Error: "not_reversible", Status: p.Status, Message: "the payment is " + p.Status,
				}}, "", false
			}
			return answer{status: http.StatusOK, body: toJSON(p.Payment)}, id, true
		},
		replay: func(id string) answer { return s.paymentAnswerLocked(id) },
	}
}

func (s *Sim) refundSpec() spec {
	amountOf := func(c *call) (int64, *answer) {
		var b struct {
			Amount *int64 `json:"amount"`
		}
		if err := json.Unmarshal(c.body, &b); err != nil || b.Amount == nil || *b.Amount <= 0 {
			a := invalidAnswer("body must be {\"amount\": a positive integer}")
			return 0, &a
		}
		return *b.Amount, nil
	}
	return spec{
		op:       OpRefund,
		mutating: true,
		validate: func(c *call) (string, *answer) {
			amount, bad := amountOf(c)
			if bad != nil {
				return "", bad
			}
			return "refund " + c.r.PathValue("id") + " " + strconv.FormatInt(amount, 10), nil
		},
		exec: func(c *call) (answer, string, bool) {
			amount, _ := amountOf(c)
			p := s.payments[c.r.PathValue("id")]
			if p == nil {
				return errAnswer(http.StatusNotFound, "not_found", "no such payment"), "", false
			}
			s.settleLocked(p, s.now())
			if p.Status != StatusSucceeded {
				return errAnswer(http.StatusConflict, "not_refundable", "the payment is "+p.Status), "", false
			}
			if amount > p.Amount-p.Refunded {
				return errAnswer(http.StatusConflict, "amount_exceeds_remaining",
					"remaining refundable amount is "+strconv.FormatInt(p.Amount-p.Refunded, 10)), "", false
			}
			rf := &Refund{ID: newID("rf_"), PaymentID: p.ID, Amount: amount, Status: "succeeded"}
			s.refunds[rf.ID] = rf
			p.Refunded += amount
			s.log.Info("gatewaysim: refunded", "payment", p.ID, "refund", rf.ID, "amount", amount)
			return answer{status: http.StatusCreated, body: refundToJSON(*rf)}, rf.ID, true
		},
		replay: func(id string) answer {
			rf := s.refunds[id]
			if rf == nil {
				return errAnswer(http.StatusNotFound, "not_found", "no such refund")
			}
			return answer{status: http.StatusOK, body: refundToJSON(*rf)}
		},
	}
}

func (s *Sim) refundStatusSpec() spec {
	return spec{
		op:       OpRefundStatus,
		validate: noValidation,
		exec: func(c *call) (answer, string, bool) {
			rf := s.refunds[c.r.PathValue("id")]
			if rf == nil {
				return errAnswer(http.StatusNotFound, "not_found", "no such refund"), "", false
			}
			return answer{status: http.StatusOK, body: refundToJSON(*rf)}, "", true
		},
	}
}

// Refunds returns every refund of a payment.
func (s *Sim) Refunds(paymentID string) []Refund {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Refund
	for _, rf := range s.refunds {
		if rf.PaymentID == paymentID {
			out = append(out, *rf)
		}
	}
	return out
}

// routes registers every route in one place.
func (s *Sim) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", s.serve(s.registerSpec()))
	mux.Handle("GET /v1/payments", s.serve(s.findSpec()))
	mux.Handle("GET /v1/payments/{id}", s.serve(s.statusSpec()))
	mux.Handle("POST /v1/payments/{id}/reverse", s.serve(s.reverseSpec()))
	mux.Handle("POST /v1/payments/{id}/refunds", s.serve(s.refundSpec()))
	mux.Handle("GET /v1/refunds/{id}", s.serve(s.refundStatusSpec()))
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, errorJSON{Error: "not_found", Message: "no such endpoint"})
	})
	s.pageRoutes(mux)
	s.controlRoutes(mux)
	return mux
}
