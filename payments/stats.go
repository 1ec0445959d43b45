package payments

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Stats are the counts an operator watches (metrics, console): sessions by status, sessions the
// sweeper gave up on, the sweeper's backlog, open finance cases by kind, and webhook events not
// (yet) processed.
type Stats struct {
	Sessions        map[Status]int // every status present, zero when none
	FlaggedSessions int
	// DueSessions are active sessions whose next look is due and that no live lease covers: the
	// sweepers' backlog. OldestDue is how overdue the oldest of them is (0 when none): if it
	// grows, no replica is sweeping.
	DueSessions    int
	OldestDue      time.Duration
	LeasedSessions int // sessions a sweeper holds right now
	OpenCases      map[string]int
	// OldestOpenCase is how long the oldest open case of each kind in OpenCases has waited: an
	// alert on it means "a case waited an hour", which a count above 0 for an hour does not
	// (a steady flow of cases, each resolved in minutes, keeps the count above 0).
	OldestOpenCase map[string]time.Duration
	// UnprocessedEvents counts the verified webhook events of this replica's gateway not yet
	// applied (those of a gateway before a switch of GATEWAY are nobody's to retry).
	UnprocessedEvents int
	// OldestUnprocessedEvent is how long the oldest verified webhook event not yet applied has
	// waited since it was first received (0 when none waits).
	OldestUnprocessedEvent time.Duration
	// EventBacklogs are the events not yet applied of every gateway, by its name: the counts
	// CachedStats shares between replicas, each of which reads its own gateway's into the two
	// fields above (ofGateway). Shared as those two fields, they were the gateway's of whichever
	// replica counted last: with GATEWAY differing between replicas, each scrape served the
	// other gateway's backlog every other count (an outside review, numbers).
	EventBacklogs map[string]EventBacklog
	// EventsWebhookFailures is how many POSTs of the events webhook failed in a row (0 when it
	// delivers, or is off): feed_push.go's attempts.
	EventsWebhookFailures int
	// EventsWebhookLag is how long the oldest event the events webhook has not delivered yet has
	// waited (0 when none waits, or delivery never began). It grows when the shop is slow or
	// failing, and when no replica pushes any more (EVENTS_WEBHOOK_URL unset everywhere: delete
	// the events_webhook row to turn delivery off for good).
	EventsWebhookLag time.Duration
	// FailingMessages are customer messages (one-time codes) whose delivery to NOTIFY_WEBHOOK_URL
	// failed at least once and that are neither delivered nor skipped since; OldestFailingMessage
	// is how long the oldest of them has waited since it was written (0 when none). Messages never
	// tried are not counted: without NOTIFY_WEBHOOK_URL the admin outbox is their delivery.
	FailingMessages      int
	OldestFailingMessage time.Duration
	// CountedAt is when these counts were taken (the service clock): CachedStats refuses to hand
	// out counts much older than asked for.
	CountedAt time.Time
	// Stuck is the finance workbench's stuck money (active sessions older than SettleWithin,
	// flagged or not) per currency, the most sessions first (amounts in minor units of different
	// currencies do not compare: ¥3,000 is 3000, €10.00 is 1000): at most MaxStuckCurrencies
	// currencies, the rest summed into one StuckOtherCurrencies entry, so a metric labelled by
	// currency stays bounded whatever currencies the API was sent.
	Stuck []StuckMoney
}

// EventBacklog is one gateway's verified webhook events not yet applied: how many, and how long
// the oldest has waited since it was first received.
type EventBacklog struct {
	Events int
	Oldest time.Duration
}

// ofGateway fills UnprocessedEvents and OldestUnprocessedEvent with gateway's backlog. Counts
// without EventBacklogs (nil: stored by a replica of the release before, during a rolling
// deploy; a count of this release stores {} at least) keep the two fields as that replica
// counted them, rather than reading 0 (a review of this change).
func (st *Stats) ofGateway(gateway string) {
	if st.EventBacklogs == nil {
		return
	}
	b := st.EventBacklogs[gateway]
	st.UnprocessedEvents, st.OldestUnprocessedEvent = b.Events, b.Oldest
}

// StuckMoney is the stuck money in one currency.
type StuckMoney struct {
	Currency string
	Sessions int
	Amount   int64 // minor units
}

// MaxStuckCurrencies bounds Stats.Stuck; StuckOtherCurrencies names the rest (its amount mixes
// currencies: a count to look at on the workbench, not a sum of money).
const (
	MaxStuckCurrencies   = 20
	StuckOtherCurrencies = "other"
)

// Stats counts with aggregate queries (each a scan of an index or a small table); callers bound
// the time with ctx. The counts are of the whole database, not of this replica.
func (s *Service) Stats(ctx context.Context) (Stats, error) {
	return s.countStats(ctx, s.db)
}

// countStats is Stats through q: the pool, or the transaction of CachedStats's claim, whose
// counts must run on the connection that transaction holds (see CachedStats).
func (s *Service) countStats(ctx context.Context, q querier) (Stats, error) {
	st := Stats{Sessions: make(map[Status]int, len(AllStatuses)), OpenCases: map[string]int{}, OldestOpenCase: map[string]time.Duration{}}
	for _, a := range AllStatuses {
		st.Sessions[a] = 0
	}
	counts, err := statusCounts(ctx, q)
	if err != nil {
		return Stats{}, fmt.Errorf("stats: %w", err)
	}
	for st2, n := range counts {
		st.Sessions[st2] = n
	}

	now := s.cfg.Clock.Now()
	st.CountedAt = now
	rows, err := q.Query(ctx, `SELECT kind, count(*), min(created_at) FROM finance_cases WHERE resolved_at IS NULL GROUP BY kind`)
	if err != nil {
		return Stats{}, fmt.Errorf("stats: cases: %w", err)
	}
	for rows.Next() {
		var kind string
		var n int
		var oldest time.Time
		if err := rows.Scan(&kind, &n, &oldest); err != nil {
			rows.Close()
			return Stats{}, fmt.Errorf("stats: cases: %w", err)
		}
		st.OpenCases[kind] = n
		st.OldestOpenCase[kind] = max(now.Sub(oldest), 0)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Stats{}, fmt.Errorf("stats: cases: %w", err)
	}

	// The same predicate as the sweeper's claim (claimDue), so "due" means what it means there.
	if st.EventBacklogs, err = eventBacklogs(ctx, q, now); err != nil {
		return Stats{}, err
	}
	st.ofGateway(s.gatewayName())
	var oldest, oldestMessage *time.Time
	var pushCursor *string
	if err := q.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM payment_sessions WHERE flagged_at IS NOT NULL AND `+activeStatusSQL+`),
		(SELECT count(*) FROM payment_sessions WHERE `+activeStatusSQL+` AND next_check_at <= $1 AND flagged_at IS NULL
			AND (lease_until IS NULL OR lease_until <= $1)),
		(SELECT min(next_check_at) FROM payment_sessions WHERE `+activeStatusSQL+` AND next_check_at <= $1 AND flagged_at IS NULL
			AND (lease_until IS NULL OR lease_until <= $1)),
		(SELECT count(*) FROM payment_sessions WHERE `+activeStatusSQL+` AND lease_until > $1),
		(SELECT coalesce(max(attempts), 0) FROM events_webhook),
		(SELECT cursor FROM events_webhook),
		(SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND skipped_at IS NULL AND attempts > 0),
		(SELECT min(created_at) FROM outbox WHERE delivered_at IS NULL AND skipped_at IS NULL AND attempts > 0)`, now).
		Scan(&st.FlaggedSessions, &st.DueSessions, &oldest, &st.LeasedSessions, &st.EventsWebhookFailures, &pushCursor,
			&st.FailingMessages, &oldestMessage); err != nil {
		return Stats{}, fmt.Errorf("stats: sweeper: %w", err)
	}
	if pushCursor != nil {
		_, waiting, err := eventsAfter(ctx, q, *pushCursor, 1)
		if err != nil {
			return Stats{}, fmt.Errorf("stats: %w", err)
		}
		if waiting != nil && now.After(*waiting) {
			st.EventsWebhookLag = now.Sub(*waiting)
		}
	}
	if oldest != nil && now.After(*oldest) {
		st.OldestDue = now.Sub(*oldest)
	}
	if oldestMessage != nil && now.After(*oldestMessage) {
		st.OldestFailingMessage = now.Sub(*oldestMessage)
	}
	if st.Stuck, err = stuckMoney(ctx, q, now); err != nil {
		return Stats{}, err
	}
	return st, nil
}

// eventBacklogs counts every gateway's webhook events not yet applied (the inbox's partial index
// of unprocessed events).
func eventBacklogs(ctx context.Context, q querier, now time.Time) (map[string]EventBacklog, error) {
	rows, err := q.Query(ctx, `SELECT gateway, count(*), min(received_at) FROM webhook_events WHERE processed_at IS NULL GROUP BY gateway`)
	if err != nil {
		return nil, fmt.Errorf("stats: webhook events: %w", err)
	}
	out := map[string]EventBacklog{}
	for rows.Next() {
		var gw string
		var b EventBacklog
		var oldest time.Time
		if err := rows.Scan(&gw, &b.Events, &oldest); err != nil {
			rows.Close()
			return nil, fmt.Errorf("stats: webhook events: %w", err)
		}
		b.Oldest = max(now.Sub(oldest), 0)
		out[gw] = b
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("stats: webhook events: %w", err)
	}
	return out, nil
}

// stuckMoney sums the workbench's stuck sessions per currency with the workbench's own totals
// query (an index-only scan of the active sessions), so "stuck" means the same on the page, in
// the metric and in its alert.
func stuckMoney(ctx context.Context, q querier, now time.Time) ([]StuckMoney, error) {
	f, err := StuckFilter{}.normalize()
	if err != nil {
		return nil, err
	}
	query, args := stuckTotalsSQL(f, now)
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("stats: stuck money: %w", err)
	}
	by := map[string]*StuckMoney{}
	for rows.Next() {
		var status, currency string
		var n int
		var amount int64
		if err := rows.Scan(&status, &currency, &n, &amount); err != nil {
			rows.Close()
			return nil, fmt.Errorf("stats: stuck money: %w", err)
		}
		m := by[currency]
		if m == nil {
			m = &StuckMoney{Currency: currency}
			by[currency] = m
		}
		m.Sessions += n
		m.Amount += amount
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("stats: stuck money: %w", err)
	}
	out := make([]StuckMoney, 0, len(by))
	for _, m := range by {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b StuckMoney) int {
		if c := cmp.Compare(b.Sessions, a.Sessions); c != 0 {
			return c
		}
		return strings.Compare(a.Currency, b.Currency)
	})
	if len(out) > MaxStuckCurrencies {
		rest := StuckMoney{Currency: StuckOtherCurrencies}
		for _, m := range out[MaxStuckCurrencies:] {
			rest.Sessions += m.Sessions
			rest.Amount += m.Amount
		}
		out = append(out[:MaxStuckCurrencies], rest)
	}
	return out, nil
}

// statusDeltaFold is how many delta rows StatusCounts lets pile up before it folds them.
const statusDeltaFold = 1000

// StatusCounts returns how many sessions are in each status present, exactly, without counting
// payment_sessions: it sums the deltas its trigger appends (migration 00021), and when more
// than statusDeltaFold rows have piled up folds them into one row per status (one statement:
// the rows it deletes are the rows it sums, so nothing is lost or counted twice, whoever folds
// at the same time).
func (s *Service) StatusCounts(ctx context.Context) (map[Status]int, error) {
	return statusCounts(ctx, s.db)
}

// statusCounts is StatusCounts through q. In CachedStats's transaction a fold commits with the
// stored counts: another fold waits for the rows it deleted until then (one more statement),
// and then finds them gone, under READ COMMITTED, and folds what is left.
func statusCounts(ctx context.Context, q querier) (map[Status]int, error) {
	rows, err := q.Query(ctx, `SELECT status, sum(delta), count(*) FROM session_status_deltas GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("status counts: %w", err)
	}
	counts := map[Status]int{}
	pending := 0
	for rows.Next() {
		var status string
		var n, k int
		if err := rows.Scan(&status, &n, &k); err != nil {
			rows.Close()
			return nil, fmt.Errorf("status counts: %w", err)
		}
		if n != 0 {
			counts[Status(status)] = n
		}
		pending += k
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("status counts: %w", err)
	}
	if pending > statusDeltaFold {
		if _, err := q.Exec(ctx, `WITH gone AS (DELETE FROM session_status_deltas RETURNING status, delta)
			INSERT INTO session_status_deltas (status, delta) SELECT status, sum(delta) FROM gone GROUP BY status`); err != nil {
			return nil, fmt.Errorf("status counts: fold: %w", err)
		}
	}
	return counts, nil
}

// gatewayName is the name of the service's gateway ("" without one).
func (s *Service) gatewayName() string {
	if s.gw == nil {
		return ""
	}
	return s.gw.Name()
}
