package payments

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
)

// The finance workbench ("Stuck money"): every active session past its expected settle time,
// with what finance needs to judge it, and "Check now" on the rows finance picks.

// SettleWithin is a session's expected settle time, counted from its creation: a customer pays
// on the gateway's page within minutes, and the patrol's first looks come seconds apart
// (DefaultBackoff), so an active session older than this is money nobody has settled — the
// customer walked away, the gateway never answered, or a cancel is stuck. Age, not the patrol's
// schedule, because finance asks "how long has this money been in the air"; a session the patrol
// is late for is already on the dashboard (StuckAfter).
const SettleWithin = 15 * time.Minute

// StuckSort orders the workbench.
type StuckSort string

const (
	StuckByAge StuckSort = "age" // oldest first
	// StuckByAmount: largest first within each currency, currencies in alphabetical order.
	// Minor units of different currencies do not compare (¥3,000 is 3000, €10.00 is 1000), and
	// pitlane keeps no exchange rates: finance sees each currency's largest first.
	StuckByAmount StuckSort = "amount"
)

// FlagFilter narrows the workbench by the patrol's flag.
type FlagFilter string

const (
	FlagAny     FlagFilter = ""
	FlagFlagged FlagFilter = "yes"
	FlagNot     FlagFilter = "no"
)

// StuckPageSize is how many rows a workbench page shows at most.
const StuckPageSize = 50

// StuckFilter narrows and orders the workbench. Zero values: every stuck session, oldest first.
type StuckFilter struct {
	Status   Status // one of ActiveStatuses, or "" for any
	Currency string
	Flagged  FlagFilter
	// MinAge lists only sessions at least this old; never less than SettleWithin.
	MinAge time.Duration
	Sort   StuckSort
	// After continues a list: the Next of the previous page (keyset pagination).
	After string
	Limit int
}

// normalize checks the filter and fills defaults.
func (f StuckFilter) normalize() (StuckFilter, error) {
	if f.Status != "" && !f.Status.Active() {
		return f, Invalid("status", "state must be one of the active states (%s)", strings.Join(statusStrings(ActiveStatuses), ", "))
	}
	f.Currency = strings.ToUpper(strings.TrimSpace(f.Currency))
	if f.Currency != "" && !validCurrency(f.Currency) {
		return f, Invalid("currency", "currency must be three letters like EUR")
	}
	switch f.Flagged {
	case FlagAny, FlagFlagged, FlagNot:
	default:
		return f, Invalid("flagged", "flagged must be yes, no or empty")
	}
	if f.MinAge < SettleWithin {
		f.MinAge = SettleWithin
	}
	switch f.Sort {
	case "":
		f.Sort = StuckByAge
	case StuckByAge, StuckByAmount:
	default:
		return f, Invalid("sort", "sort must be age or amount")
	}
	if f.Limit <= 0 || f.Limit > StuckPageSize {
		f.Limit = StuckPageSize
	}
	return f, nil
}

// StuckSession is one workbench row.
type StuckSession struct {
	Session
	// LastCall is the last gateway call about the session (nil: none yet).
	LastCall *GatewayCall
	// Mismatch: a gateway_mismatch case is open for it.
	Mismatch bool
	// ProposalID is the resolution proposal waiting for approval (0: none).
	ProposalID int64
	// CheckingBy is who holds a "Check now" claim on it right now ("" when nobody), until
	// CheckingUntil (the claim lapses by the clock: a cooldown's end, a replica lost mid-check).
	CheckingBy    string
	CheckingUntil *time.Time
}

// Leased reports whether a patrol holds the session's lease at now.
func (s StuckSession) Leased(now time.Time) bool {
	return s.LeaseOwner != "" && s.LeaseUntil != nil && s.LeaseUntil.After(now)
}

// StuckTotal is the money stuck in one state and currency.
type StuckTotal struct {
	Status   Status
	Currency string
	Count    int
	Amount   int64
}

// StuckPage is one page of the workbench. Totals cover every session matching the filter, not
// only this page. Next is the After of the following page ("" at the end).
type StuckPage struct {
	Filter   StuckFilter
	Sessions []StuckSession
	Next     string
	Totals   []StuckTotal
	At       time.Time
	// Joins is when the next session joins the list by its age alone (nil: no active session
	// under the filter is younger than MinAge).
	Joins *time.Time
}

// ChangesAt is when the page changes by the clock alone (nil: nothing is due): the next session
// joining the list, a "Check now" claim lapsing (its cooldown over, or its replica lost) or a
// patrol's lease running out. Nothing is written at these moments, so no live notification says
// so: the page refreshes itself then (views.LiveDue).
func (p StuckPage) ChangesAt() *time.Time {
	at := p.Joins
	earlier := func(t *time.Time) {
		if t != nil && t.After(p.At) && (at == nil || t.Before(*at)) {
			at = t
		}
	}
	for _, s := range p.Sessions {
		earlier(s.CheckingUntil)
		if s.Leased(p.At) {
			earlier(s.LeaseUntil)
		}
	}
	return at
}

// stuckQuery builds the workbench's SQL: the WHERE clause of the stuck sessions under a filter.
// Only the filters present are spelled out, so every plan (custom or generic) can use the
// partial index of the chosen order.
type stuckQuery struct {
	where []string
	args  []any
}

// arg adds a parameter and returns its placeholder.
func (q *stuckQuery) arg(v any) string {
	q.args = append(q.args, v)
	return "$" + strconv.Itoa(len(q.args))
}

// listed: the sessions old enough to be listed; false: those that are not yet (stuckJoinsSQL).
func newStuckQuery(f StuckFilter, now time.Time, listed bool) *stuckQuery {
	q := &stuckQuery{where: []string{"ps." + activeStatusSQL}}
	age := "ps.created_at <= "
	if !listed {
		age = "ps.created_at > "
	}
	q.where = append(q.where, age+q.arg(now.Add(-f.MinAge)))
	if f.Status != "" {
		q.where = append(q.where, "ps.status = "+q.arg(string(f.Status)))
	}
	if f.Currency != "" {
		q.where = append(q.where, "ps.currency = "+q.arg(f.Currency))
	}
	switch f.Flagged {
	case FlagFlagged:
		q.where = append(q.where, "ps.flagged_at IS NOT NULL")
	case FlagNot:
		q.where = append(q.where, "ps.flagged_at IS NULL")
	}
	return q
}

// maxCursorTime bounds a workbench cursor's time (see stuckListSQL).
var maxCursorTime = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// stuckListSQL is the page query: the filter, the keyset condition after the cursor (a row
// comparison the index of the order serves as a range), the order, one row more than a page.
func stuckListSQL(f StuckFilter, now time.Time) (string, []any, error) {
	q := newStuckQuery(f, now, true)
	order := "ps.created_at, ps.id"
	if f.Sort == StuckByAmount {
		// -amount: one direction for all three keys, so the keyset below is one row comparison
		// and one range of payment_sessions_stuck_by_currency_amount (migration 00610).
		order = "ps.currency, (-ps.amount), ps.id"
	}
	if f.After != "" {
		bad := Invalid("after", "after must be the cursor of a workbench page")
		cur, rest := "", f.After
		if f.Sort == StuckByAmount {
			var ok bool
			if cur, rest, ok = strings.Cut(rest, "_"); !ok || !validCurrency(cur) {
				return "", nil, bad
			}
		}
		n, id, ok := cutCursor(rest)
		// A cursor names what a page row had: an amount the API accepts, or a creation time
		// PostgreSQL can hold (an edited one before 4714 BC was a 500; -2^63 negated, an overflow).
		inRange := n > 0 && n < MaxAmount
		if f.Sort != StuckByAmount {
			inRange = cursorTimeInRange(n)
		}
		if !ok || !inRange {
			return "", nil, bad
		}
		if f.Sort == StuckByAmount {
			q.where = append(q.where, "(ps.currency, (-ps.amount), ps.id) > ("+q.arg(cur)+", "+q.arg(-n)+"::bigint, "+q.arg(id)+"::uuid)")
		} else {
			q.where = append(q.where, "(ps.created_at, ps.id) > ("+q.arg(time.UnixMicro(n).UTC())+", "+q.arg(id)+"::uuid)")
		}
	}
	nowArg := q.arg(now)
	sql := `SELECT ` + sessionColumns + `,
			lc.call_id, lc.call_op, lc.call_outcome, lc.call_http, lc.call_detail, lc.call_replica, lc.call_at,
			EXISTS (SELECT 1 FROM finance_cases fc WHERE fc.session_id = ps.id AND fc.kind = '` + CaseGatewayMismatch + `' AND fc.resolved_at IS NULL),
			coalesce((SELECT rp.id FROM resolution_proposals rp WHERE rp.session_id = ps.id AND rp.state = 'proposed'), 0),
			coalesce(cc.claimed_by, ''), cc.until
		FROM payment_sessions ps
		LEFT JOIN finance_check_claims cc ON cc.session_id = ps.id AND cc.until > ` + nowArg + `
		LEFT JOIN LATERAL (
			SELECT gc.id AS call_id, gc.operation AS call_op, gc.outcome AS call_outcome, coalesce(gc.http_status, 0) AS call_http,
				gc.detail AS call_detail, gc.replica_id AS call_replica, gc.created_at AS call_at
			FROM gateway_calls gc WHERE gc.session_id = ps.id ORDER BY gc.id DESC LIMIT 1
		) lc ON true
		WHERE ` + strings.Join(q.where, " AND ") + `
		ORDER BY ` + order + `
		LIMIT ` + q.arg(f.Limit+1)
	return sql, q.args, nil
}

// stuckTotalsSQL sums the stuck sessions under f per state and currency (no cursor: the totals
// are those of the whole list). An index-only scan of payment_sessions_stuck_by_age.
func stuckTotalsSQL(f StuckFilter, now time.Time) (string, []any) {
	q := newStuckQuery(f, now, true)
	return `SELECT ps.status, ps.currency, count(*), sum(ps.amount)::bigint FROM payment_sessions ps
		WHERE ` + strings.Join(q.where, " AND ") + `
		GROUP BY ps.status, ps.currency`, q.args
}

// stuckJoinsSQL finds the creation time of the oldest active session under f that is not old
// enough to be listed yet: it joins the list MinAge after it, with nothing written that would
// notify the page. The first entry of payment_sessions_stuck_by_age after the age line that
// matches the filter (an index-only scan; at most the active sessions younger than MinAge are
// passed over).
func stuckJoinsSQL(f StuckFilter, now time.Time) (string, []any) {
	q := newStuckQuery(f, now, false)
	return `SELECT min(ps.created_at) FROM payment_sessions ps WHERE ` + strings.Join(q.where, " AND "), q.args
}

// cursor is the After that continues a list after s.
func (f StuckFilter) cursor(s Session) string {
	if f.Sort == StuckByAmount {
		return s.Currency + "_" + strconv.FormatInt(s.Amount, 10) + "_" + s.ID
	}
	return timeCursor(s.CreatedAt, s.ID)
}

// cutCursor reads a keyset cursor "<number>_<uuid>" (the workbench's and the flagged lists').
func cutCursor(s string) (n int64, id string, ok bool) {
	key, id, ok := strings.Cut(s, "_")
	n, err := strconv.ParseInt(key, 10, 64)
	return n, id, ok && err == nil && validUUID(id)
}

// timeCursor is the cursor of a row by its time (microseconds, as PostgreSQL keeps it) and id.
func timeCursor(t time.Time, id string) string {
	return strconv.FormatInt(t.UnixMicro(), 10) + "_" + id
}

// cursorTimeInRange reports whether a cursor's microseconds are a time PostgreSQL can hold.
func cursorTimeInRange(n int64) bool { return n >= 0 && n <= maxCursorTime.UnixMicro() }

// extraRow scans the session's columns and then more (a row that extends sessionColumns).
type extraRow struct {
	pgx.Row
	extra []any
}

func (r extraRow) Scan(dest ...any) error { return r.Row.Scan(append(dest, r.extra...)...) }

// StuckSessions reads one page of the workbench and the totals of its filter, from one snapshot
// (readPage): the patrol settling a listed payment between the two reads showed a page listing
// three payments under totals that counted two (an outside review, numbers2).
func (s *Service) StuckSessions(ctx context.Context, f StuckFilter) (page StuckPage, err error) {
	err = s.readPage(ctx, "stuck sessions", func(q querier) error {
		page, err = s.stuckSessions(ctx, q, f)
		return err
	})
	return page, err
}

func (s *Service) stuckSessions(ctx context.Context, q querier, f StuckFilter) (StuckPage, error) {
	f, err := f.normalize()
	if err != nil {
		return StuckPage{}, err
	}
	now := s.cfg.Clock.Now()
	page := StuckPage{Filter: f, At: now}
	sql, args, err := stuckListSQL(f, now)
	if err != nil {
		return StuckPage{}, err
	}
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return StuckPage{}, fmt.Errorf("stuck sessions: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StuckSession, error) {
		var st StuckSession
		var callID *int64
		var call GatewayCall
		var op, outcome, detail, replica *string
		var httpStatus *int
		var at *time.Time
		sess, err := scanSession(extraRow{Row: r, extra: []any{&callID, &op, &outcome, &httpStatus, &detail, &replica, &at,
			&st.Mismatch, &st.ProposalID, &st.CheckingBy, &st.CheckingUntil}})
		if err != nil {
			return st, err
		}
		st.Session = sess
		if callID != nil {
			call.ID, call.Operation, call.Outcome, call.HTTPStatus, call.Detail, call.ReplicaID, call.At = *callID, *op, *outcome, *httpStatus, *detail, *replica, *at
			st.LastCall = &call
		}
		return st, nil
	})
	if err != nil {
		return StuckPage{}, fmt.Errorf("stuck sessions: %w", err)
	}
	page.Sessions = list
	if len(list) > f.Limit {
		page.Sessions = list[:f.Limit]
		page.Next = f.cursor(list[f.Limit-1].Session)
	}
	tsql, targs := stuckTotalsSQL(f, now)
	rows, err = q.Query(ctx, tsql, targs...)
	if err != nil {
		return StuckPage{}, fmt.Errorf("stuck totals: %w", err)
	}
	page.Totals, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (StuckTotal, error) {
		var t StuckTotal
		var st string
		err := r.Scan(&st, &t.Currency, &t.Count, &t.Amount)
		t.Status = Status(st)
		return t, err
	})
	if err != nil {
		return StuckPage{}, fmt.Errorf("stuck totals: %w", err)
	}
	slices.SortFunc(page.Totals, func(a, b StuckTotal) int {
		if c := strings.Compare(a.Currency, b.Currency); c != 0 {
			return c
		}
		return slices.Index(AllStatuses, a.Status) - slices.Index(AllStatuses, b.Status)
	})
	jsql, jargs := stuckJoinsSQL(f, now)
	var created *time.Time
	if err := q.QueryRow(ctx, jsql, jargs...).Scan(&created); err != nil {
		return StuckPage{}, fmt.Errorf("stuck sessions: the next to join: %w", err)
	}
	if created != nil {
		joins := created.Add(f.MinAge)
		page.Joins = &joins
	}
	return page, nil
}

// "Check now" from the workbench.
//
// Check itself is safe to run twice at once: the second apply waits for the order and session
// locks and finds the answer applied. But each Check asks the gateway first, so a double click
// on "Check selected" over fifty rows would be a hundred gateway calls, and two people working
// the same list would double every look. So CheckNow claims the sessions first, in PostgreSQL,
// and asks the gateway only about those it claimed: one look per session however many clicks,
// people or replicas ask at the same moment.
const (
	// MaxCheckNow bounds one "Check now" request (a workbench page is StuckPageSize rows).
	MaxCheckNow = 100
	// MinCheckNowClaimTTL is how long a claim holds while its checks run, at least: several
	// gateway timeouts and lock waits, so a check always ends within it; a replica that died
	// mid-way leaves a claim that simply expires. A long GATEWAY_TIMEOUT makes it longer
	// (Service.CheckNowClaimTTL).
	MinCheckNowClaimTTL = 2 * time.Minute
	// CheckNowCooldown is how long a finished check keeps its claim: a double click that arrives
	// just after the first click's checks ended is still one look.
	CheckNowCooldown = 10 * time.Second
	// checkNowParallel bounds the gateway calls one request makes at once.
	checkNowParallel = 4
)

// checkNowReserve is the longest one check may take once started: the gateway's status (a
// timeout), a lock wait, a stale answer asked again (a second timeout) and a third ask's
// margin, plus 10 s.
func (s *Service) checkNowReserve() time.Duration {
	return 3*s.cfg.GatewayTimeout + s.cfg.LockTimeout + 10*time.Second
}

// CheckNowClaimTTL is how long one "Check now" holds its claims: MinCheckNowClaimTTL, or twice
// the longest check when the gateway's timeout is long, so a check started while one still
// fits always ends inside the claim (with GATEWAY_TIMEOUT at a few minutes, a fixed two
// minutes left every session unasked, an outside review), and at least half the time is for
// starting checks.
func (s *Service) CheckNowClaimTTL() time.Duration {
	return max(MinCheckNowClaimTTL, 2*s.checkNowReserve())
}

// CheckNowResult is what "Check now" did with one session.
type CheckNowResult struct {
	SessionID string
	OrderID   string
	Before    Status
	After     Status
	// Checked: this request asked the gateway (Err says how that went).
	Checked bool
	// Skipped says why it was not asked about ("" when Checked).
	Skipped string
	Err     error
}

// CheckNow asks the gateway about each of the sessions (at most MaxCheckNow) and applies the
// answers through Check. A session someone else is checking (or checked within
// CheckNowCooldown) is skipped with who it is; a settled or unknown one too. Each check is
// audited as payment.check. The checks run on a context detached from the caller's: a claim
// promises one look, and a browser that dropped the request (the first half of a double click)
// must not waste it.
func (s *Service) CheckNow(ctx context.Context, by Staff, ids []string) ([]CheckNowResult, error) {
	ctx, span := s.startSpan(ctx, "payments.check_now", "", "")
	defer span.End()
	ids = uniqueIDs(ids)
	if len(ids) == 0 {
		return nil, Invalid("id", "select at least one payment to check")
	}
	if len(ids) > MaxCheckNow {
		return nil, Invalid("id", "check at most %d payments at once", MaxCheckNow)
	}
	// From the claim on, the work outlives the person's hang-up (each check is one look, its claim
	// ended as it ends), but not a cut with a cause of its own: a replica's stop ends the checks
	// in flight and starts no more, so the request answers before the server closes. Taken only
	// after the claims, a browser dropping the first POST of a double click between the claim's
	// commit and the read after it cut the read: nothing was asked, and the claims kept the second
	// click off for the cooldown (an outside review of bulk actions).
	ctx, unhang := unlessHungUp(ctx)
	defer unhang()
	now := s.cfg.Clock.Now()
	token := uuid.NewString()
	var valid []string
	for _, id := range ids {
		if validUUID(id) {
			valid = append(valid, id)
		}
	}
	claimed := map[string]bool{}
	mayHaveCommitted, err := s.inTxCommit(ctx, "check now: claim", func(tx pgx.Tx) error {
		// ON CONFLICT … DO UPDATE … WHERE: a live claim of another request is left alone (and not
		// returned); a concurrent claim of the same session waits for this transaction and then
		// finds the claim live. One statement decides, so no check-then-act gap exists.
		rows, err := tx.Query(ctx, `
			INSERT INTO finance_check_claims (session_id, token, claimed_by, claimed_at, until)
			SELECT id, $2, $3, $4, $5 FROM payment_sessions WHERE id = ANY($1::uuid[]) AND `+activeStatusSQL+`
			ON CONFLICT (session_id) DO UPDATE SET token = excluded.token, claimed_by = excluded.claimed_by,
				claimed_at = excluded.claimed_at, until = excluded.until
			WHERE finance_check_claims.until <= excluded.claimed_at
			RETURNING session_id::text`, valid, token, by.Email, now, now.Add(s.CheckNowClaimTTL()))
		if err != nil {
			return dbError("check now: claim", err, "")
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return dbError("check now: claim", err, "")
		}
		for _, id := range got {
			claimed[id] = true
		}
		if h := s.cfg.Hooks.AfterCheckNowClaim; h != nil {
			h(ctx, got)
		}
		return nil
	})
	if err != nil {
		if mayHaveCommitted {
			// The claims may have committed with the answer lost (a failover): tried again, every
			// payment was skipped "being checked" for the claim's time though nothing checked it
			// (an outside review, lost commits). Ended by this request's token, in the background.
			s.writeLater("check now claims", s.CheckNowClaimTTL(), "check now: release claims", `UPDATE finance_check_claims SET until = $3
				WHERE session_id = ANY($1::uuid[]) AND token = $2 AND until > $3`, valid, token, s.cfg.Clock.Now())
		}
		return nil, err
	}
	results, err := s.checkNowPlan(ctx, ids, valid, claimed, now)
	if err != nil {
		s.releaseCheckClaims(ctx, claimed, token)
		return nil, err
	}

	ttl := s.CheckNowClaimTTL()
	work, cancel := context.WithTimeout(ctx, ttl)
	defer cancel()
	// A check starts only while one more fits in the claim's time (checkNowReserve). With the gateway timing out, a full page's checks queue behind each other
	// four at a time, and the last ones would otherwise run out of time half-way (or after the
	// browser gave up). Those are left unasked, their claims released, and the summary says so.
	startBy := now.Add(ttl - s.checkNowReserve())
	g := new(errgroup.Group)
	g.SetLimit(checkNowParallel)
	for i := range results {
		r := &results[i]
		if !claimed[r.SessionID] {
			continue
		}
		g.Go(func() error {
			if work.Err() != nil && !errors.Is(context.Cause(work), context.DeadlineExceeded) {
				r.Skipped = "not asked: the request was cut (the service is stopping); check it again"
				s.endCheckClaim(work, r.SessionID, token, 0)
				return nil
			}
			if s.cfg.Clock.Now().After(startBy) {
				r.Skipped = "not asked: the gateway answered too slowly to check them all in one go; check it again"
				s.endCheckClaim(work, r.SessionID, token, 0)
				return nil
			}
			r.Checked = true
			// A panic here (an answer the code does not expect) would end the replica: this
			// goroutine is not the request's, which the server recovers. It is this payment's
			// refusal instead, as the patrol's drive counts it a look.
			var after Session
			var moved string
			err := s.panicAsError("check now", func() (err error) {
				after, moved, err = s.CheckAudited(work, by.Actor(), r.SessionID, r.Before)
				return err
			})
			r.After, r.Err = after.Status, err
			if r.After == "" {
				r.After = r.Before
			}
			detail := "check now: " + moved
			if err != nil {
				detail = "check now: refused: " + ErrorCode(err) + ": " + ErrorMessage(err)
			}
			if aerr := s.RecordAudit(work, AuditEntry{Actor: by.Email, Role: string(by.Role), Action: AuditPaymentCheck,
				Target: r.SessionID, Detail: detail}); aerr != nil {
				s.log.Error("check now: audit", "session", r.SessionID, "err", aerr)
			}
			s.releaseCheckClaim(work, r.SessionID, token)
			return nil
		})
	}
	_ = g.Wait() // every goroutine returns nil: each result carries its own error
	return results, nil
}

// checkNowPlan reads the sessions asked about and says, for those not claimed, why not.
func (s *Service) checkNowPlan(ctx context.Context, ids, valid []string, claimed map[string]bool, now time.Time) ([]CheckNowResult, error) {
	rows, err := s.db.Query(ctx, `SELECT ps.id::text, ps.order_id, ps.status, coalesce(cc.claimed_by, ''), cc.until
		FROM payment_sessions ps LEFT JOIN finance_check_claims cc ON cc.session_id = ps.id
		WHERE ps.id = ANY($1::uuid[])`, valid)
	if err != nil {
		return nil, fmt.Errorf("check now: read: %w", err)
	}
	type info struct {
		order, status, by string
		until             *time.Time
	}
	found := map[string]info{}
	for rows.Next() {
		var id string
		var in info
		if err := rows.Scan(&id, &in.order, &in.status, &in.by, &in.until); err != nil {
			rows.Close()
			return nil, fmt.Errorf("check now: read: %w", err)
		}
		found[id] = in
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("check now: read: %w", err)
	}
	out := make([]CheckNowResult, len(ids))
	for i, id := range ids {
		in, ok := found[id]
		r := CheckNowResult{SessionID: id, OrderID: in.order, Before: Status(in.status), After: Status(in.status)}
		switch {
		case !ok:
			r.Skipped = "no such payment"
		case claimed[id]:
		case !r.Before.Active():
			r.Skipped = "already " + in.status
		case in.until != nil && in.until.After(now):
			r.Skipped = "being checked by " + in.by + " (or checked just now)"
		default:
			// The claim lapsed between the claim statement and this read: let the next click ask.
			r.Skipped = "busy; try again"
		}
		out[i] = r
	}
	return out, nil
}

// releaseCheckClaim shortens this request's claim to the cooldown. The token guard leaves a
// claim that expired and was taken by someone else alone.
func (s *Service) releaseCheckClaim(ctx context.Context, id, token string) {
	s.endCheckClaim(ctx, id, token, CheckNowCooldown)
}

// endCheckClaim ends this request's claim of a session cooldown from now (0: at once, for a
// session it did not ask about).
func (s *Service) endCheckClaim(ctx context.Context, id, token string, cooldown time.Duration) {
	until := s.cfg.Clock.Now().Add(cooldown)
	if _, err := s.execDetached(ctx, `UPDATE finance_check_claims SET until = $3
		WHERE session_id = $1 AND token = $2 AND until > $3`, id, token, until); err != nil {
		s.log.Error("check now: release claim", "session", id, "err", err)
	}
}

func (s *Service) releaseCheckClaims(ctx context.Context, claimed map[string]bool, token string) {
	for id := range claimed {
		s.releaseCheckClaim(ctx, id, token)
	}
}

// uniqueIDs trims, lower-cases and de-duplicates ids, keeping their order.
func uniqueIDs(ids []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, id := range ids {
		id = strings.ToLower(strings.TrimSpace(id))
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, id)
	}
	return out
}
