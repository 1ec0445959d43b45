package payments

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/payments/dbconn"
)

// Read models of the staff console (console_*.go). They only read (finance's few writes are in
// finance.go and resolution.go); each is one or a few plain queries on the pool: a page is a
// snapshot for people, and the core's guards, not these reads, decide every change. A page whose
// figures describe its rows (totals over a list, a count beside it) reads both in one snapshot
// (readPage).

// readPage runs a page's reads in one read-only REPEATABLE READ transaction: one snapshot, so
// the totals and counts of a page describe the rows it lists (read one after the other on the
// pool, a payment settled between them was listed under totals without it: an outside review,
// numbers2).
func (s *Service) readPage(ctx context.Context, what string, read func(q querier) error) error {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("%s: begin: %w", what, err)
	}
	if err := read(tx); err != nil {
		rctx, cancel := dbconn.Rollback(ctx) // bounded: a host gone silent must not hold the page
		defer cancel()
		_ = tx.Rollback(rctx)
		return err
	}
	return tx.Commit(ctx)
}

// StuckAfter is how far past its next_check_at an active session must be to count as stuck: the
// patrol runs every few seconds, so a session this late means no replica is settling it.
const StuckAfter = time.Minute

// dashboardNextLateSQL is the soonest next look of an active session not late for it yet ($1:
// StuckAfter before now): it turns stuck StuckAfter after it. The first entry of
// payment_sessions_due (the patrol's index) from $1 on; a flagged session is stuck already, and
// flagging ends its schedule anyway.
var dashboardNextLateSQL = `SELECT min(next_check_at) FROM payment_sessions WHERE ` + activeStatusSQL + `
	AND flagged_at IS NULL AND next_check_at >= $1`

// StatusCount is how many sessions are in one status.
type StatusCount struct {
	Status Status
	Count  int
}

// Dashboard is the console's first screen.
type Dashboard struct {
	Counts     []StatusCount // every status, in AllStatuses order, zeros included
	Active     int
	Stuck      []Session // active and late for the patrol, or flagged for finance (first 20)
	StuckTotal int
	OpenCases  int
	Leases     int // sessions leased to a patrol right now
	// LateAt is when the next active session turns stuck by the clock alone, StuckAfter past
	// its next_check_at with no patrol having looked (nil: none is scheduled). Nothing is
	// written at that moment, so no live notification says so: the dashboard refreshes itself
	// then (views.LiveDue, through ChangesAt). A patrol's look moves next_check_at and notifies
	// anyway.
	LateAt *time.Time
	// LeaseEndsAt is when the soonest lease of an active session runs out (nil: none is held):
	// Leases drops then by the clock alone, a replica that died holding it writing nothing.
	LeaseEndsAt *time.Time
	// Patrols is every replica's patrol as its last heartbeat says (back-off included).
	Patrols []Heartbeat
	At      time.Time
}

// ChangesAt is when the dashboard changes by the clock alone: a session turning stuck or a lease
// running out, whichever comes first (nil: neither). An open dashboard kept "1 session held by a
// patrol" for an hour after a dead replica's lease ran out (an outside review).
func (d Dashboard) ChangesAt() *time.Time {
	switch {
	case d.LateAt == nil:
		return d.LeaseEndsAt
	case d.LeaseEndsAt != nil && d.LeaseEndsAt.Before(*d.LateAt):
		return d.LeaseEndsAt
	}
	return d.LateAt
}

// Dashboard counts sessions per status and lists the stuck ones.
func (s *Service) Dashboard(ctx context.Context) (Dashboard, error) {
	now := s.cfg.Clock.Now()
	d := Dashboard{At: now}
	// Exact, and without counting the table: StatusCounts sums a trigger's deltas.
	counts, err := s.StatusCounts(ctx)
	if err != nil {
		return Dashboard{}, fmt.Errorf("dashboard: %w", err)
	}
	for _, st := range AllStatuses {
		d.Counts = append(d.Counts, StatusCount{Status: st, Count: counts[st]})
		if st.Active() {
			d.Active += counts[st]
		}
	}
	stuckWhere := activeStatusSQL + ` AND (flagged_at IS NOT NULL OR next_check_at < $1)`
	late := now.Add(-StuckAfter)
	if err := s.db.QueryRow(ctx, `SELECT count(*) FROM payment_sessions WHERE `+stuckWhere,
		late).Scan(&d.StuckTotal); err != nil {
		return Dashboard{}, fmt.Errorf("dashboard: stuck: %w", err)
	}
	rows, err := s.db.Query(ctx, `SELECT `+sessionColumns+` FROM payment_sessions WHERE `+stuckWhere+`
		ORDER BY flagged_at NULLS LAST, next_check_at LIMIT 20`, late)
	if err != nil {
		return Dashboard{}, fmt.Errorf("dashboard: stuck: %w", err)
	}
	if d.Stuck, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Session, error) { return scanSession(r) }); err != nil {
		return Dashboard{}, fmt.Errorf("dashboard: stuck: %w", err)
	}
	var next *time.Time
	if err := s.db.QueryRow(ctx, dashboardNextLateSQL, late).Scan(&next); err != nil {
		return Dashboard{}, fmt.Errorf("dashboard: next stuck: %w", err)
	}
	if next != nil {
		at := next.Add(StuckAfter)
		d.LateAt = &at
	}
	if err := s.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM finance_cases WHERE resolved_at IS NULL), leases.*
		FROM (SELECT count(*), min(lease_until) FROM payment_sessions WHERE `+activeStatusSQL+` AND lease_until > $1) leases`,
		now).Scan(&d.OpenCases, &d.Leases, &d.LeaseEndsAt); err != nil {
		return Dashboard{}, fmt.Errorf("dashboard: cases: %w", err)
	}
	if d.Patrols, err = s.Heartbeats(ctx); err != nil {
		return Dashboard{}, fmt.Errorf("dashboard: %w", err)
	}
	return d, nil
}

// PaymentFilter narrows ListPayments. Query matches a payment id, a gateway payment id, or an
// order id (exactly or as a prefix).
type PaymentFilter struct {
	Query  string
	Status Status
	// Before continues a list: sessions created before this one (keyset pagination).
	Before string
	Limit  int
}

// PaymentPage is one page of ListPayments; Next is the Before of the following page ("" at the end).
type PaymentPage struct {
	Sessions []Session
	Next     string
}

// ListPayments lists sessions newest first.
func (s *Service) ListPayments(ctx context.Context, f PaymentFilter) (PaymentPage, error) {
	if f.Limit <= 0 || f.Limit > 200 {
		f.Limit = 50
	}
	if f.Status != "" && !f.Status.Valid() {
		return PaymentPage{}, Invalid("status", "unknown status %q", f.Status)
	}
	q := strings.TrimSpace(f.Query)
	var byID any // only a well-formed uuid is compared with the uuid column
	if validUUID(strings.ToLower(q)) {
		byID = strings.ToLower(q)
	}
	var before any
	if f.Before != "" {
		if !validUUID(f.Before) {
			return PaymentPage{}, Invalid("before", "before must be a payment id")
		}
		before = f.Before
	}
	// Only the filters given, each combination its own statement, with the status and the limit
	// as literals (a status is one of AllStatuses, checked above): "($4 = '' OR status = $4)"
	// left the prepared statement's generic plan walking payment_sessions_created and filtering
	// every row — a search for an order that is not there, or a rare status, read every payment
	// ever made (0.8–4 s at a million sessions; an outside review of plans at scale).
	where, args := []string{"true"}, []any{}
	arg := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	if q != "" {
		// The prefix is also a range of payment_sessions_order_pattern (text_pattern_ops, 00860),
		// which a generic plan can use with parameters as it cannot a LIKE's: order ids are
		// ASCII below DEL (create.go), so every id starting with q is in [q, q+DEL).
		qa := arg(q)
		cond := "gateway_payment_id = " + qa + " OR order_id = " + qa + " OR (order_id ~>=~ " + qa + " AND order_id ~<~ " + arg(q+"\x7f") +
			" AND order_id LIKE " + arg(likePrefix(q)) + ` ESCAPE '\')`
		if byID != nil {
			cond += " OR id = " + arg(byID) + "::uuid"
		}
		where = append(where, "("+cond+")")
	}
	if f.Status != "" {
		where = append(where, "status = '"+string(f.Status)+"'")
	}
	if before != nil {
		where = append(where, "(created_at, id) < (SELECT created_at, id FROM payment_sessions WHERE id = "+arg(before)+"::uuid)")
	}
	if q != "" {
		// Planned with its values each time: under the generic plan a common prefix (the shop's
		// own "ORD-2026") read every matching row of the three conditions and sorted them for a
		// page of 50 (100,000 rows for "o-"; an outside review, console lists).
		args = append([]any{pgx.QueryExecModeExec}, args...)
	}
	rows, err := s.db.Query(ctx, `SELECT `+sessionColumns+` FROM payment_sessions
		WHERE `+strings.Join(where, " AND ")+`
		ORDER BY created_at DESC, payment_sessions.id DESC
		LIMIT `+strconv.Itoa(f.Limit+1), args...)
	if err != nil {
		return PaymentPage{}, fmt.Errorf("list payments: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Session, error) { return scanSession(r) })
	if err != nil {
		return PaymentPage{}, fmt.Errorf("list payments: %w", err)
	}
	if len(list) == 0 && before != nil {
		// A cursor that names no payment (an edited link, one from another installation) is
		// not "No payments match" while there are (an outside review, console lists).
		var known bool
		if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM payment_sessions WHERE id = $1::uuid)`, before).Scan(&known); err != nil {
			return PaymentPage{}, fmt.Errorf("list payments: cursor: %w", err)
		}
		if !known {
			return PaymentPage{}, Invalid("before", "before must be the id of a payment shown on a page of this list: start again from the first page")
		}
	}
	page := PaymentPage{Sessions: list}
	if len(list) > f.Limit {
		page.Sessions = list[:f.Limit]
		page.Next = list[f.Limit-1].ID
	}
	return page, nil
}

// likePrefix turns q into a LIKE pattern matching q as a prefix, with LIKE's wildcards escaped.
func likePrefix(q string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(q) + "%"
}

// Event is one timeline entry of a session.
type Event struct {
	ID         int64
	FromStatus Status // "" for the creation
	ToStatus   Status
	ActorKind  ActorKind
	ActorID    string
	Reason     string
	At         time.Time
}

// GatewayCall is one logged call to the gateway.
type GatewayCall struct {
	ID             int64
	Operation      string
	IdempotencyKey string
	Outcome        string
	HTTPStatus     int
	LatencyMS      int
	Detail         string
	ReplicaID      string
	At             time.Time
}

// ReverseOperation is the one reverse (void) of a canceled session.
type ReverseOperation struct {
	ID          string
	ChallengeID string
	Status      string
	Detail      string
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// ChallengeInfo is a one-time code's challenge as staff may see it: never the code.
type ChallengeInfo struct {
	ID          string
	Action      CodeAction
	Amount      int64 // refund: the amount the code confirms
	RequestedBy string
	CreatedAt   time.Time
	ExpiresAt   time.Time
	Attempts    int
	MaxAttempts int
	ConsumedAt  *time.Time
	// SupersededAt: a newer code of the payment replaced this one (it takes no code any more).
	SupersededAt *time.Time
	// Undelivered is the notifier's last refusal of the code's message, while it waits for the
	// patrol's next try ("" once delivered, or when nothing refused it): the code form said the
	// code went to the customer beside a flash saying it could not be sent yet (an outside
	// review, a11y).
	Undelivered string
}

// ChangesAt is when the payment page changes by the clock alone (nil: nothing is due): the codes'
// lock lapsing, a code still pending expiring, or a patrol's lease listed on it running out (its
// replica lost mid-drive). Nothing is written at these moments, so no live notification says
// so; the page refreshes itself then (views.LiveDue).
func (d PaymentDetail) ChangesAt() *time.Time {
	var at *time.Time
	earlier := func(t time.Time) {
		if t.After(d.At) && (at == nil || t.Before(*at)) {
			at = &t
		}
	}
	if d.CodesLockedUntil != nil {
		earlier(*d.CodesLockedUntil)
	}
	if d.Session.LeaseUntil != nil {
		earlier(*d.Session.LeaseUntil)
	}
	for _, c := range d.Challenges {
		if c.Pending(d.At) {
			earlier(c.ExpiresAt)
		}
	}
	return at
}

// Pending reports whether the challenge can still take a code at now.
func (c ChallengeInfo) Pending(now time.Time) bool {
	return c.ConsumedAt == nil && c.SupersededAt == nil && c.ExpiresAt.After(now) && c.Attempts < c.MaxAttempts
}

// CodeContact is where the payment's one-time codes go: its own contact, else its order's (as
// the code's message is addressed). The form named the payment's alone, "the customer ()" for a
// payment created without one.
func (d PaymentDetail) CodeContact() string {
	return cmp.Or(d.Session.CustomerContact, d.Order.CustomerContact)
}

// AttemptsLeft is how many codes may still be tried on challenge c: its own attempts left, or
// the payment's wrong codes left for the day (CodeGuessesPerDay across all its codes) when that
// is fewer. The form said a fresh code had its 5 while one more wrong code would lock every code
// of the payment for a day (an outside review).
func (d PaymentDetail) AttemptsLeft(c ChallengeInfo) int {
	return max(0, min(c.MaxAttempts-c.Attempts, CodeGuessesPerDay-d.WrongCodes))
}

// PaymentCallsShown is how many of a session's gateway calls its console page lists (the
// newest); OlderCallsCounted bounds the count of the others.
const (
	PaymentCallsShown = 100
	OlderCallsCounted = 10000
)

// PaymentDetail is everything the console shows about one session.
type PaymentDetail struct {
	Session       Session
	Order         Order
	OrderSessions []Session // every session of the order, oldest first (this one included)
	Events        []Event
	Calls         []GatewayCall // the newest PaymentCallsShown, oldest first
	// OlderCalls is how many older calls are not in Calls (counted up to OlderCallsCounted:
	// that many means "at least").
	OlderCalls int
	Reverse    *ReverseOperation
	Challenges []ChallengeInfo // newest first
	// WrongCodes is how many wrong codes count against the payment now (within a day, not
	// cleared); CodesLockedUntil, when they reach CodeGuessesPerDay, is when the lock lapses by
	// itself (UnlockCodes lifts it sooner).
	WrongCodes       int
	CodesLockedUntil *time.Time
	Refunds          []Refund // oldest first
	// RefundProposals are the payment's four-eyes refund proposals, newest first;
	// RefundSettleProposals its proposed outcomes for refunds stuck Pending.
	RefundProposals       []Resolution
	RefundSettleProposals []Resolution
	Cases                 []FinanceCase
	Ledger                []LedgerEntry
	Audit                 []AuditEntry // staff actions on this payment, newest first
	At                    time.Time
	contradicted          bool // CancelRefused
}

// CancelRefused is why the console offers no cancel of a payment its status would let be
// canceled, nor the code form of one requested before: the gateway's word about it does not
// match it (mismatchRefusal's rule, read by the same query: an open gateway_mismatch case, or —
// the payment flagged — any such case); "" when a cancel may be requested. Offered, the forms
// were refused on every click (an outside review left them so).
func (d PaymentDetail) CancelRefused() string {
	if !d.contradicted {
		return ""
	}
	return "the gateway's answer about it does not match it (a gateway_mismatch case): finance settles it"
}

// Refundable is how much of the payment may still be refunded from the console: the amount
// received less every refund but a Failed one and less a refund proposal waiting for approval,
// whose amount is spoken for (refundRoom; 0 unless Completed). Refunds' own check runs under the
// locks; this is what the page shows.
func (d PaymentDetail) Refundable() int64 {
	if d.Session.Status != StatusCompleted {
		return 0
	}
	return max(d.Session.Amount-d.RefundsCounted(), 0)
}

// RefundsCounted is what counts against the payment's refundable amount as the page read it:
// every refund but a Failed one, and a refund proposal waiting for approval (refundTotals under
// the locks); the page's refund forms carry it in RefundsSeen.
func (d PaymentDetail) RefundsCounted() int64 {
	var n int64
	for _, r := range d.Refunds {
		if r.Status != RefundFailed {
			n += r.Amount
		}
	}
	if p := d.WaitingRefundProposal(); p != nil {
		n += p.RefundAmount
	}
	return n
}

// RefundsSeen is what the page shows of the payment's refunds, which its refund forms carry
// (StaffRefundInput.Seen): a form the refunds outran is refused.
func (d PaymentDetail) RefundsSeen() RefundsSeen {
	r := RefundsSeen{Counted: d.RefundsCounted(), Made: int64(len(d.Refunds))}
	if p := d.WaitingRefundProposal(); p != nil {
		r.Waiting = p.ID
	}
	return r
}

// WaitingRefundProposal is the refund proposal waiting for a second person, if any.
func (d PaymentDetail) WaitingRefundProposal() *Resolution {
	for i := range d.RefundProposals {
		if d.RefundProposals[i].Pending() {
			return &d.RefundProposals[i]
		}
	}
	return nil
}

// WaitingRefundSettle returns the proposed outcome of refund id that waits for a second
// person, if any.
func (d PaymentDetail) WaitingRefundSettle(id string) *Resolution {
	for i := range d.RefundSettleProposals {
		if p := &d.RefundSettleProposals[i]; p.Pending() && p.RefundID == id {
			return p
		}
	}
	return nil
}

// WaitingProposal is the payment's proposal still waiting for a second person, if any (of its
// refunds: at most one waits per payment, whatever it proposes).
func (d PaymentDetail) WaitingProposal() *Resolution {
	for _, list := range [][]Resolution{d.RefundProposals, d.RefundSettleProposals} {
		for i := range list {
			if list[i].Pending() {
				return &list[i]
			}
		}
	}
	return nil
}

// Challenge returns the session's challenge with this id.
func (d PaymentDetail) Challenge(id string) (ChallengeInfo, bool) {
	for _, c := range d.Challenges {
		if c.ID == id {
			return c, true
		}
	}
	return ChallengeInfo{}, false
}

// PaymentDetail reads one session with its timeline, gateway calls, reverse, challenges,
// refunds and refund proposals, cases, ledger entries and audit entries.
func (s *Service) PaymentDetail(ctx context.Context, id string) (PaymentDetail, error) {
	sess, err := s.Get(ctx, id)
	if err != nil {
		return PaymentDetail{}, err
	}
	id = sess.ID // as stored: the id as typed may be in upper case, and audit targets are text
	d := PaymentDetail{Session: sess, At: s.cfg.Clock.Now()}
	if d.Order, d.OrderSessions, err = s.GetOrder(ctx, sess.OrderID); err != nil {
		return PaymentDetail{}, err
	}
	rows, err := s.db.Query(ctx, `SELECT id, coalesce(from_status, ''), to_status, actor_kind, actor_id, reason, created_at
		FROM session_events WHERE session_id = $1 ORDER BY id`, id)
	if err != nil {
		return PaymentDetail{}, fmt.Errorf("payment detail: events: %w", err)
	}
	if d.Events, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		var from, to, kind string
		err := r.Scan(&e.ID, &from, &to, &kind, &e.ActorID, &e.Reason, &e.At)
		e.FromStatus, e.ToStatus, e.ActorKind = Status(from), Status(to), ActorKind(kind)
		return e, err
	}); err != nil {
		return PaymentDetail{}, fmt.Errorf("payment detail: events: %w", err)
	}
	// The newest calls only: each look of a customer's page at an active payment is a call (one
	// per 5 s at most), and a page left open or a script added thousands a day, all rendered on
	// every view and live refresh (an outside review: 4.9 MB and 0.45 s after a day).
	rows, err = s.db.Query(ctx, `SELECT * FROM (SELECT id, operation, coalesce(idempotency_key, ''), outcome, coalesce(http_status, 0),
		latency_ms, detail, replica_id, created_at FROM gateway_calls WHERE session_id = $1 ORDER BY id DESC LIMIT $2) newest ORDER BY id`,
		id, PaymentCallsShown+1)
	if err != nil {
		return PaymentDetail{}, fmt.Errorf("payment detail: gateway calls: %w", err)
	}
	if d.Calls, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (GatewayCall, error) {
		var c GatewayCall
		err := r.Scan(&c.ID, &c.Operation, &c.IdempotencyKey, &c.Outcome, &c.HTTPStatus, &c.LatencyMS, &c.Detail, &c.ReplicaID, &c.At)
		return c, err
	}); err != nil {
		return PaymentDetail{}, fmt.Errorf("payment detail: gateway calls: %w", err)
	}
	if len(d.Calls) > PaymentCallsShown {
		d.Calls = d.Calls[1:]
		if err := s.db.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM gateway_calls WHERE session_id = $1 AND id < $2 LIMIT $3) older`,
			id, d.Calls[0].ID, OlderCallsCounted).Scan(&d.OlderCalls); err != nil {
			return PaymentDetail{}, fmt.Errorf("payment detail: older gateway calls: %w", err)
		}
	}
	var rev ReverseOperation
	err = s.db.QueryRow(ctx, `SELECT id::text, coalesce(challenge_id::text, ''), status, detail, created_at, updated_at
		FROM reverse_operations WHERE session_id = $1`, id).
		Scan(&rev.ID, &rev.ChallengeID, &rev.Status, &rev.Detail, &rev.CreatedAt, &rev.UpdatedAt)
	switch {
	case err == nil:
		d.Reverse = &rev
	case !errors.Is(err, pgx.ErrNoRows):
		return PaymentDetail{}, fmt.Errorf("payment detail: reverse: %w", err)
	}
	rows, err = s.db.Query(ctx, `SELECT c.id::text, c.action, coalesce(c.amount, 0), c.requested_by, c.created_at, c.expires_at, c.attempts,
			c.max_attempts, c.consumed_at, c.superseded_at,
			coalesce((SELECT o.last_error FROM outbox o -- through outbox_payment (00870)
				WHERE o.payment_id = c.session_id AND o.challenge_id = c.id AND o.delivered_at IS NULL AND o.skipped_at IS NULL
				ORDER BY o.id DESC LIMIT 1), '')
		FROM cancel_challenges c WHERE c.session_id = $1 ORDER BY c.created_at DESC, c.id`, id)
	if err != nil {
		return PaymentDetail{}, fmt.Errorf("payment detail: challenges: %w", err)
	}
	if d.Challenges, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ChallengeInfo, error) {
		var c ChallengeInfo
		var action string
		err := r.Scan(&c.ID, &action, &c.Amount, &c.RequestedBy, &c.CreatedAt, &c.ExpiresAt, &c.Attempts, &c.MaxAttempts, &c.ConsumedAt, &c.SupersededAt,
			&c.Undelivered)
		c.Action = CodeAction(action)
		return c, err
	}); err != nil {
		return PaymentDetail{}, fmt.Errorf("payment detail: challenges: %w", err)
	}
	if d.WrongCodes, d.CodesLockedUntil, err = codeLock(ctx, s.db, id, d.At); err != nil {
		return PaymentDetail{}, fmt.Errorf("payment detail: %w", err)
	}
	if d.Refunds, err = listRefunds(ctx, s.db, id, math.MaxInt32); err != nil {
		return PaymentDetail{}, fmt.Errorf("payment detail: %w", err)
	}
	proposals, err := s.ListResolutions(ctx, ResolutionFilter{SessionID: id, Limit: 50})
	if err != nil {
		return PaymentDetail{}, err
	}
	for _, p := range proposals {
		switch p.Kind {
		case ProposalRefund:
			d.RefundProposals = append(d.RefundProposals, p)
		case ProposalRefundSettle:
			d.RefundSettleProposals = append(d.RefundSettleProposals, p)
		}
	}
	if d.Cases, err = s.listCases(ctx, s.db, `fc.session_id = $1`, `fc.id DESC`, 500, id); err != nil {
		return PaymentDetail{}, err
	}
	if d.contradicted, err = contradicted(ctx, s.db, d.Session); err != nil {
		return PaymentDetail{}, err
	}
	if d.Ledger, err = s.ledgerEntries(ctx, `session_id = $1`, `id DESC`, id); err != nil {
		return PaymentDetail{}, err
	}
	if d.Audit, err = s.AuditLog(ctx, AuditFilter{Target: id, Limit: 100}); err != nil {
		return PaymentDetail{}, err
	}
	return d, nil
}
