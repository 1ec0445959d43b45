package payments_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/webhooksig"
)

// The contract's notification sink: with NOTIFY_WEBHOOK_URL set, a cancel code is POSTed as
// {"to","kind","text","order_id","payment_id"} before RequestCancel returns, and the outbox
// row is marked delivered. A sink answering 500 leaves it undelivered for the patrol.
func TestWebhookNotifierDeliversCancelCode(t *testing.T) {
	t.Parallel()
	sink := newNotifySink(t)
	b := newBench(t, func(c *payments.Config) { c.Notifier = payments.WebhookNotifier{URL: sink.url} })
	ctx := context.Background()
	sess := b.registered(t, "o-notify", 100)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	got := sink.messages()
	if len(got) != 1 {
		t.Fatalf("sink received %d messages", len(got))
	}
	m := got[0]
	sink.failing(true)
	for _, k := range []string{"to", "kind", "text", "order_id", "payment_id"} {
		if _, ok := m[k]; !ok {
			t.Errorf("message lacks %q: %v", k, m)
		}
	}
	if m["to"] != "buyer@example.com" || m["kind"] != "cancel_code" || m["order_id"] != "o-notify" || m["payment_id"] != sess.ID {
		t.Errorf("message = %v", m)
	}
	if !regexp.MustCompile(`\b\d{6}\b`).MatchString(m["text"].(string)) {
		t.Errorf("no 6-digit code in %q", m["text"])
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL`); n != 1 {
		t.Fatalf("delivered rows = %d", n)
	}
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND last_error IS NOT NULL`); n != 1 {
		t.Fatalf("a refused delivery must stay undelivered with its error (%d)", n)
	}
	// The retry carries the refused message's id, another message another id: the receiver
	// drops a message it has sent on already.
	sink.failing(false)
	b.clock.Advance(2 * time.Minute)
	if _, err := b.svc.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
	got = sink.messages()
	if len(got) != 3 {
		t.Fatalf("sink received %d messages, want the retry as the third", len(got))
	}
	if id := got[1]["id"]; id == nil || id == "" || id != got[2]["id"] || id == got[0]["id"] {
		t.Fatalf("ids %v, %v, %v: want the retry's the refused one's, and the first message's another", got[0]["id"], got[1]["id"], got[2]["id"])
	}
}

// notifySink is a NOTIFY_WEBHOOK_URL receiver: it keeps every message POSTed to it, and
// answers 500 while failing.
type notifySink struct {
	url  string
	mu   sync.Mutex
	got  []map[string]any
	fail bool
}

func newNotifySink(t *testing.T) *notifySink {
	s := &notifySink{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("sink got %s %s", r.Method, r.Header.Get("Content-Type"))
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			t.Errorf("sink body %q: %v", body, err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.got = append(s.got, m)
		if s.fail {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *notifySink) failing(fail bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = fail
}

func (s *notifySink) messages() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// ids is the "id" of every message received, in order.
func (s *notifySink) ids() []string {
	var out []string
	for _, m := range s.messages() {
		id, _ := m["id"].(string)
		out = append(out, id)
	}
	return out
}

// A message's id is its own, not the outbox row's serial: after a point-in-time restore the
// sequence hands the lost gap's serials out again (and every install counts from 1), and a
// receiver that drops ids it has sent on already dropped a new one-time code as a repeat (an
// outside review). Here the restore is played: the gap's row deleted and the sequence set back.
// A row written before migration 00850 (no message_id) is still sent under its serial, as its
// earlier tries were.
func TestNotifierMessageIDsDoNotRepeatAfterARestore(t *testing.T) {
	t.Parallel()
	sink := newNotifySink(t)
	b := newBench(t, func(c *payments.Config) { c.Notifier = payments.WebhookNotifier{URL: sink.url} })
	ctx := context.Background()
	s1 := b.registered(t, "o-restore-a", 100)
	s2 := b.registered(t, "o-restore-b", 200)
	var before int64
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.RequestCancel(ctx, api, s1.ID); err != nil { // sent, then lost by the restore
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `DELETE FROM outbox WHERE id > $1`, before); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence('outbox', 'id'), greatest($1, 1), $1 > 0)`, before); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.RequestCancel(ctx, api, s2.ID); err != nil {
		t.Fatal(err)
	}
	if ids := sink.ids(); len(ids) != 2 || ids[0] == ids[1] || !regexp.MustCompile(`^[0-9a-f-]{36}$`).MatchString(ids[1]) {
		t.Fatalf("ids %q: want two different UUIDs (the new code of another payment must not repeat the lost one's id)", ids)
	}

	// A row of the release before: its failed try was sent under its serial, and so is its retry.
	sink.failing(true)
	if _, err := b.svc.RequestCancel(ctx, api, s2.ID); err != nil {
		t.Fatal(err)
	}
	var serial int64
	if err := b.pool.QueryRow(ctx, `UPDATE outbox SET message_id = NULL WHERE delivered_at IS NULL RETURNING id`).Scan(&serial); err != nil {
		t.Fatal(err)
	}
	sink.failing(false)
	b.clock.Advance(2 * time.Minute)
	if _, err := b.svc.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := sink.ids(); len(ids) != 4 || ids[3] != strconv.FormatInt(serial, 10) {
		t.Fatalf("ids %q: want the old row's retry under its serial %d", ids, serial)
	}
}

// A code whose first delivery failed waits in the outbox for the retry. When a newer code has
// superseded it, or it was consumed (the failed delivery reached the customer after all and they
// read the code out), the retry does not send it: the row is marked skipped with the reason and
// its code redacted, and only the live code reaches the customer. The main before this change
// sent every queued code, superseded and consumed ones included (3 messages here, not 1).
func TestOutboxRetrySkipsDeadCodes(t *testing.T) {
	t.Parallel()
	n := &flakyNotifier{down: true}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()

	// Superseded: two codes for one payment, both deliveries failed.
	sup := b.registered(t, "o-superseded", 100)
	if _, err := b.svc.RequestCancel(ctx, api, sup.ID); err != nil {
		t.Fatal(err)
	}
	oldCode := b.lastCode(t, sup.ID)
	b.clock.Advance(time.Minute)
	if _, err := b.svc.RequestCancel(ctx, api, sup.ID); err != nil {
		t.Fatal(err)
	}
	newCode := b.lastCode(t, sup.ID)

	// Consumed: the delivery "failed", yet the customer read the code out to support.
	con := b.registered(t, "o-consumed", 100)
	ch, err := b.svc.RequestCancel(ctx, api, con.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ConfirmCancel(ctx, api, con.ID, ch.ID, b.lastCode(t, con.ID)); err != nil {
		t.Fatal(err)
	}

	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
	b.clock.Advance(2 * time.Minute)
	if sent, err := b.svc.DeliverOutbox(ctx); sent != 1 || err != nil {
		t.Fatalf("retry sent %d (%v), want 1: only the live code", sent, err)
	}
	n.mu.Lock()
	got := slices.Clone(n.got)
	n.mu.Unlock()
	if len(got) != 1 || !strings.Contains(got[0].Text, newCode) || got[0].PaymentID != sup.ID {
		t.Fatalf("delivered %+v, want only the newer code %s of %s", got, newCode, sup.ID)
	}
	for _, want := range []struct {
		payment, reason string
	}{{sup.ID, "superseded"}, {con.ID, "consumed"}} {
		var body string
		err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE payment_id = $1 AND skip_reason = $2
			AND skipped_at IS NOT NULL AND delivered_at IS NULL`, want.payment, want.reason).Scan(&body)
		if err != nil {
			t.Fatalf("no message of %s marked %s: %v", want.payment, want.reason, err)
		}
		if strings.Contains(body, oldCode) || !strings.Contains(body, "••••••") {
			t.Fatalf("skipped message keeps its code: %q", body)
		}
	}
	// Skipped messages are done: later retries neither send nor count them again.
	b.clock.Advance(5 * time.Minute)
	if sent, err := b.svc.DeliverOutbox(ctx); sent != 0 || err != nil {
		t.Fatalf("second retry sent %d (%v)", sent, err)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE skipped_at IS NOT NULL`); n != 2 {
		t.Fatalf("%d skipped messages, want 2", n)
	}
	// The admin outbox page says why they were not sent.
	msgs, err := b.svc.Outbox(ctx, payments.Staff{Email: "admin@example.com", Role: "admin"}, sup.ID)
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, m := range msgs {
		reasons = append(reasons, m.LastError)
	}
	if !slices.Contains(reasons, "not sent again: the code was superseded") {
		t.Fatalf("outbox page reasons %q", reasons)
	}
}

// TestDeadCodesAreRedactedFromTheOutbox: with no notifier the outbox is the customer's channel
// and nothing is ever delivered, so every code stayed in clear in the table (and each copy of
// the database) for good (audit 8). The housekeeping's RedactDeadCodes now leaves only the
// redacted text of a code that was superseded, consumed or expired, and a live code alone.
func TestDeadCodesAreRedactedFromTheOutbox(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	inClear := func(challengeID string) bool {
		t.Helper()
		var body string
		if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE challenge_id = $1`, challengeID).Scan(&body); err != nil {
			t.Fatal(err)
		}
		return codeRe.MatchString(body)
	}
	redact := func(want int) {
		t.Helper()
		if n, err := b.svc.RedactDeadCodes(ctx, b.clock.Now(), 0); err != nil || n != want {
			t.Fatalf("RedactDeadCodes = %d %v, want %d", n, err, want)
		}
	}

	sess := b.registered(t, "o-dead-codes", 100)
	first, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.svc.RequestCancel(ctx, api, sess.ID) // supersedes the first
	if err != nil {
		t.Fatal(err)
	}
	redact(1)
	if inClear(first.ID) || !inClear(second.ID) {
		t.Fatalf("after a newer code: first in clear %v (want false), second %v (want true)", inClear(first.ID), inClear(second.ID))
	}
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, second.ID, b.lastCode(t, sess.ID)); err != nil {
		t.Fatal(err)
	}
	redact(1)
	if inClear(second.ID) {
		t.Fatal("a consumed code is still in clear")
	}

	other := b.registered(t, "o-dead-codes-2", 100)
	expiring, err := b.svc.RequestCancel(ctx, api, other.ID)
	if err != nil {
		t.Fatal(err)
	}
	redact(0) // a live code stays: an admin relays it from the outbox
	if !inClear(expiring.ID) {
		t.Fatal("a live code was redacted")
	}
	b.clock.Advance(expiring.ExpiresAt.Sub(b.clock.Now()))
	redact(1)
	if inClear(expiring.ID) {
		t.Fatal("an expired code is still in clear")
	}

	// Out of attempts: the code is dead while it has time left.
	third := b.registered(t, "o-dead-codes-3", 100)
	spent, err := b.svc.RequestCancel(ctx, api, third.ID)
	if err != nil {
		t.Fatal(err)
	}
	right := b.lastCode(t, third.ID)
	wrong := "000000"
	if right == wrong {
		wrong = "111111"
	}
	for range 5 { // the code's attempts (Config.CodeAttempts, default 5)
		if _, err := b.svc.ConfirmCancel(ctx, api, third.ID, spent.ID, wrong); payments.ErrorCode(err) != payments.EWRONG {
			t.Fatalf("wrong code: %v", err)
		}
	}
	redact(1)
	if inClear(spent.ID) {
		t.Fatal("a code out of attempts is still in clear")
	}

	// A cancel code of a payment that finished meanwhile: dead while it has time left.
	fourth := b.registered(t, "o-dead-codes-4", 100)
	finished, err := b.svc.RequestCancel(ctx, api, fourth.ID)
	if err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(fourth.GatewayPaymentID, payments.GatewaySucceeded)
	if s, err := b.svc.Check(ctx, api, fourth.ID); err != nil || s.Status != payments.StatusCompleted {
		t.Fatalf("check = %s %v", s.Status, err)
	}
	redact(1)
	if inClear(finished.ID) {
		t.Fatal("a cancel code of a Completed payment is still in clear")
	}

	// A message from before messages named their challenge: dead after CodeTTL from its own
	// age, alive before.
	b.exec(t, `INSERT INTO outbox (kind, to_addr, body, redacted_body, created_at) VALUES
		('cancel_code', 'x', 'your code is 222222', 'your code is ••••••', $1),
		('cancel_code', 'x', 'your code is 333333', 'your code is ••••••', $2)`,
		b.clock.Now().Add(-10*time.Minute), b.clock.Now().Add(-time.Minute)) // CodeTTL: 10 minutes
	redact(1)
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE body LIKE '%222222%'`); n != 0 {
		t.Fatal("an old message without a challenge is still in clear")
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE body LIKE '%333333%'`); n != 1 {
		t.Fatal("a recent message without a challenge was redacted")
	}
}

// A NOTIFY_WEBHOOK_URL that redirects (http:// to https://, a moved endpoint) is not a
// delivery: Go's client would send the POST again as a GET without its body and count that
// GET's 200, and the outbox would mark the code delivered and redact it, the customer never
// getting it. Notify fails instead, naming the redirect, and the target never sees a request.
// Negative control: with the client's default redirect policy (the main before this change)
// Notify returns nil and the target gets an empty GET.
func TestWebhookNotifierRefusesARedirect(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var reached []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/new", http.StatusFound)
			return
		}
		mu.Lock()
		reached = append(reached, r.Method+" "+r.URL.Path)
		mu.Unlock()
	}))
	defer srv.Close()
	for _, client := range []*http.Client{nil, srv.Client()} {
		err := payments.WebhookNotifier{URL: srv.URL + "/old", Client: client}.Notify(context.Background(),
			payments.Message{To: "c@example.com", Kind: "cancel_code", Text: "code 123456"})
		if err == nil || !strings.Contains(err.Error(), "redirect") {
			t.Fatalf("a redirecting endpoint: %v, want an error naming the redirect", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reached) != 0 {
		t.Fatalf("the redirect's target got %v", reached)
	}
}

// GATEWAY_TIMEOUT is accepted down to 10 ms. The request that writes a code delivers it under a
// writer's lease of 6 × GATEWAY_TIMEOUT and keeps 2 s of it for its record: under about 0.34 s no
// time was left, the code was never sent by the request (staff read "not tried yet: the request
// ran out of time"), and it waited for the patrol's grace (an outside review of configuration
// extremes). The writer's lease is never shorter than one notifier POST and its record.
// Negative control: with the lease at LeaseDuration alone, nothing is sent.
func TestACodeIsSentByItsRequestAtTheShortestGatewayTimeout(t *testing.T) {
	t.Parallel()
	for _, timeout := range []time.Duration{10 * time.Millisecond, 300 * time.Millisecond} {
		t.Run(timeout.String(), func(t *testing.T) {
			t.Parallel()
			sink := newNotifySink(t)
			b := newBench(t, func(c *payments.Config) {
				c.GatewayTimeout = timeout
				c.Notifier = payments.WebhookNotifier{URL: sink.url}
			})
			sess := b.registered(t, "o-short-timeout", 100)
			ch, err := b.svc.RequestCancel(context.Background(), api, sess.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(sink.messages()); got != 1 || ch.Undelivered != "" {
				t.Fatalf("GATEWAY_TIMEOUT=%s: the receiver got %d messages when RequestCancel returned (undelivered %q), want the code",
					timeout, got, ch.Undelivered)
			}
		})
	}
}

// wantSkipped: the message of challenge ch (of payment id) was skipped for reason, unsent, its
// code redacted, and the outbox page says note.
func (b *bench) wantSkipped(t *testing.T, id, ch, code, reason, note string) {
	t.Helper()
	ctx := context.Background()
	var body string
	if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE challenge_id = $1 AND skip_reason = $2
		AND delivered_at IS NULL`, ch, reason).Scan(&body); err != nil {
		t.Fatalf("the dead code's message is not marked %s: %v", reason, err)
	}
	if strings.Contains(body, code) {
		t.Fatalf("the skipped message keeps its code: %q", body)
	}
	msgs, err := b.svc.Outbox(ctx, payments.Staff{Email: "admin@example.com", Role: "admin"}, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].LastError != note {
		t.Fatalf("outbox page = %+v, want one message noted %q", msgs, note)
	}
}

// A code that died while its delivery waited for the retry is not sent; the retry marks it
// skipped with the reason, redacts it, and the outbox page says why:
//   - its wrong guesses used up its attempts (someone typed five wrong codes): ConfirmCancel
//     refuses it for good, yet the retry sent a code that answers "no longer usable";
//   - its payment finished meanwhile (the customer's capture came first): the retry asked the
//     customer to read out a code to cancel a Completed payment, refused as such (an outside
//     review, outbox).
//
// Negative control: without the 'spent' or the 'finished' case in the claim the retry sends it
// (sent 1).
func TestOutboxRetrySkipsADeadCode(t *testing.T) {
	t.Parallel()
	cases := []struct {
		reason, note string
		kill         func(t *testing.T, b *bench, sess payments.Session, challenge, code string)
	}{
		{"spent", "not sent again: the code was out of attempts", func(t *testing.T, b *bench, sess payments.Session, challenge, code string) {
			wrong := "000000"
			if code == wrong {
				wrong = "111111"
			}
			for range 5 { // Config.CodeAttempts, default 5
				if _, err := b.svc.ConfirmCancel(context.Background(), api, sess.ID, challenge, wrong); payments.ErrorCode(err) != payments.EWRONG {
					t.Fatalf("wrong code: %v", err)
				}
			}
		}},
		{"finished", "not sent again: the code was for a payment that had finished", func(t *testing.T, b *bench, sess payments.Session, _, _ string) {
			b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
			if s, err := b.svc.Check(context.Background(), api, sess.ID); err != nil || s.Status != payments.StatusCompleted {
				t.Fatalf("check = %s %v", s.Status, err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			t.Parallel()
			n := &flakyNotifier{down: true}
			b := newBench(t, func(c *payments.Config) { c.Notifier = n })
			ctx := context.Background()
			sess := b.registered(t, "o-dead-code-"+tc.reason, 100)
			ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
			if err != nil {
				t.Fatal(err)
			}
			code := b.lastCode(t, sess.ID)
			tc.kill(t, b, sess, ch.ID, code)
			n.mu.Lock()
			n.down = false
			n.mu.Unlock()
			b.clock.Advance(2 * time.Minute)
			if sent, err := b.svc.DeliverOutbox(ctx); sent != 0 || err != nil {
				t.Fatalf("retry sent %d (%v), want 0: the code is dead (%s)", sent, err, tc.reason)
			}
			b.wantSkipped(t, sess.ID, ch.ID, code, tc.reason, tc.note)
		})
	}
}

// A refund code support asked for, whose first delivery failed, was retried by the patrol after
// the shop's API had refunded the payment in full: the customer was asked to read out a code
// for 10.00 EUR that could only be refused ("refunds would exceed the amount received"). The
// retry skips a refund code whose refund no longer fits what is left ('no_room'), as
// ConfirmRefund counts it; one that still fits is sent. An outside review (notifier abuse);
// negative control: without the 'no_room' case in the claim, the full refund's code is sent.
func TestOutboxRetrySkipsARefundCodeWithNoRoomLeft(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		apiTook  int64 // what the shop's API refunded meanwhile, of 10.00
		wantSent int
	}{
		{"refunded in full meanwhile", 1000, 0},
		{"room left", 300, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := &flakyNotifier{down: true}
			b := newBench(t, func(c *payments.Config) { c.Notifier = n })
			ctx := context.Background()
			paid := b.completed(t, "o-refund-code-room", 1000)
			ch, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(paid.ID, 700, uuid.NewString()))
			if err != nil || ch.Undelivered == "" {
				t.Fatalf("setup: %+v %v, want a code whose delivery failed", ch, err)
			}
			code := b.lastCode(t, paid.ID)
			if _, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: paid.ID, Amount: tc.apiTook, RequestKey: "shop"}); err != nil {
				t.Fatal(err)
			}
			n.mu.Lock()
			n.down = false
			n.mu.Unlock()
			b.clock.Advance(2 * time.Minute)
			if sent, err := b.svc.DeliverOutbox(ctx); sent != tc.wantSent || err != nil {
				t.Fatalf("retry sent %d (%v), want %d", sent, err, tc.wantSent)
			}
			if tc.wantSent == 1 {
				if _, err := b.svc.ConfirmRefund(ctx, supportStaff, paid.ID, ch.ID, code); err != nil {
					t.Fatalf("the code sent still refunds: %v", err)
				}
				return
			}
			b.wantSkipped(t, paid.ID, ch.ID, code, "no_room", "not sent again: the code was for a refund the payment no longer had room for")
		})
	}
}

// A refund code skipped for want of room ('no_room') is never sent; its challenge stayed open,
// and once the room came back (the waiting refund proposal that took it was rejected) support's
// same form answered that code as sent and sent nothing: the customer had no code to read out
// until it expired (a review of the rule). The skip supersedes the challenge: the form sent again
// issues a new code, which is delivered and refunds. Negative control: without the claim's
// superseding, the form answers the old challenge and nothing is sent.
func TestARefundCodeSkippedForWantOfRoomIsReplacedWhenTheRoomComesBack(t *testing.T) {
	t.Parallel()
	n := &flakyNotifier{down: true}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	paid := b.completed(t, "o-refund-code-room-back", 1000)
	form := staffRefund(paid.ID, 700, uuid.NewString())
	ch, err := b.svc.RequestRefundCode(ctx, supportStaff, form)
	if err != nil || ch.Undelivered == "" {
		t.Fatalf("setup: %+v %v, want a code whose delivery failed", ch, err)
	}
	oldCode := b.lastCode(t, paid.ID) // what an admin could read in the outbox meanwhile
	fr, err := b.svc.RefundByFinance(ctx, fin1, staffRefund(paid.ID, 500, uuid.NewString()))
	if err != nil || fr.Proposal == nil {
		t.Fatalf("finance's refund above its limit = %+v %v, want a proposal", fr, err)
	}
	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
	b.clock.Advance(2 * time.Minute)
	if sent, err := b.svc.DeliverOutbox(ctx); sent != 0 || err != nil {
		t.Fatalf("retry sent %d (%v), want 0: the proposal holds the room", sent, err)
	}
	// The skipped code, read out anyway, says why it cannot be used (not "a newer code was
	// sent": none was). Its first delivery failed, and a failed POST may still have reached the
	// customer (the answer lost): it does not say the code "was not sent" — the customer reading
	// it out has it (a review's suspicion, session 54; negative control: without the failed try
	// counted, the answer is "this code was not sent").
	_, err = b.svc.ConfirmRefund(ctx, supportStaff, paid.ID, ch.ID, oldCode)
	if msg := payments.ErrorMessage(err); payments.ErrorCode(err) != payments.EEXPIRED || !strings.Contains(msg, "no longer fitted") ||
		!strings.Contains(msg, "may have reached the customer") || strings.Contains(msg, "was not sent") {
		t.Fatalf("the skipped code confirmed = %v, want 410 saying it no longer fits, and that it may have reached the customer", err)
	}
	if _, err := b.svc.RejectResolution(ctx, fin2, fr.Proposal.ID, "the customer kept the goods"); err != nil {
		t.Fatal(err)
	}
	again, err := b.svc.RequestRefundCode(ctx, supportStaff, form)
	if err != nil || again.Reused || again.ID == ch.ID || again.Undelivered != "" {
		t.Fatalf("the same form once the room is back = %+v %v, want a new code, sent", again, err)
	}
	n.mu.Lock()
	got := append([]payments.Message(nil), n.got...)
	n.mu.Unlock()
	if len(got) != 1 || got[0].Kind != "refund_code" {
		t.Fatalf("messages sent = %+v, want the new code's", got)
	}
	code := regexp.MustCompile(`\b\d{6}\b`).FindString(got[0].Text)
	if r, err := b.svc.ConfirmRefund(ctx, supportStaff, paid.ID, again.ID, code); err != nil || r.Refund.Amount != 700 {
		t.Fatalf("the new code = %+v %v, want a refund of 7.00", r.Refund, err)
	}
}

// With NOTIFY_WEBHOOK_SECRET set, each message POSTed to NOTIFY_WEBHOOK_URL carries a signature
// as the events webhook's POSTs do (Pitlane-Signature, t=…,v1=… over the body, one v1 per secret
// while they rotate), so the service that texts codes to customers can refuse a message pitlane
// did not send: they were unsigned, and a forged POST made it send codes nobody asked for (an
// outside review, outbound notifications). Unset, nothing is signed. Negative control: no
// signature header, Verify fails.
func TestNotifierSignsItsPOSTsWithTheSecret(t *testing.T) {
	t.Parallel()
	old, cur := []byte(strings.Repeat("o", 32)), []byte(strings.Repeat("n", 32))
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	var header string
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		header = r.Header.Get(payments.EventsWebhookSignatureHeader)
		body, _ = io.ReadAll(r.Body)
	}))
	defer srv.Close()
	msg := payments.Message{To: "c@example.com", Kind: "cancel_code", Text: "code 123456", OrderID: "o-1", PaymentID: "p-1"}
	for _, secrets := range [][][]byte{{old, cur}, nil} {
		n := payments.WebhookNotifier{URL: srv.URL, Secrets: secrets, Now: func() time.Time { return at }}
		if err := n.Notify(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
		if secrets == nil {
			if header != "" {
				t.Fatalf("signed without a secret: %q", header)
			}
			continue
		}
		for _, s := range secrets {
			if err := webhooksig.Verify(header, body, [][]byte{s}, at, time.Minute); err != nil {
				t.Fatalf("the receiver's check with one of the secrets: %v (header %q)", err, header)
			}
		}
		if err := webhooksig.Verify(header, []byte(`{"to":"someone else"}`), secrets, at, time.Minute); err == nil {
			t.Fatal("another body verifies under the signature")
		}
	}
}

// A code's message retried minutes after the code was issued says what is left of the code: the
// text written at issue said "It expires in 10 minutes" on every try, so the customer reached
// by the retry at minute 7 was told 10 while 3 were left, and read it out too late (an outside
// review, outbox). The first try says the whole TTL; the outbox keeps what was written.
// Negative control: without the claim's re-wording, the retry says 10 minutes.
func TestRetriedCodeMessageSaysWhatIsLeftOfTheCode(t *testing.T) {
	t.Parallel()
	n := &flakyNotifier{down: true}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	sess := b.registered(t, "o-retry-expiry", 100)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, sess.ID)
	for _, wait := range []time.Duration{time.Minute, 2 * time.Minute} { // tries at +1 and +3 min fail
		b.clock.Advance(wait)
		if sent, err := b.svc.DeliverOutbox(ctx); sent != 1 || err != nil {
			t.Fatalf("retry while the notifier is down: %d %v", sent, err)
		}
	}
	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
	b.clock.Advance(4*time.Minute + 30*time.Second) // +7m30s: 2m30s left of the code
	if sent, err := b.svc.DeliverOutbox(ctx); sent != 1 || err != nil {
		t.Fatalf("retry once the notifier is back: %d %v", sent, err)
	}
	n.mu.Lock()
	got := slices.Clone(n.got)
	n.mu.Unlock()
	if len(got) != 1 || !strings.Contains(got[0].Text, "is "+code+". It expires in 2 minutes. Read it") {
		t.Fatalf("the retry at +7m30s sent %q, want the code and \"It expires in 2 minutes.\"", got)
	}
}

// The form's code whose first delivery was cut by its request's end (the support agent's browser
// gave up: the error page after which the form is sent again) is given back with no attempt
// counted and no error: the form sent again says its message still waits (the session's own
// review). Negative control: with openChallengeOf reading only refused messages, Undelivered is
// empty and the console says "Ask the customer to read it to you".
func TestACodeFormSentAgainAfterACutDeliverySaysItWaits(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	req, cut := context.WithCancel(context.Background())
	defer cut()
	calls := 0
	svc := b.service(b.pool, "replica-cut", func(c *payments.Config) {
		c.Notifier = notifyFunc(func(ctx context.Context, m payments.Message) error {
			calls++
			cut() // the client hangs up while the message is on its way
			return ctx.Err()
		})
	})
	sess := b.registered(t, "o-cut-then-again", 100)
	intent := uuid.NewString()
	first, err := svc.RequestCancelOnce(req, supportStaff.Actor(), sess.ID, intent)
	if err != nil {
		t.Fatalf("first form: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1 AND delivered_at IS NULL AND skipped_at IS NULL`, sess.ID); n != 1 {
		t.Fatalf("premise: %d undelivered messages, want the code's", n)
	}
	again, err := svc.RequestCancelOnce(context.Background(), supportStaff.Actor(), sess.ID, intent)
	if err != nil || !again.Reused || again.ID != first.ID {
		t.Fatalf("the form again = %+v %v: want its open code", again, err)
	}
	if calls != 1 {
		t.Fatalf("notifier called %d times", calls)
	}
	if again.Undelivered == "" {
		t.Fatalf("the form sent again answers its open code as sent (Undelivered empty) while its message was never delivered (outbox: %d undelivered)",
			b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1 AND delivered_at IS NULL`, sess.ID))
	}
}

// TestADeadCodeWhoseTriesFailedStopsCountingAsFailing: a code whose delivery failed waited for its
// next try (minutes later, on the doubling schedule) before the claim marked it skipped; until
// then it counted among the failing customer messages (the alert "customers may not be getting
// their codes") though it had expired, or a newer code had been delivered (an outside review,
// notifier2). The housekeeping's RedactDeadCodes marks a dead code's unsent message skipped with
// its reason, as the claim does; one on its way (a live lease) is left to its delivery.
func TestADeadCodeWhoseTriesFailedStopsCountingAsFailing(t *testing.T) {
	t.Parallel()
	n := &flakyNotifier{down: true}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	sess := b.registered(t, "o-dead-failing", 100)
	first, err := b.svc.RequestCancel(ctx, api, sess.ID) // its delivery fails: attempts 1
	if err != nil {
		t.Fatal(err)
	}
	failing := func() int {
		t.Helper()
		st, err := b.svc.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.FailingMessages
	}
	if got := failing(); got != 1 {
		t.Fatalf("failing messages after a failed delivery: %d, want 1", got)
	}
	// A newer code, delivered: the first is superseded, its next try still minutes away.
	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.RedactDeadCodes(ctx, b.clock.Now(), 0); err != nil {
		t.Fatal(err)
	}
	if got := failing(); got != 0 {
		t.Fatalf("failing messages after the code died and a newer one was delivered: %d, want 0", got)
	}
	if got := b.count(t, `SELECT count(*) FROM outbox WHERE challenge_id = $1 AND skipped_at IS NOT NULL AND skip_reason = 'superseded' AND delivered_at IS NULL`, first.ID); got != 1 {
		t.Fatalf("the superseded code's message is not marked skipped (%d)", got)
	}
}
