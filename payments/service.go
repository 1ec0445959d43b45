// Package payments is pitlane's locking core: payment sessions and their one transition
// function, Create (Claim + Register), Check, Cancel with one-time codes, the sweeper, the
// ledger and finance cases. Its SQL lives here because the locking protocol IS the domain.
//
// Rules every entry point follows:
//   - Lock order: order row → session row → finance rows (ledger, cases). Deadlocks are bugs.
//   - No transaction is open while the gateway is called; gateway calls happen before (Check)
//     or after (Create, Cancel) a short transaction.
//   - Every status change is a guarded UPDATE … WHERE status = ANY(allowed) RETURNING that must
//     touch exactly one row, with a timeline event in the same transaction.
//   - READ COMMITTED everywhere; correctness comes from row locks and guards, not isolation level.
package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"pitlane/payments/dbconn"
)

// ActorKind says who caused a change (timeline, audit).
type ActorKind string

const (
	ActorCustomer ActorKind = "customer"
	ActorAPI      ActorKind = "api"
	ActorStaff    ActorKind = "staff"
	ActorSweeper  ActorKind = "sweeper"
	ActorWebhook  ActorKind = "webhook"
	ActorSystem   ActorKind = "system"
)

// Actor is who asked: a kind and an id (API client id, staff email, replica id, event id).
type Actor struct {
	Kind ActorKind
	ID   string
	// Role is a staff actor's role (Staff.Actor), for the audit entry the core writes with a
	// staff member's money-moving action (auditStaff); "" for every other kind.
	Role string
}

// Session is one payment session.
type Session struct {
	ID               string
	OrderID          string
	Amount           int64
	Currency         string
	Status           Status
	Gateway          string
	GatewayPaymentID string
	ConfirmationURL  string
	CustomerContact  string
	NextCheckAt      *time.Time
	CheckAttempts    int
	LeaseOwner       string
	LeaseUntil       *time.Time
	FlaggedAt        *time.Time
	FlagReason       string
	CreatedAt        time.Time
	UpdatedAt        time.Time
}

// Reference is what the gateway stores as our reference for this session.
func (s Session) Reference() string { return s.ID }

// Hooks let tests stop the core at precise points to build interleavings on purpose. Each hook
// runs synchronously; a nil hook does nothing. Never set in production.
type Hooks struct {
	// AfterClaimRead runs inside Create's claim transaction, after the active session was read
	// and before the decision is written (the advisory lock is held).
	AfterClaimRead func(ctx context.Context, orderID string)
	// AfterGatewayStatus runs in Check after the gateway answered and before the apply
	// transaction begins.
	AfterGatewayStatus func(ctx context.Context, sessionID string, gp GatewayPayment)
	// AfterApplyLock runs inside the apply transaction once the order and session rows are locked.
	AfterApplyLock func(ctx context.Context, sessionID string)
	// BeforeRegister runs in Create after the claim committed and before the gateway is called.
	BeforeRegister func(ctx context.Context, sessionID string)
	// AfterCancelLock runs inside ConfirmCancel once the order and session rows are locked.
	AfterCancelLock func(ctx context.Context, sessionID string)
	// AfterCancelCommit runs in ConfirmCancel after the cancel committed (Canceling) and before
	// the reverse is sent.
	AfterCancelCommit func(ctx context.Context, sessionID string)
	// AfterUpkeep runs in RunSweeper's upkeep loop after each pass (housekeeping when due, the
	// Operations sample of the minute), before it waits for the next.
	AfterUpkeep func(ctx context.Context)
	// AfterSweepClaim runs after a sweeper committed its claim of due sessions.
	AfterSweepClaim func(ctx context.Context, ids []string)
	// AfterCheckNowClaim runs inside CheckNow's claim transaction, after the claim statement and
	// before the commit, with the sessions it claimed.
	AfterCheckNowClaim func(ctx context.Context, ids []string)
	// AfterResolutionLock runs inside ApproveResolution once the order and session rows are locked.
	AfterResolutionLock func(ctx context.Context, sessionID string)
	// AfterRefundLock runs inside a refund's claim (the API's CreateRefund, the console's
	// RefundByFinance and ConfirmRefund) once the order and session rows are locked.
	AfterRefundLock func(ctx context.Context, sessionID string)
	// BeforeLateHold runs before a late first send's hold (holdLateSend) of the row id: a
	// Create's session, a refund.
	BeforeLateHold func(ctx context.Context, id string)
	// AfterEventsPageRead runs in a round of the events webhook after it took the row and read
	// the page, before it POSTs.
	AfterEventsPageRead func(ctx context.Context)
	// AfterIntentAcquire runs in CheckoutPay after its acquire transaction committed and before
	// its Create, with the click's key.
	AfterIntentAcquire func(ctx context.Context, key string)
	// AfterHoldLetGo runs when a hold let go of in the background after its last write failed
	// (letGoLater: a click's intent, Check now's claims) is done: err nil once written.
	AfterHoldLetGo func(what string, err error)
}

// Config configures a Service. Zero values get safe defaults (see NewService).
type Config struct {
	Gateway  Gateway
	Clock    Clock
	Notifier Notifier // optional: besides the outbox, deliver customer messages here
	Logger   *slog.Logger
	// ReplicaID names this replica in leases and gateway call logs.
	ReplicaID string
	// LockTimeout bounds every lock wait (SET LOCAL lock_timeout).
	LockTimeout time.Duration
	// SideLoopEvery (default 10 s) is the longest RunSweeper's side loops — upkeep (reapers,
	// dead codes' redaction, the Operations samples), reconciliation, the events webhook — wait
	// between looks: SWEEP_INTERVAL paces them only when it is shorter. Their own cadences
	// (HousekeepingEvery, OpsSampleEvery, ReconcileEvery) are minutes, and a SWEEP_INTERVAL of an
	// hour (allowed) held them to an hour (an outside review).
	SideLoopEvery time.Duration
	// IdleInTransactionTimeout (default IdleInTransaction) bounds, on the server, how long one
	// of the core's transactions may wait for its client's next statement (SET LOCAL
	// idle_in_transaction_session_timeout).
	IdleInTransactionTimeout time.Duration
	// CodeSecret keys the HMAC that one-time codes are stored as (and, derived, checkout links).
	CodeSecret []byte
	// CodeSecretFallbacks (SECRET_KEY_FALLBACKS) still verify one-time codes and checkout links
	// made under them, and sign nothing: SECRET_KEY rotates without breaking what is in flight.
	CodeSecretFallbacks [][]byte
	// ReturnURL builds the URL the gateway sends the customer back to after paying.
	ReturnURL func(s Session) string
	// PublicBaseURL (PUBLIC_BASE_URL, no trailing slash) makes signed checkout links absolute
	// (CheckoutURL); unset, they are paths.
	PublicBaseURL string
	// GatewayURL (GATEWAY_URL) is the configured gateway's base URL: a confirmation_url on its
	// own origin is trusted even over plain http (dev's simulator); any other must be https.
	GatewayURL string
	// ConfirmationHosts (GATEWAY_CONFIRMATION_HOSTS) narrows "any https URL": when set, an https
	// confirmation_url must be on one of these hosts (lower case; "*.example.com" is any
	// subdomain of example.com, not example.com itself). The gateway's own origin stays trusted.
	ConfirmationHosts []string
	// RefundDirectLimit (REFUND_DIRECT_LIMIT) is, per currency in minor units, how much of a
	// payment finance may refund without a second person; a currency not listed: nothing.
	RefundDirectLimit map[string]int64
	// EventsWebhook (EVENTS_WEBHOOK_URL, EVENTS_WEBHOOK_SECRET) POSTs the events feed to the shop
	// (feed_push.go); a zero value: off.
	EventsWebhook EventsWebhook
	// CodeRequestsPerContact (CODE_REQUESTS_PER_CONTACT_PER_HOUR) bounds the one-time codes
	// sent to one customer contact within an hour, across all its payments; 0: no bound beyond
	// each payment's CodeRequestsPerHour (the contract's).
	CodeRequestsPerContact int
	// CodeTTL and CodeAttempts bound one-time codes (default 10 min, 5).
	CodeTTL      time.Duration
	CodeAttempts int
	// GatewayTimeout is the per-call timeout of the gateway adapter (GATEWAY_TIMEOUT, default
	// 10s). The patrol's lease and every "may still be in flight" grace derive from it.
	GatewayTimeout time.Duration
	// SweepConcurrency is how many drives one replica's patrol runs at once (SWEEP_CONCURRENCY,
	// default 16): the size of its worker pool and so the fetch limit of its claims (patrol.go).
	SweepConcurrency int
	// SettleBatch is the most patrol answers one settle transaction writes (settle_batch.go;
	// default SweepConcurrency). 1: every answer in a transaction of its own.
	SettleBatch int
	// ReconcileBatch is how many sessions the patrol's reconciliation compares per run, one run
	// a minute (RECONCILE_BATCH; default DefaultReconcileConfig.Batch).
	ReconcileBatch int
	// LeaseDuration is how long a claim holds a session, refund or message (default
	// LeaseFor(GatewayTimeout): several gateway timeouts, so one drive always fits).
	LeaseDuration time.Duration
	// Backoff is the schedule of looks (sweeper.go); refunds follow it too.
	Backoff []time.Duration
	// RegisterGrace is how long work that called the gateway may still be in flight: the
	// sweeper leaves a Registering session (and the patrol a fresh Pending refund) alone this
	// long after its claim, so neither races the request still doing it. Default
	// StaleAfterFor(GatewayTimeout).
	RegisterGrace time.Duration
	// Version names the running build in the patrol's heartbeat (default: from the build info).
	Version string
	Hooks   Hooks
	// TracerProvider makes the spans of core operations (tracing.go). Nil: the global provider.
	TracerProvider trace.TracerProvider
}

// Service is the locking core. It is safe for concurrent use; all coordination between
// goroutines and replicas happens in PostgreSQL.
type Service struct {
	db     *pgxpool.Pool
	gw     Gateway
	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer
	// patrol is this replica's patrol: its back-off and what it drives right now (bounded by
	// SweepConcurrency). Coordination with other replicas happens in PostgreSQL (leases).
	patrol *patrolState
	// settles batches the patrol's answers into shared transactions (nil: SettleBatch 1).
	settles *settleBatcher
	// eventsWebhookFenced: this replica's EVENTS_WEBHOOK_URL is not the one the events webhook
	// delivers to, as its last round found (said once in the log, when it begins).
	eventsWebhookFenced atomic.Bool
	// lettingGo is room for the holds being let go of in the background (letGoLater, maxLetGo).
	lettingGo chan struct{}
}

// NewService builds the core over a pool and a gateway.
func NewService(db *pgxpool.Pool, cfg Config) *Service {
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 5 * time.Second
	}
	if cfg.SideLoopEvery == 0 {
		cfg.SideLoopEvery = 10 * time.Second
	}
	if cfg.IdleInTransactionTimeout == 0 {
		cfg.IdleInTransactionTimeout = IdleInTransaction
	}
	if cfg.ReturnURL == nil {
		cfg.ReturnURL = func(Session) string { return "" }
	}
	if cfg.CodeTTL == 0 {
		cfg.CodeTTL = 10 * time.Minute
	}
	if cfg.CodeAttempts == 0 {
		cfg.CodeAttempts = 5
	}
	if cfg.GatewayTimeout <= 0 {
		cfg.GatewayTimeout = defaultGatewayTimeout
	}
	if cfg.SweepConcurrency <= 0 {
		cfg.SweepConcurrency = DefaultSweepConcurrency
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = LeaseFor(cfg.GatewayTimeout)
	}
	if len(cfg.Backoff) == 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.RegisterGrace <= 0 {
		cfg.RegisterGrace = StaleAfterFor(cfg.GatewayTimeout)
	}
	if cfg.Version == "" {
		cfg.Version = buildVersion()
	}
	if len(cfg.CodeSecret) == 0 {
		// A service without a configured secret still hashes codes; they just do not survive
		// a restart with a different process. config requires SECRET_KEY in serve.
		cfg.CodeSecret = []byte("pitlane-unset-secret")
	}
	if cfg.SettleBatch <= 0 {
		cfg.SettleBatch = cfg.SweepConcurrency
	}
	s := &Service{db: db, gw: Readable(cfg.Gateway), cfg: cfg, log: cfg.Logger, tracer: newTracer(cfg.TracerProvider),
		patrol: newPatrolState(cfg.Clock), lettingGo: make(chan struct{}, maxLetGo)}
	if cfg.SettleBatch > 1 {
		s.settles = &settleBatcher{s: s, max: cfg.SettleBatch}
	}
	return s
}

// DB exposes the pool for read models (console) that live beside the core.
func (s *Service) DB() *pgxpool.Pool { return s.db }

// Gateway returns the gateway the service talks to.
func (s *Service) Gateway() Gateway { return s.gw }

// Now is the service clock's time.
func (s *Service) Now() time.Time { return s.cfg.Clock.Now() }

const sessionColumns = `id::text, order_id, amount, currency, status, gateway,
	coalesce(gateway_payment_id, ''), coalesce(confirmation_url, ''), coalesce(customer_contact, ''),
	next_check_at, check_attempts, coalesce(lease_owner, ''), lease_until, flagged_at,
	coalesce(flag_reason, ''), created_at, updated_at`

func scanSession(row pgx.Row) (Session, error) {
	var s Session
	var st string
	err := sessionScans.scan(row, []any{&s.ID, &s.OrderID, &s.Amount, &s.Currency, &st, &s.Gateway,
		&s.GatewayPaymentID, &s.ConfirmationURL, &s.CustomerContact,
		&s.NextCheckAt, &s.CheckAttempts, &s.LeaseOwner, &s.LeaseUntil, &s.FlaggedAt,
		&s.FlagReason, &s.CreatedAt, &s.UpdatedAt})
	s.Status = Status(st)
	return s, err
}

// querier is what both a pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Get returns one session.
func (s *Service) Get(ctx context.Context, id string) (Session, error) {
	if !validUUID(id) {
		return Session{}, Errorf(ENOTFOUND, "payment %q not found", id)
	}
	return getSession(ctx, s.db, id)
}

func getSession(ctx context.Context, q querier, id string) (Session, error) {
	sess, err := scanSession(q.QueryRow(ctx, `SELECT `+sessionColumns+` FROM payment_sessions WHERE id = $1`, id))
	if err != nil {
		return Session{}, dbError("get session", err, "payment %q not found", id)
	}
	return sess, nil
}

// Order is an order as pitlane knows it.
type Order struct {
	OrderID         string
	Status          string // AwaitingPayment | Paid
	ActiveSessionID string
	PaidSessionID   string
	CustomerContact string
	CreatedAt       time.Time
	UpdatedAt       time.Time
}

// Order statuses.
const (
	OrderAwaitingPayment = "AwaitingPayment"
	OrderPaid            = "Paid"
)

// GetOrder returns an order and its sessions, oldest first, as one moment of the database: both
// reads in one REPEATABLE READ transaction. Read in two statements, a Check completing the
// payment between them was answered as an order AwaitingPayment whose only payment is Completed
// — a state the database never held (the session's Completed and its order's Paid are one
// commit), and a shop reading the status to ship and the payments to start another got
// contradicting answers (an outside review). Like every transaction of pitlane it bounds its
// idle time on the server (IdleInTransaction): a host lost between the two reads left the
// snapshot and the tables' locks, which a migration's ALTER TABLE waits behind, until the TCP
// keepalive gave up.
func (s *Service) GetOrder(ctx context.Context, orderID string) (o Order, sessions []Session, err error) {
	begin := "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; " + SetIdleInTransaction(s.cfg.IdleInTransactionTimeout)
	err = pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{BeginQuery: begin}, func(tx pgx.Tx) error {
		o, sessions, err = getOrder(ctx, tx, orderID)
		return err
	})
	return o, sessions, err
}

func getOrder(ctx context.Context, q querier, orderID string) (Order, []Session, error) {
	var o Order
	err := q.QueryRow(ctx, `SELECT order_id, status, coalesce(active_session_id::text, ''),
		coalesce(paid_session_id::text, ''), coalesce(customer_contact, ''), created_at, updated_at
		FROM orders WHERE order_id = $1`, orderID).Scan(&o.OrderID, &o.Status, &o.ActiveSessionID,
		&o.PaidSessionID, &o.CustomerContact, &o.CreatedAt, &o.UpdatedAt)
	if err != nil {
		return Order{}, nil, dbError("get order", err, "order %q not found", orderID)
	}
	rows, err := q.Query(ctx, `SELECT `+sessionColumns+` FROM payment_sessions WHERE order_id = $1 ORDER BY created_at, payment_sessions.id`, orderID)
	if err != nil {
		return Order{}, nil, fmt.Errorf("get order sessions: %w", err)
	}
	sessions, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Session, error) { return scanSession(r) })
	if err != nil {
		return Order{}, nil, fmt.Errorf("get order sessions: %w", err)
	}
	return o, sessions, nil
}

// dbError is the one edge where database errors become domain errors: no rows → ENOTFOUND
// (with the given message), a lock timeout or a database outage (DatabaseUnavailable) →
// EUNAVAIL, a violation of the one-active-session index → ECONFLICT. Constraint names and
// SQLSTATEs, never message texts, decide.
func dbError(op string, err error, notFoundFormat string, args ...any) error {
	if errors.Is(err, pgx.ErrNoRows) && notFoundFormat != "" {
		return Errorf(ENOTFOUND, notFoundFormat, args...)
	}
	if DatabaseUnavailable(err) {
		return &Error{Code: EUNAVAIL, Message: unavailableMessage, Err: fmt.Errorf("%s: %w", op, err)}
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case timedOutCode(pe.Code): // lock_timeout or statement_timeout fired (lockTimedOut)
			return &Error{Code: EUNAVAIL, Message: busyMessage, Err: err}
		case pe.Code == "23505" && pe.ConstraintName == "payment_sessions_one_active_per_order":
			return &Error{Code: ECONFLICT, Message: "the order already has an active payment session", Err: err}
		case pe.Code == "23505" && pe.ConstraintName == "accounting_entries_one_payment_received":
			return &Error{Code: ECONFLICT, Message: "the order already has a PaymentReceived entry", Err: err}
		case pe.Code == "23505" && pe.ConstraintName == "resolution_proposals_one_open":
			return &Error{Code: ECONFLICT, Message: "a proposal for this payment already waits for approval", Err: err}
		case pe.Code == "23514" && pe.ConstraintName == "resolution_proposals_four_eyes":
			return &Error{Code: EFORBIDDEN, Message: errSelfApproval.Message, Err: err}
		case pe.Code == "40P01":
			// A deadlock is a bug in the lock order, not a retry case: report it loudly.
			return fmt.Errorf("%s: DEADLOCK (lock order violated): %w", op, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Outlive is a context that outlives ctx by at most grace: work that must be done though its
// request or round ended (an audit entry of what was done, a claim's release, a heartbeat) is
// not cut with it, but neither waits past grace after it on a database that does not answer:
// under context.WithoutCancel alone it waited as long as the database did.
func Outlive(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-octx.Done():
		case <-t.C:
			cancel()
		}
	})
	return octx, func() { stop(); cancel() }
}

// unlessHungUp is ctx without its client's hang-up: its deadline (the request's bound) and any
// end with a cause of its own (a replica's stop cuts its requests with one) still end it, but the
// plain cancellation the HTTP server gives a request whose client went away does not. A Create's
// registration is not cut half-way by a client that stopped waiting (a shop's 5 s timeout
// against a gateway answering in 6): cut, the gateway may have made the payment while the
// session went Unknown, and the client's retry with its key read a payment without a page
// until the patrol found it by reference.
func unlessHungUp(ctx context.Context) (context.Context, context.CancelFunc) {
	base, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if d, ok := ctx.Deadline(); ok {
		cancel()
		base, cancel = context.WithDeadline(context.WithoutCancel(ctx), d)
	}
	out, cut := context.WithCancelCause(base)
	stop := context.AfterFunc(ctx, func() {
		if cause := context.Cause(ctx); cause != context.Canceled { //nolint:errorlint // a hang-up is exactly this error
			cut(cause)
		}
	})
	return out, func() { stop(); cut(nil); cancel() }
}

// execDetached runs one autocommit statement that must run though ctx ended (a lease given back,
// an outcome recorded, a claim released) under Outlive's bound: RecordGrace past ctx's end at
// most. Under context.WithoutCancel alone, a database that did not answer held the stop of the
// loop or request it belonged to for as long as it did not answer.
func (s *Service) execDetached(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	dctx, cancel := Outlive(ctx, RecordGrace)
	defer cancel()
	return s.db.Exec(dctx, sql, args...)
}

// detachRecord is the context a request's work is recorded under once it may not be left half
// done (the gateway has spoken, a cancel is committed): it outlives the request — a client gone,
// a call cut at its bound — by RecordGrace at most, so a database that does not answer cannot
// hold the answer past the request's bound (an outside review); a record given up is the next
// look's (the session or refund stays due), as after a crash. A patrol drive's records outlive
// the drive (its budget ends a gateway timeout before the lease) by a lease at most: under
// context.WithoutCancel alone, a database gone silent mid-record (a failover that left the old
// host unanswering) held the drive, its round and the replica's patrol until TCP gave up.
//
// It is no longer the staff member's decision either: their click was checked when it committed
// (a claim, a confirmed cancel) and the gateway has acted on it, so its outcome is written
// whoever they are by then (withoutStaffSession). A user disabled while the gateway registered
// their payment left the session Registering with a payment at the gateway, and a page and an
// audit entry saying "nothing was changed" (an outside review, staff).
func (s *Service) detachRecord(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx = withoutStaffSession(ctx)
	if _, drive := ctx.Value(leaseCtxKey{}).(driveLease); drive {
		return Outlive(ctx, s.cfg.LeaseDuration)
	}
	return Outlive(ctx, RecordGrace)
}

// execBounded runs one statement in a transaction of its own under inTx's bounded lock wait: a
// write outside the core's transactions that may wait for a row the core locks (a foreign key to
// payment_sessions, a lease on one). An autocommit statement has no lock_timeout, and behind a
// transaction whose client died holding the row it waited for hours (an outside review).
func (s *Service) execBounded(ctx context.Context, op, sql string, args ...any) (tag pgconn.CommandTag, err error) {
	err = s.inTx(ctx, op, func(tx pgx.Tx) error {
		tag, err = tx.Exec(ctx, sql, args...)
		return err
	})
	return tag, err
}

// inTx runs fn in a READ COMMITTED transaction with a bounded lock wait. A commit error is an
// unknown outcome; callers read the state back rather than repeating blindly.
func (s *Service) inTx(ctx context.Context, op string, fn func(tx pgx.Tx) error) error {
	_, err := s.runTx(ctx, nil, op, fn)
	return err
}

// inTxCommit is inTx for a caller that must know, when it fails, whether the transaction may
// have committed all the same: a COMMIT went out (inTx's, or one riding fn's last batch:
// commitWith) and its answer was lost. A transaction that failed before its COMMIT was sent, or
// whose COMMIT the server refused or skipped, did not commit: mayHaveCommitted is false, as it
// is when err is nil. Such a caller writes again, or lets go of, what it may have committed.
func (s *Service) inTxCommit(ctx context.Context, op string, fn func(tx pgx.Tx) error) (mayHaveCommitted bool, err error) {
	return s.runTx(ctx, nil, op, fn)
}

// inTxOn is inTx on a connection the caller holds (nil: one of the pool's); it stays the
// caller's when inTxOn returns: outside any transaction, unless the ROLLBACK after an error
// failed too (the pool destroys such a connection when the caller releases it).
func (s *Service) inTxOn(ctx context.Context, held *pgxpool.Conn, op string, fn func(tx pgx.Tx) error) error {
	_, err := s.runTx(ctx, held, op, fn)
	return err
}

func (s *Service) runTx(ctx context.Context, held *pgxpool.Conn, op string, fn func(tx pgx.Tx) error) (mayHaveCommitted bool, err error) {
	defer func() { traceError(ctx, err) }() // the operation's span learns how its transaction ended
	// BEGIN and SET LOCAL ride in the pipeline of the transaction's first statement (tx.go).
	tx := newPipelinedTx(s.db, held, fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", s.cfg.LockTimeout.Milliseconds()),
		SetIdleInTransaction(s.cfg.IdleInTransactionTimeout))
	defer func() {
		rctx, cancel := dbconn.Rollback(ctx)
		defer cancel()
		tx.Rollback(rctx) //nolint:errcheck // no-op after commit
	}()
	if err := fn(tx); err != nil {
		return tx.mayHaveCommitted, err
	}
	if err := tx.Commit(ctx); err != nil {
		return tx.mayHaveCommitted, dbError(op+": commit", err, "")
	}
	return false, nil
}

// sessionPatch lists the columns a transition may change besides status.
type sessionPatch struct {
	gatewayPaymentID string // set when non-empty
	confirmationURL  string // set when non-empty
	nextCheckAt      *time.Time
	clearNextCheck   bool
	// endLease: a patrol drive's transition to a terminal state gives the drive's lease back in
	// the same UPDATE, and counts the look, as the producer's release would (releaseBatch): the
	// row needs no release of its own. Only under the drive's lock on the row while it carries
	// the drive's token (applyLocked).
	endLease bool
}

// applyTransition is THE one way a session's status changes: a guarded UPDATE over the edges of
// the transitions table that must touch exactly one row, and a timeline event in the same
// transaction. Entering a terminal state releases the order's active-session pointer and the
// sweeper's interest. It does not do money: Completed's ledger entry is completeOrder's job,
// called by the caller in the same transaction.
func applyTransition(ctx context.Context, tx pgx.Tx, id string, to Status, actor Actor, reason string, now time.Time, p sessionPatch) (Session, error) {
	var b pgx.Batch
	var sess Session
	if err := queueTransition(&b, id, to, actor, reason, now, p, &sess); err != nil {
		return Session{}, err
	}
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return Session{}, transitionError(id, err)
	}
	return sess, nil
}

// The SQLSTATEs of the guards that raise in SQL (migration 00440).
const (
	sqlstateTransitionRefused = "PT409"
	sqlstateNoSuchPayment     = "PT404"
)

// errNoTransition: a settle batch's transitions did not all move their row (settle_batch.go).
var errNoTransition = errors.New("transition: the edge is not allowed from the current state")

// queueTransition queues applyTransition's one statement into b; *out is the session after it
// once the batch has run. A batch in which the edge was not allowed fails in SQL (SQLSTATE
// PT409, or PT404 without such a payment; transitionError turns it into the caller's error), and
// the caller's transaction rolls back.
func queueTransition(b *pgx.Batch, id string, to Status, actor Actor, reason string, now time.Time, p sessionPatch, out *Session) error {
	from := allowedFrom(to)
	if len(from) == 0 {
		return Errorf(ECONFLICT, "no transition leads to %s", to)
	}
	next := p.nextCheckAt
	clear := p.clearNextCheck || to.Terminal()
	// One statement: the guarded UPDATE, the timeline event that names the state it replaced
	// (prev, read in the same snapshot; callers hold the order then session locks, so it is the
	// state the UPDATE sees), and for a terminal state other than Completed the order's active
	// pointer let go (Completed's is completeOrder's). A terminal state ends any patrol lease on
	// the row, whoever moved it: a drive still in flight (an approval settled the session under
	// it) then finds its lease gone before it acts at the gateway (holdForSend) and writes
	// nothing after (lockOrderAndSessionWith); only the drive's own transition counts its look
	// (endLease). No row moved (the edge is not allowed from
	// the current state, or there is no such payment): the statement fails in SQL (migration
	// 00440's pitlane_transition_done, read from done, which the LEFT JOIN always reads), so
	// nothing queued after it runs and a COMMIT pipelined behind it is skipped.
	b.Queue(`
		WITH prev AS (SELECT status FROM payment_sessions WHERE id = $1),
		upd AS (
			UPDATE payment_sessions SET
				status = $2,
				gateway_payment_id = CASE WHEN $3 = '' THEN gateway_payment_id ELSE $3 END,
				confirmation_url = CASE WHEN $4 = '' THEN confirmation_url ELSE $4 END,
				next_check_at = CASE WHEN $6 THEN NULL WHEN $5::timestamptz IS NOT NULL THEN $5 ELSE next_check_at END,
				lease_owner = CASE WHEN $14 THEN NULL ELSE lease_owner END,
				lease_until = CASE WHEN $14 THEN NULL ELSE lease_until END,
				lease_token = CASE WHEN $14 THEN NULL ELSE lease_token END,
				check_attempts = check_attempts + CASE WHEN $13 THEN 1 ELSE 0 END,
				updated_at = $7
			WHERE id = $1 AND status = ANY($8)
			RETURNING `+sessionColumns+`
		),
		ev AS (
			INSERT INTO session_events (session_id, from_status, to_status, actor_kind, actor_id, reason, created_at)
			SELECT $1, prev.status, $2, $9, $10, $11, $7 FROM prev, upd
		),
		released AS (
			UPDATE orders SET active_session_id = NULL, updated_at = $7
			FROM upd WHERE $12 AND orders.order_id = upd.order_id AND orders.active_session_id = $1
		),
		done AS MATERIALIZED (SELECT pitlane_transition_done((SELECT count(*) FROM upd), (SELECT status FROM prev), $2))
		SELECT upd.* FROM done LEFT JOIN upd ON true`,
		id, string(to), p.gatewayPaymentID, p.confirmationURL, next, clear, now, from,
		string(actor.Kind), actor.ID, reason, to.Terminal() && to != StatusCompleted, p.endLease && to.Terminal(), to.Terminal()).QueryRow(func(r pgx.Row) error {
		sess, err := scanSession(r) // a row always: no row moved raised in SQL
		if err != nil {
			return err
		}
		*out = sess
		return nil
	})
	return nil
}

// transitionError turns a failed transition batch into the caller's error: the guard's refusal
// (raised in SQL, its message naming the current state) as a conflict, no such payment as not
// found.
func transitionError(id string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case sqlstateTransitionRefused:
			return &Error{Code: ECONFLICT, Message: pgErr.Message}
		case sqlstateNoSuchPayment:
			return Errorf(ENOTFOUND, "payment %q not found", id)
		}
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return dbError("transition", err, "")
}

// lockOrderAndSession takes the two row locks in THE order (order, then session) and returns the
// session as it is now, under lock.
func lockOrderAndSession(ctx context.Context, tx pgx.Tx, orderID, sessionID string) (Session, error) {
	return lockOrderAndSessionWith(ctx, tx, orderID, sessionID, nil)
}

// lockOrderAndSessionWith is lockOrderAndSession with more statements queued after the two locks
// (more may queue reads with their own result callbacks). Everything goes in one round trip: a
// pipelined batch whose statements the server still runs one after the other, each with its own
// snapshot, so the session is read after the order lock was granted and the extra reads after
// both — the same as sending them one by one, minus the waits in between. An error in one
// statement aborts the transaction, so the ones after it fail too; the first error is returned.
func lockOrderAndSessionWith(ctx context.Context, tx pgx.Tx, orderID, sessionID string, more func(b *pgx.Batch)) (Session, error) {
	var (
		b      pgx.Batch
		status string
		sess   Session
		errOut error
	)
	b.Queue(`SELECT status FROM orders WHERE order_id = $1 FOR UPDATE`, orderID).QueryRow(func(r pgx.Row) error {
		if err := r.Scan(&status); err != nil {
			return dbError("lock order", err, "order %q not found", orderID)
		}
		return nil
	})
	// A patrol drive carries its lease in ctx: the session is then locked only while the row still
	// carries the drive's token (patrol.go). Under this row lock the token cannot change before
	// commit, so everything this transaction writes is written by the lease holder or not at all.
	scanLocked := func(r pgx.Row) error {
		var err error
		if sess, err = scanSession(r); err != nil {
			if _, leased := leaseOf(ctx, sessionID); leased && errors.Is(err, pgx.ErrNoRows) {
				return ErrLeaseLost
			}
			return dbError("lock session", err, "payment %q not found", sessionID)
		}
		return nil
	}
	if token, leased := leaseOf(ctx, sessionID); leased {
		b.Queue(`SELECT `+sessionColumns+` FROM payment_sessions WHERE id = $1 AND lease_token = $2 FOR UPDATE`,
			sessionID, token).QueryRow(scanLocked)
	} else {
		b.Queue(`SELECT `+sessionColumns+` FROM payment_sessions WHERE id = $1 FOR UPDATE`, sessionID).QueryRow(scanLocked)
	}
	queueStaffStands(ctx, &b) // a staff member's change: their session still stands (staff_session.go)
	if more != nil {
		more(&b)
	}
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		errOut = err
	}
	return sess, errOut
}

// logGatewayCall records one gateway call outside any transaction (it must survive a rollback of
// whatever follows: the call happened).
func (s *Service) logGatewayCall(ctx context.Context, sessionID, op, key string, started time.Time, err error) {
	s.logGatewayAnswer(ctx, sessionID, op, key, started, err, "")
}

// logGatewayAnswer is logGatewayCall with what the gateway answered ("gateway says pending"),
// kept as the detail of a call that succeeded: the finance workbench shows each stuck session's
// last answer. Inside a deferCallLog slot the row waits for the apply transaction instead.
func (s *Service) logGatewayAnswer(ctx context.Context, sessionID, op, key string, started time.Time, err error, answer string) {
	outcome := "ok"
	status := 0
	detail := answer
	if err != nil {
		outcome = string(FailureOf(err))
		var ge *GatewayError
		if errors.As(err, &ge) {
			status = ge.HTTPStatus
		}
		detail = err.Error()
	}
	var sid any
	if sessionID != "" {
		sid = sessionID
	}
	roundOf(ctx).count(err) // the patrol's back-pressure (patrol.go)
	args := []any{sid, op, key, outcome, status, time.Since(started).Milliseconds(), detail, s.cfg.ReplicaID, s.cfg.Clock.Now()}
	if slot, ok := ctx.Value(callLogKey{}).(*callLogSlot); ok && slot.args == nil && sid != nil {
		slot.args = args
		return
	}
	s.writeCallLog(ctx, args, false)
}

const insertGatewayCall = `INSERT INTO gateway_calls
		(session_id, operation, idempotency_key, outcome, http_status, latency_ms, detail, replica_id, created_at)
		VALUES ($1, $2, $3, $4, nullif($5, 0), $6, $7, $8, $9)`

// writeCallLog writes one gateway call's row on its own. guarded: only if that very row is not
// there already (an apply transaction that carried it may have committed: its commit failed
// with an unknown outcome).
func (s *Service) writeCallLog(ctx context.Context, args []any, guarded bool) {
	sql := insertGatewayCall
	if guarded {
		sql = `INSERT INTO gateway_calls
			(session_id, operation, idempotency_key, outcome, http_status, latency_ms, detail, replica_id, created_at)
			SELECT $1::uuid, $2, $3, $4, nullif($5::int, 0), $6, $7, $8, $9
			WHERE NOT EXISTS (SELECT 1 FROM gateway_calls WHERE session_id = $1::uuid AND operation = $2 AND idempotency_key = $3
				AND outcome = $4 AND latency_ms = $6 AND detail = $7 AND replica_id = $8 AND created_at = $9)`
	}
	// In a transaction of its own with the core's bounded lock wait: the row's foreign key waits
	// for the session's row lock, and behind a transaction whose client died holding it (idle in
	// transaction until PostgreSQL notices, hours) an unbounded insert hung the Check that had
	// already given up on that lock — a 503 promised, no answer, a pool connection held — and the
	// patrol's round and its stop with it (an outside review). The row is then lost; the log says
	// which call it was. It outlives a request as its other records do (detachRecord).
	ctx, done := s.detachRecord(ctx)
	defer done()
	if _, err := s.execBounded(ctx, "log gateway call", sql, args...); err != nil {
		s.log.Error("log gateway call", "err", err, "op", args[1], "session", args[0], "key", args[2], "outcome", args[3])
	}
}

// A gateway call and the apply transaction after it (Check, the patrol's drives, Create's
// register) used to be two writes, each its own transaction: the call's log row, then the apply.
// deferCallLog lets the apply transaction carry the row in its first round trip instead — one
// statement and one commit less per settle — while keeping the rule that the call's row
// survives whatever happens to the apply: the row is written on its own when the apply did not
// commit it (it failed, or never ran), and guarded against a second copy when the apply's
// commit had an unknown outcome.
type callLogKey struct{}

// callLogSlot holds the row of the first gateway call made under it.
type callLogSlot struct {
	args      []any
	committed bool // an apply transaction carrying the row committed
	uncertain bool // an apply transaction carrying the row failed at its commit
}

// deferCallLog gives ctx a slot for the next gateway call's row; flush (deferred by the caller)
// writes the row unless an apply transaction did.
func (s *Service) deferCallLog(ctx context.Context) (context.Context, func()) {
	slot := &callLogSlot{}
	return context.WithValue(ctx, callLogKey{}, slot), func() {
		if slot.args != nil && !slot.committed {
			s.writeCallLog(ctx, slot.args, slot.uncertain)
			slot.args = nil
		}
	}
}

// pendingCallLog is the row waiting in ctx's slot for this transaction, if any.
func pendingCallLog(ctx context.Context) *callLogSlot {
	if slot, ok := ctx.Value(callLogKey{}).(*callLogSlot); ok && slot.args != nil && !slot.committed {
		return slot
	}
	return nil
}
