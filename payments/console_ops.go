package payments

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lease is a session leased to one replica's patrol (sweeper.go).
type Lease struct {
	SessionID     string
	OrderID       string
	Status        Status
	Owner         string
	Until         time.Time
	CheckAttempts int
}

// Expired reports whether the lease ran out at now: its replica died or is late, and any
// patrol may take the session over.
func (l Lease) Expired(now time.Time) bool { return !l.Until.After(now) }

// Leases lists the sessions that carry a patrol lease (expired ones too, until released),
// soonest expiry first.
func (s *Service) Leases(ctx context.Context) ([]Lease, error) {
	// Among the active sessions (activeStatusSQL: the partial indexes over them), not the whole
	// table: a lease matters only while its session can still be driven, and lease columns stay
	// unindexed so a claim is a heap-only update (migration 00020).
	rows, err := s.db.Query(ctx, `SELECT id::text, order_id, status, lease_owner, lease_until, check_attempts
		FROM payment_sessions WHERE `+activeStatusSQL+` AND lease_owner IS NOT NULL AND lease_until IS NOT NULL
		ORDER BY lease_until, payment_sessions.id LIMIT 500`)
	if err != nil {
		return nil, fmt.Errorf("leases: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Lease, error) {
		var l Lease
		var st string
		err := r.Scan(&l.SessionID, &l.OrderID, &st, &l.Owner, &l.Until, &l.CheckAttempts)
		l.Status = Status(st)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("leases: %w", err)
	}
	return out, nil
}

// AdvisoryLock is one advisory lock held or awaited right now in this database, decoded.
type AdvisoryLock struct {
	PID int
	// Namespace and Key are the two int4 keys of pg_advisory_xact_lock(namespace, key); for the
	// one-bigint form (objsubid 1) Namespace is 0 and Key64 holds the key.
	Namespace     LockNamespace
	NamespaceName string // from LockNamespaceNames; "" when unknown to this binary
	Key           int32
	Key64         int64
	TwoKeys       bool
	// Match is what the key was computed from, when the console can tell: the order id behind
	// a create-order lock (hashtext collisions are possible; it is a hint).
	Match       string
	Granted     bool
	Mode        string
	WaitStart   *time.Time
	XactStart   *time.Time
	State       string
	Application string
	Query       string
	BlockedBy   []int32
}

// withoutLiterals is a statement's text with what its string literals and comments hold
// replaced by "…": '…', E'…' (backslash escapes), $tag$…$tag$, -- … and /* … */ (nested; one
// cut off at the end of the text too); a "quoted identifier" is a name and stays. The locks page shows every role what a lock's backend runs;
// under the simple protocol (a DATABASE_URL with default_query_exec_mode=simple_protocol) pgx
// writes the arguments into the text, and a code request holding its contact lock ran an
// INSERT whose text held the customer's contact and the one-time code (an outside review,
// privacy); an operator's psql session holding a lock may quote anything in any of these forms.
func withoutLiterals(q string) string {
	var b strings.Builder
	for i := 0; i < len(q); {
		c := q[i]
		switch {
		case c == '\'' || ((c == 'E' || c == 'e') && i+1 < len(q) && q[i+1] == '\'' && (i == 0 || !identChar(q[i-1]))):
			escapes := c != '\''
			if escapes {
				b.WriteByte(c)
				i++
			}
			j := i + 1
			for j < len(q) {
				if escapes && q[j] == '\\' {
					j += 2
					continue
				}
				if q[j] == '\'' {
					if j+1 < len(q) && q[j+1] == '\'' {
						j += 2
						continue
					}
					if k := quoteContinues(q, j+1); k > 0 {
						j = k + 1 // 'a'<newline>'b' is one literal, in the same (escape) mode
						continue
					}
					break
				}
				j++
			}
			b.WriteString("'…'")
			i = j + 1
		case c == '$' && (i == 0 || !identChar(q[i-1])):
			tag := dollarTag(q[i:])
			if tag == "" {
				b.WriteByte(c)
				i++
				continue
			}
			b.WriteString(tag + "…" + tag)
			if end := strings.Index(q[i+len(tag):], tag); end >= 0 {
				i += len(tag) + end + len(tag)
			} else {
				i = len(q)
			}
		case c == '-' && strings.HasPrefix(q[i:], "--"):
			b.WriteString("--…")
			if end := strings.IndexByte(q[i:], '\n'); end >= 0 {
				i += end
			} else {
				i = len(q)
			}
		case c == '"':
			// A quoted identifier is a name, shown as it is; a ' or $$ inside it starts nothing.
			j := i + 1
			for j < len(q) {
				if q[j] == '"' {
					if j+1 < len(q) && q[j+1] == '"' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			j = min(j+1, len(q))
			b.WriteString(q[i:j])
			i = j
		case c == '/' && strings.HasPrefix(q[i:], "/*"):
			// Comments nest in PostgreSQL: /* a /* b */ c */ is one.
			b.WriteString("/*…*/")
			depth, j := 1, i+2
			for j < len(q) && depth > 0 {
				switch {
				case strings.HasPrefix(q[j:], "/*"):
					depth++
					j += 2
				case strings.HasPrefix(q[j:], "*/"):
					depth--
					j += 2
				default:
					j++
				}
			}
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

// quoteContinues is the index of the quote that continues a literal closed just before i
// (white space holding a newline, -- comments allowed, then '), 0 when none: PostgreSQL joins
// 'a'<newline>'b' into one literal, and a continued E'…' keeps its backslash escapes, so
// E'a'<newline>'\' code' is one value (a review of this scanner).
func quoteContinues(q string, i int) int {
	nl := false
	for i < len(q) {
		switch {
		case q[i] == '\n' || q[i] == '\r':
			nl = true
			i++
		case q[i] == ' ' || q[i] == '\t' || q[i] == '\f' || q[i] == '\v':
			i++
		case strings.HasPrefix(q[i:], "--"):
			for i < len(q) && q[i] != '\n' && q[i] != '\r' {
				i++
			}
		case q[i] == '\'' && nl:
			return i
		default:
			return 0
		}
	}
	return 0
}

// dollarTag is the $tag$ (or $$) s starts with, "" when s starts with none (a parameter $1).
func dollarTag(s string) string {
	for j := 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '$':
			return s[:j+1]
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80 || (j > 1 && c >= '0' && c <= '9'):
		default:
			return ""
		}
	}
	return ""
}

// identChar reports whether c may be part of an SQL identifier (so E' or $ after it starts no
// literal: "name$1", "somE'…" is not an escape string's start).
func identChar(c byte) bool {
	return c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

// AdvisoryLocks decodes pg_locks joined with pg_stat_activity: which backend holds or waits for
// which advisory lock, since when, doing what, and who blocks the waiters. pg_locks stores the
// two int4 keys in classid and objid as oid (unsigned); they are turned back into int4 here.
func (s *Service) AdvisoryLocks(ctx context.Context) ([]AdvisoryLock, error) {
	rows, err := s.db.Query(ctx, `
		WITH l AS (
			SELECT pid, objsubid, granted, mode, waitstart,
				classid::bigint AS c, objid::bigint AS o
			FROM pg_locks
			WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		), d AS (
			SELECT l.*,
				(CASE WHEN c >= 2147483648 THEN c - 4294967296 ELSE c END)::int4 AS ns,
				(CASE WHEN o >= 2147483648 THEN o - 4294967296 ELSE o END)::int4 AS k
			FROM l
		)
		SELECT d.pid, d.objsubid = 2, d.ns, d.k, (d.c << 32) | d.o, d.granted, d.mode, d.waitstart,
			a.xact_start, coalesce(a.state, ''), coalesce(a.application_name, ''), coalesce(left(a.query, 300), ''),
			pg_blocking_pids(d.pid),
			coalesce(CASE WHEN d.objsubid = 2 AND d.ns = $1 THEN
				(SELECT min(o.order_id) FROM orders o WHERE hashtext(o.order_id) = d.k) END, '')
		FROM d LEFT JOIN pg_stat_activity a ON a.pid = d.pid
		ORDER BY d.granted DESC, a.xact_start NULLS LAST, d.pid, d.ns, d.k`, int32(LockCreateOrder))
	if err != nil {
		return nil, fmt.Errorf("advisory locks: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AdvisoryLock, error) {
		var l AdvisoryLock
		var ns int32
		err := r.Scan(&l.PID, &l.TwoKeys, &ns, &l.Key, &l.Key64, &l.Granted, &l.Mode, &l.WaitStart, &l.XactStart,
			&l.State, &l.Application, &l.Query, &l.BlockedBy, &l.Match)
		l.Query = withoutLiterals(l.Query)
		if l.TwoKeys {
			l.Namespace = LockNamespace(ns)
			l.NamespaceName = LockNamespaceNames[l.Namespace]
		}
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("advisory locks: %w", err)
	}
	return out, nil
}

// OutboxMessage is one message to a customer. Body may hold a one-time cancel code: only admins
// may see it.
type OutboxMessage struct {
	ID          int64
	Kind        string
	To          string
	Body        string
	OrderID     string
	PaymentID   string
	CreatedAt   time.Time
	DeliveredAt *time.Time
	Attempts    int
	LastError   string // or why the retry did not send it ("not sent again: the code was superseded"; "not sent:" when no try had failed)
}

// Outbox returns the newest messages, optionally of one payment, as viewer sees them: a message
// not delivered yet still holds its one-time code, and viewer is recorded, in the same
// statement, as having seen the code (cancel_challenges.seen_by): they may not confirm it
// (tryCode).
func (s *Service) Outbox(ctx context.Context, viewer Staff, paymentID string) ([]OutboxMessage, error) {
	var pid any
	only := `$1::uuid IS NULL` // every message; one statement per filter, so a generic plan cannot read them all for one payment
	if paymentID != "" {
		if !validUUID(paymentID) {
			return nil, Invalid("payment", "not a payment id")
		}
		pid, only = paymentID, `payment_id = $1::uuid` // outbox_payment (00870)
	}
	rows, err := s.db.Query(ctx, `WITH shown AS (
			SELECT id, kind, to_addr, body, coalesce(order_id, '') AS order_id, coalesce(payment_id::text, '') AS payment_id,
			created_at, delivered_at, attempts, coalesce(CASE WHEN attempts > 0 AND skip_reason <> 'redacted' THEN 'not sent again: the code was ' ELSE 'not sent: the code was ' END || CASE skip_reason WHEN 'spent' THEN 'out of attempts' WHEN 'finished' THEN 'for a payment that had finished' WHEN 'no_room' THEN 'for a refund the payment no longer had room for' WHEN 'redacted' THEN 'withdrawn while it could not be used (it may not have reached the customer)' ELSE skip_reason END,
				last_error, '') AS note, challenge_id
			FROM outbox WHERE `+only+` ORDER BY id DESC LIMIT 200),
		seen AS (
			-- The reader's password setters as they are now: a reset later does not make the one
			-- who could have been the reader someone else (migration 00630).
			UPDATE cancel_challenges SET seen_by = array_append(seen_by, $2),
				seen_by_setters = seen_by_setters || password_setters($2)
			WHERE id IN (SELECT challenge_id FROM shown WHERE delivered_at IS NULL AND challenge_id IS NOT NULL)
			AND NOT ($2 = ANY(seen_by)))
		SELECT id, kind, to_addr, body, order_id, payment_id, created_at, delivered_at, attempts, note FROM shown ORDER BY id DESC`, pid, viewer.Email)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxMessage, error) {
		var m OutboxMessage
		err := r.Scan(&m.ID, &m.Kind, &m.To, &m.Body, &m.OrderID, &m.PaymentID, &m.CreatedAt, &m.DeliveredAt, &m.Attempts, &m.LastError)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return out, nil
}
