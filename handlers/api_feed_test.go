package handlers_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
)

type feedPage = payments.FeedBody

func eventsPath(after string, limit string) string {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit != "" {
		q.Set("limit", limit)
	}
	return "/api/v1/events?" + q.Encode()
}

// GET /api/v1/events: a shop follows every payment's changes with one cursor. The fields of the
// contract's style, a page boundary that loses nothing, an empty answer that hands the cursor
// back, and 422s naming the bad parameter.
func TestAPIEventsFeed(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-events", 1200) // Registering, Registered, Completed

	// The feed lags behind the oldest transaction still writing in the cluster (other tests
	// share it): read until the three are there. From then on they stay.
	deadline := time.Now().Add(60 * time.Second)
	for {
		rec := b.do(get(eventsPath("", "1000")))
		if rec.Code != http.StatusOK {
			t.Fatalf("events: %d %s", rec.Code, rec.Body)
		}
		if n := len(decode[feedPage](t, rec).Data); n == 3 {
			break
		} else if n > 3 || time.Now().After(deadline) {
			t.Fatalf("events: %d, want 3: %s", n, rec.Body)
		}
	}

	rec := b.do(get(eventsPath("", "2")))
	first := decode[feedPage](t, rec)
	if rec.Code != http.StatusOK || len(first.Data) != 2 || !first.HasMore || first.NextCursor != first.Data[1].ID {
		t.Fatalf("first page: %d %s", rec.Code, rec.Body)
	}
	var raw struct {
		Data []map[string]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	if got := string(raw.Data[0]["from_status"]); got != "null" {
		t.Fatalf("the first state's from_status = %s, want null", got)
	}
	var keys []string
	for k := range raw.Data[0] {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if strings.Join(keys, ",") != "amount,by,created_at,currency,from_status,id,links,order_id,payment_id,status,type" {
		t.Fatalf("an event's fields: %v", keys)
	}
	rec = b.do(get(eventsPath(first.NextCursor, "2")))
	second := decode[feedPage](t, rec)
	if rec.Code != http.StatusOK || len(second.Data) != 1 || second.HasMore || second.NextCursor != second.Data[0].ID {
		t.Fatalf("second page: %d %s", rec.Code, rec.Body)
	}
	all := append(first.Data, second.Data...)
	for i, want := range []struct{ from, to string }{{"", "Registering"}, {"Registering", "Registered"}, {"Registered", "Completed"}} {
		e := all[i]
		from := ""
		if e.FromStatus != nil {
			from = *e.FromStatus
		}
		if e.Type != "payment.status_changed" || e.PaymentID != p.ID || e.OrderID != "o-events" || e.Amount != 1200 ||
			e.Currency != "EUR" || from != want.from || e.Status != want.to || e.By != "api" ||
			e.Links.Self != "/api/v1/payments/"+p.ID {
			t.Fatalf("event %d = %+v, want %s → %s of %s", i, e, want.from, want.to, p.ID)
		}
		if e.CreatedAt.IsZero() {
			t.Fatalf("created_at missing: %+v", e)
		}
	}

	// Nothing new: an empty list (not null) and the cursor back.
	rec = b.do(get(eventsPath(second.NextCursor, "")))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"data":[]`) || decode[feedPage](t, rec).NextCursor != second.NextCursor {
		t.Fatalf("at the end: %d %s", rec.Code, rec.Body)
	}
	// A cursor of a history this database does not have (a reader's cursor from before a
	// point-in-time restore: transaction ids are handed out again from the restore point, and
	// read on, it would skip every new event without a word): 410, saying what to do. Before
	// this change: 200 with nothing, for as long as the new history's ids stay below it.
	var next uint64
	if err := b.pool.QueryRow(context.Background(), `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&next); err != nil {
		t.Fatal(err)
	}
	gone := wantProblem(t, b.do(get(eventsPath(strconv.FormatUint(next+1000, 10)+"-1", ""))), http.StatusGone, "")
	if !strings.Contains(gone.Detail, "restored") || !strings.Contains(gone.Detail, "after=end") {
		t.Fatalf("a cursor from another history: %+v", gone)
	}
	wantProblem(t, b.do(get("/api/v1/payments/"+p.ID+"/events?after="+strconv.FormatUint(next+1000, 10)+"-1")), http.StatusGone, "")
	// after=end: no history, the end's cursor, for a reader that starts now.
	rec = b.do(get(eventsPath("end", "")))
	if end := decode[feedPage](t, rec); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"data":[]`) ||
		end.NextCursor != second.NextCursor || end.HasMore {
		t.Fatalf("after=end: %d %s", rec.Code, rec.Body)
	}

	// A refund through the API: its claim and its outcome, with its id and its own link.
	r := wantRefund(t, b.do(post(refundsPath(p.ID), `{"amount":500}`)), http.StatusCreated)
	var refundEvents []map[string]json.RawMessage
	for deadline := time.Now().Add(60 * time.Second); len(refundEvents) < 2; {
		rec = b.do(get(eventsPath(second.NextCursor, "")))
		var page struct {
			Data []map[string]json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &page); rec.Code != http.StatusOK || err != nil || len(page.Data) > 2 || time.Now().After(deadline) {
			t.Fatalf("the refund's events: %d %s", rec.Code, rec.Body)
		}
		refundEvents = page.Data
	}
	for i, want := range []string{
		`"type":"refund.status_changed","payment_id":"` + p.ID + `","refund_id":"` + r.ID + `","order_id":"o-events","amount":500,"currency":"EUR","from_status":null,"status":"Pending","by":"api"`,
		`"type":"refund.status_changed","payment_id":"` + p.ID + `","refund_id":"` + r.ID + `","order_id":"o-events","amount":500,"currency":"EUR","from_status":"Pending","status":"Succeeded","by":"api"`,
	} {
		e := refundEvents[i]
		got := `"type":` + string(e["type"]) + `,"payment_id":` + string(e["payment_id"]) + `,"refund_id":` + string(e["refund_id"]) +
			`,"order_id":` + string(e["order_id"]) + `,"amount":` + string(e["amount"]) + `,"currency":` + string(e["currency"]) +
			`,"from_status":` + string(e["from_status"]) + `,"status":` + string(e["status"]) + `,"by":` + string(e["by"])
		if got != want || string(e["links"]) != `{"self":"/api/v1/refunds/`+r.ID+`"}` {
			t.Fatalf("refund event %d = %s %s, want %s", i, got, e["links"], want)
		}
	}

	for _, bad := range []struct{ after, limit, field string }{
		{"", "0", "limit"}, {"", "1001", "limit"}, {"", "ten", "limit"}, {"", "-5", "limit"},
		{"latest", "", "after"}, {"12", "", "after"}, {all[0].ID + "x", "", "after"},
	} {
		wantProblem(t, b.do(get(eventsPath(bad.after, bad.limit))), http.StatusUnprocessableEntity, bad.field)
	}
}

// GET /api/v1/payments/{id}/events: one payment's part of the feed — its changes and its
// refunds', not another payment's — with the feed's cursors; 404 for an unknown payment, 422
// naming a bad parameter.
func TestAPIPaymentEvents(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-pevents", 1200)
	other := b.completedPayment(t, "o-pevents-other", 900)
	wantRefund(t, b.do(post(refundsPath(other.ID), `{"amount":100}`)), http.StatusCreated)
	r := wantRefund(t, b.do(post(refundsPath(p.ID), `{"amount":500}`)), http.StatusCreated)

	path := func(id, after, limit string) string {
		return "/api/v1/payments/" + id + "/events?" + url.Values{"after": {after}, "limit": {limit}}.Encode()
	}
	var got feedPage
	for deadline := time.Now().Add(60 * time.Second); len(got.Data) < 5; { // the feed's lag (TestAPIEventsFeed)
		rec := b.do(get(path(p.ID, "", "")))
		got = decode[feedPage](t, rec)
		if rec.Code != http.StatusOK || len(got.Data) > 5 || time.Now().After(deadline) {
			t.Fatalf("the payment's events: %d %s", rec.Code, rec.Body)
		}
	}
	for i, want := range []struct{ typ, refund, to string }{
		{"payment.status_changed", "", "Registering"}, {"payment.status_changed", "", "Registered"}, {"payment.status_changed", "", "Completed"},
		{"refund.status_changed", r.ID, "Pending"}, {"refund.status_changed", r.ID, "Succeeded"},
	} {
		if e := got.Data[i]; e.PaymentID != p.ID || e.Type != want.typ || e.RefundID != want.refund || e.Status != want.to {
			t.Fatalf("event %d = %+v, want %+v", i, e, want)
		}
	}
	if got.NextCursor != got.Data[4].ID || got.HasMore {
		t.Fatalf("next %q, more %v", got.NextCursor, got.HasMore)
	}
	rec := b.do(get(path(p.ID, got.Data[1].ID, "2")))
	if page := decode[feedPage](t, rec); rec.Code != http.StatusOK || len(page.Data) != 2 || !page.HasMore || page.Data[0].ID != got.Data[2].ID {
		t.Fatalf("a page after the second event: %d %s", rec.Code, rec.Body)
	}

	wantProblem(t, b.do(get(path("6f1c2c3e-0000-4000-8000-000000000000", "", ""))), http.StatusNotFound, "")
	wantProblem(t, b.do(get(path("nope", "", ""))), http.StatusNotFound, "")
	for _, bad := range []struct{ after, limit, field string }{{"", "0", "limit"}, {"", "ten", "limit"}, {"latest", "", "after"}} {
		wantProblem(t, b.do(get(path(p.ID, bad.after, bad.limit))), http.StatusUnprocessableEntity, bad.field)
	}
}
