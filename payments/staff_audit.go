package payments

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Audit actions: what a staff member (or the command line) did. The audit log is append-only.
const (
	AuditLogin              = "auth.login"
	AuditLoginFailed        = "auth.login_failed"
	AuditLogout             = "auth.logout"
	AuditUserCreate         = "user.create"
	AuditUserDisable        = "user.disable"
	AuditUserEnable         = "user.enable"
	AuditUserRole           = "user.role"
	AuditUserPassword       = "user.password"
	AuditUserSessions       = "user.sessions_end"
	AuditAuditExport        = "audit.export"
	AuditPaymentCreate      = "payment.create"
	AuditPaymentCheck       = "payment.check"
	AuditCancelRequest      = "payment.cancel_request"
	AuditCancelConfirm      = "payment.cancel_confirm"
	AuditCaseResolve        = "case.resolve"
	AuditFlagRetry          = "session.retry_now"
	AuditRefundRetry        = "refund.retry_now"
	AuditEventsWebhookRetry = "events_webhook.retry_now"
	AuditCodesUnlock        = "payment.codes_unlock"
	AuditAPIKeyCreate       = "apikey.create"
	AuditAPIKeyRevoke       = "apikey.revoke"
	AuditAPIKeyRotate       = "apikey.rotate"
)

// Staff is who did something in the console, for the audit log and the timeline (package
// access owns users and roles; the core only records who acted).
type Staff struct {
	Email string
	Role  string
}

// Actor is the staff user as the core's actor.
func (s Staff) Actor() Actor { return Actor{Kind: ActorStaff, ID: s.Email, Role: s.Role} }

// auditStaff writes the audit entry of a staff member's money-moving action (a cancel confirmed,
// a refund claimed) in the transaction that does it: the action and its entry commit together,
// and a crash after the commit cannot leave money moved by a person with no audit entry. Other
// actors (API clients, the patrol, webhooks) are recorded by the timeline and write nothing here.
// The console then audits only what the core did not: refusals, replays, requests for codes.
func auditStaff(ctx context.Context, tx pgx.Tx, actor Actor, action, target, detail string, now time.Time) error {
	if actor.Kind != ActorStaff {
		return nil
	}
	return recordAudit(ctx, tx, AuditEntry{Actor: actor.ID, Role: actor.Role, Action: action, Target: target, Detail: detail}, now)
}

// AuditEntry is one row of the audit log.
type AuditEntry struct {
	ID     int64
	At     time.Time
	Actor  string // staff email, or "cli:<os user>"
	Role   string
	Action string
	Target string // a payment id, "case:12", an email, …
	Detail string
}

// RecordAudit appends one entry, in its own statement: what the console records of an action
// that moved no money (a Check, a code request, a refusal, a replay), after the core's own
// transaction, with the outcome; a crash between the two loses that entry, never an action.
// Money-moving staff actions (a cancel confirmed, a refund claimed) are written by the core in
// the action's transaction (auditStaff), as are the console's own actions (resolve a case, retry
// a flagged session, the four-eyes steps).
//
// The entry outlives its request (a client gone, a request cut at its bound) by RecordGrace at
// most: a database that does not answer held the request's answer for as long as it did.
func (s *Service) RecordAudit(ctx context.Context, e AuditEntry) error {
	ctx, cancel := Outlive(ctx, RecordGrace)
	defer cancel()
	return recordAudit(ctx, s.db, e, s.cfg.Clock.Now())
}

// IdleInTransaction is how long the server lets a transaction of pitlane wait for its
// client's next statement (SET LOCAL idle_in_transaction_session_timeout) before it ends the
// session: a replica's host lost between two statements of a transaction (no FIN, no RST) left
// its backend idle in transaction, holding the order's and the session's row locks and the
// events feed's horizon, until the server's TCP keepalive gave up — two hours by default (an
// outside review). No transaction of pitlane spans a gateway call or any other wait: its
// statements follow one another as fast as the replica can send them.
const IdleInTransaction = 15 * time.Second

// SetIdleInTransaction is the statement that bounds a transaction's idle time to d on the server.
func SetIdleInTransaction(d time.Duration) string {
	return fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = '%dms'", d.Milliseconds())
}

// RecordGrace is how long a request's records (its audit entry, its outcome once the gateway has
// spoken, its idempotency key's last write) may still be written once the request ended: a few
// seconds are the pool's wait under load; longer is a database that does not answer.
const RecordGrace = 3 * time.Second

// Execer is what AppendAudit writes through: a pool or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// AppendAudit appends one entry through q, so that a package beside the core (access: user
// changes) writes its entry in the same transaction as the change it records.
func AppendAudit(ctx context.Context, q Execer, e AuditEntry, at time.Time) error {
	return recordAudit(ctx, q, e, at)
}

func recordAudit(ctx context.Context, q Execer, e AuditEntry, now time.Time) error {
	if _, err := q.Exec(ctx, `INSERT INTO audit_log (at, actor, role, action, target, detail) VALUES ($1, $2, $3, $4, $5, $6)`,
		now, e.Actor, e.Role, e.Action, e.Target, e.Detail); err != nil {
		return fmt.Errorf("audit %s: %w", e.Action, err)
	}
	return nil
}

// AuditFilter narrows AuditLog. Zero values: everything, newest first, 200 rows.
type AuditFilter struct {
	Target string
	Actor  string
	Limit  int
}

// Query is the filter as a URL query (actor, target; the empty ones left out): the audit page's
// links and the export's audit entry.
func (f AuditFilter) Query() string {
	q := url.Values{}
	if f.Actor != "" {
		q.Set("actor", f.Actor)
	}
	if f.Target != "" {
		q.Set("target", f.Target)
	}
	return q.Encode()
}

// ExportAudit hands fn every entry under f (its Limit ignored), oldest first, read ExportBatch at
// a time by id (as ExportLedger: no connection held while fn runs), and returns how many it
// handed over. Only the filters given are in the statement (AuditLog's rule), so each batch is
// a range of the primary key or of the filter's index.
func (s *Service) ExportAudit(ctx context.Context, f AuditFilter, fn func(AuditEntry) error) (int, error) {
	where, args := "id > $1", []any{int64(0)}
	for _, c := range []struct{ col, v string }{{"target", f.Target}, {"actor", f.Actor}} {
		if c.v != "" {
			args = append(args, c.v)
			where += fmt.Sprintf(" AND %s = $%d", c.col, len(args))
		}
	}
	return exportInBatches(func(after *AuditEntry) ([]AuditEntry, error) {
		if after != nil {
			args[0] = after.ID
		}
		rows, err := s.db.Query(ctx, `SELECT id, at, actor, role, action, target, detail FROM audit_log
			WHERE `+where+` ORDER BY id LIMIT `+strconv.Itoa(ExportBatch), args...)
		if err != nil {
			return nil, fmt.Errorf("export audit log: %w", err)
		}
		batch, err := pgx.CollectRows(rows, scanAuditEntry)
		if err != nil {
			return nil, fmt.Errorf("export audit log: %w", err)
		}
		return batch, nil
	}, fn)
}

// scanAuditEntry reads a row of audit_log's id, at, actor, role, action, target, detail.
func scanAuditEntry(r pgx.CollectableRow) (AuditEntry, error) {
	var e AuditEntry
	err := r.Scan(&e.ID, &e.At, &e.Actor, &e.Role, &e.Action, &e.Target, &e.Detail)
	return e, err
}

// AuditLog returns entries newest first.
func (s *Service) AuditLog(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 200
	}
	// Only the filters given, each its own statement: "($1 = '' OR target = $1)" would leave a
	// prepared statement's generic plan walking the whole log (TestPaymentPageReadsByIndexes).
	where, args := "true", []any{}
	for _, c := range []struct{ col, v string }{{"target", f.Target}, {"actor", f.Actor}} {
		if c.v != "" {
			args = append(args, c.v)
			where += fmt.Sprintf(" AND %s = $%d", c.col, len(args))
		}
	}
	// Planned with its values every time (an unnamed statement, never a cached generic plan):
	// for an actor of average share the generic plan walks the log's primary key filtering on
	// it — the cheapest guess for an average actor, the whole log for one with a single entry
	// (997 ms at 500 000 rows; an outside review of plans at scale).
	rows, err := s.db.Query(ctx, `SELECT id, at, actor, role, action, target, detail FROM audit_log
		WHERE `+where+` ORDER BY id DESC LIMIT `+strconv.Itoa(f.Limit), append([]any{pgx.QueryExecModeExec}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanAuditEntry)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return out, nil
}

// CheckAudited is Check asked by a person, with what its audit entry says of it: the transition
// this check applied ("Registered → Completed"), or, when it applied none, what it found — the
// payment as read before (before) and as it is now, a change between them "applied meanwhile by
// another path" (the patrol, a webhook, another check: an outside review, the audit credited a
// finance user with someone else's change). The check's own transition is what its applies
// committed (movedByCall), not read back from the timeline by actor: two checks of one person
// (two tabs) both claimed the one transition the other had applied (an outside review). A
// refusal is its error's words.
func (s *Service) CheckAudited(ctx context.Context, actor Actor, id string, before Status) (Session, string, error) {
	moved := &movedByCall{}
	sess, err := s.Check(context.WithValue(ctx, movedCtxKey{}, moved), actor, id)
	if err != nil {
		return sess, AuditOutcome(err), err
	}
	switch {
	case moved.to != "":
		return sess, string(moved.from) + " → " + string(moved.to), nil
	case sess.Status != before:
		return sess, string(before) + " → " + string(sess.Status) + " (applied meanwhile by another path, not by this check)", nil
	}
	return sess, string(before) + " → " + string(sess.Status), nil
}

// AuditOutcome is how a staff action's audit entry names its error: "refused: " and the
// refusal, or, for a database that failed under it (its connection lost, an internal error not
// the gateway's), "outcome unknown":
// its COMMIT may have gone through with the answer lost, and an entry saying "refused" beside the
// action's own "claimed" told finance a refund that was made had not been (an outside review,
// lost commits).
func AuditOutcome(err error) string {
	var ge *GatewayError
	if DatabaseUnavailable(err) || ErrorCode(err) == EINTERNAL && !errors.As(err, &ge) {
		return "outcome unknown (it may have happened: see the payment's page): " + ErrorCode(err) + ": " + ErrorMessage(err)
	}
	// A gateway that did not answer, a lock wait given up: nothing was applied (a review: a
	// Check with the gateway down was audited "it may have happened").
	return "refused: " + ErrorCode(err) + ": " + ErrorMessage(err)
}
