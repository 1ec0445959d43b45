package stripegw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"pitlane/payments"
)

// TestASearchWhosePagesNeverEndAnswersUnknown: a search whose next_page loops back, every page
// holding a PaymentIntent of another reference (a quirk the exact-match filter drops), was
// followed for ever, bounded only by the caller's context: reconciliation's run ended with its
// lease on that session, counted no failure, and the next run started on it again — the whole
// gateway's reconciliation stopped there (an outside review, reconcile3). A result listed again
// ends it; so does reading maxSearched of them: unknown, "search_incomplete", never "nothing
// found". The server cancels the caller's context after 300 pages (no timer).
func TestASearchWhosePagesNeverEndAnswersUnknown(t *testing.T) {
	t.Parallel()
	const maxPagesTolerated = 300
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var pages int
	g, n := fakeStripe(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if n := r.URL.Query().Get("page"); n != "" && n != "loop" {
			t.Errorf("page token %q", n)
		}
		pages++
		if pages >= maxPagesTolerated {
			cancel(errors.New("the test gave up on the looping search"))
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"search_result","url":"/v1/payment_intents/search","has_more":true,"next_page":"loop","data":[
			{"id":"pi_stranger","object":"payment_intent","status":"succeeded","amount":100,"currency":"eur","created":1700000000,"metadata":{"reference":"someone-else"}}]}`)
	})
	found, err := g.FindByReference(ctx, "ours-42")
	if ctx.Err() != nil {
		t.Fatalf("FindByReference followed a looping next_page for %d pages until the caller's context was canceled (got %v, %v): no bound of its own",
			n.Load(), found, err)
	}
	var ge *payments.GatewayError
	if !errors.As(err, &ge) || ge.Kind != payments.FailureUnknown || ge.Code != "search_incomplete" {
		t.Fatalf("FindByReference = %v, %v after an unfinished search: want an unknown search_incomplete", found, err)
	}
}

// TestASearchOfEndlessStrangersAnswersUnknown: pages of other references' PaymentIntents, each a
// new one, without end: reading stops after maxSearched of them, unknown ("search_incomplete"),
// never "nothing found".
func TestASearchOfEndlessStrangersAnswersUnknown(t *testing.T) {
	t.Parallel()
	var next atomic.Int64
	g, n := fakeStripe(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		var data []string
		for range 100 {
			data = append(data, fmt.Sprintf(`{"id":"pi_%d","object":"payment_intent","status":"succeeded","amount":100,"currency":"eur","created":1700000000,"metadata":{"reference":"someone-else"}}`, next.Add(1)))
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"search_result","url":"/v1/payment_intents/search","has_more":true,"next_page":"p`+strconv.FormatInt(next.Load(), 10)+`","data":[`+strings.Join(data, ",")+`]}`)
	})
	found, err := g.FindByReference(context.Background(), "ours-42")
	var ge *payments.GatewayError
	if !errors.As(err, &ge) || ge.Kind != payments.FailureUnknown || ge.Code != "search_incomplete" {
		t.Fatalf("FindByReference = %v, %v after %d pages: want an unknown search_incomplete", found, err, n.Load())
	}
	if pages := n.Load(); pages > maxSearched/100+1 {
		t.Fatalf("%d pages read for a bound of %d results", pages, maxSearched)
	}
}

// TestAPaymentIntentWithoutAnIDIsUnreadable: an answer with no id (or no status) from whatever
// answers at GATEWAY_URL is unknown, as refgw reads one: taken as a payment, its empty id left
// the core's checks of a payment being attached nothing to compare (an outside review).
func TestAPaymentIntentWithoutAnIDIsUnreadable(t *testing.T) {
	t.Parallel()
	g, _ := fakeStripe(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.URL.Path, "search") {
			_, _ = io.WriteString(w, `{"object":"search_result","has_more":false,"data":[{"object":"payment_intent","status":"succeeded","amount":100,"currency":"eur","metadata":{"reference":"ours-42"}}]}`)
			return
		}
		_, _ = io.WriteString(w, `{"object":"payment_intent","status":"succeeded","amount":100,"amount_received":100,"currency":"eur","metadata":{"reference":"ours-42"}}`)
	})
	_, serr := g.Status(context.Background(), "pi_1")
	_, ferr := g.FindByReference(context.Background(), "ours-42")
	for what, err := range map[string]error{"status": serr, "find": ferr} {
		if payments.FailureOf(err) != payments.FailureUnknown {
			t.Errorf("%s answered by a PaymentIntent without an id: %v, want unknown", what, err)
		}
	}
}
