package payments

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ValidOrderID reports whether id is an order id of the contract: 1-64 characters of
// [A-Za-z0-9._:-]. The one place that rule lives (API, checkout and Create use it).
// A loop over the bytes, not a regular expression: it runs on every Create and every click, where
// the regexp package's matcher was a measurable share of a click's CPU (docs/performance.md).
func ValidOrderID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// validCurrency reports whether c is three upper-case ASCII letters (ISO 4217's shape).
func validCurrency(c string) bool {
	return len(c) == 3 && 'A' <= c[0] && c[0] <= 'Z' && 'A' <= c[1] && c[1] <= 'Z' && 'A' <= c[2] && c[2] <= 'Z'
}

// MaxAmount is the exclusive upper bound of an amount in minor units (contract: < 10^12).
const MaxAmount int64 = 1_000_000_000_000

// CreateInput is what a Create needs.
type CreateInput struct {
	OrderID         string
	Amount          int64
	Currency        string
	CustomerContact string
	// FirstAttempt: the caller knows no earlier request of this intent ran (it holds a fresh
	// idempotency key: the API's first request of a key or a keyless intent). Create then skips
	// its lock-free read of an active session — it answers repeats, which a first attempt
	// hardly ever is — and goes straight to the claim, which decides the same under the lock.
	// One round trip less for every new order over the API.
	FirstAttempt bool
	// Bind: the caller's intent key (Slot.Binding), completed with the new session in the
	// claim's transaction — one round trip less than completing it after the Create, and the key
	// points at the session from the moment the session exists. Not used when the claim finds an
	// existing session (the caller completes the key then).
	Bind *KeyBinding
	// RefusedStands: a keyless Create (the API's intent). A session of the order with this
	// amount and currency that the gateway refused to register (Failed, no gateway payment: an
	// amount over its limit, a risk rule) within RefusedStands before now is the answer
	// (Created false): the refusal ends inside the first request, so every retry of a burst, and
	// the same request under another API client (a shop's second service, a key rotation half-
	// way), came after it and registered again, to be refused again. 0: not a keyless Create.
	RefusedStands time.Duration
	// checkoutPrice: a Pay click from the checkout page (CheckoutPay), which pays only the
	// order's checkout price (checkout_prices: the newest link's amount and currency) when the
	// shop made a link; the claim reads it under the order's lock, in its batch.
	checkoutPrice bool
	// CheckoutLinkGen: a Pay click's checkout link's price generation (CheckoutLink.Generation);
	// nil for a link without one (CheckoutPrice.Replaces judges it by amount and currency) and
	// for the page's retry without a link, which is held to the current price (CheckoutRetry). A
	// Pay click pays only while the order's price is still of the link's generation.
	CheckoutLinkGen *int64
	// checkoutStart: the key of a checkout Pay click that was judged to start nothing (a payment
	// of the order was active: checkoutPayKeyless) and so spent none of the order's
	// CheckoutStartsPerHour. Should the claim start a payment after all (that payment ended in
	// between), it counts the order's starts of the hour under the order's lock first, as the
	// click's own look would have, refuses past the budget (an outside review: the 11th payment
	// of the hour), and writes the click's start (its checkout intent, bound to the payment) in
	// the claim's transaction.
	checkoutStart string
}

// Validate checks the input against the contract and names the field at fault.
func (in CreateInput) Validate() error {
	if !ValidOrderID(in.OrderID) {
		return Invalid("order_id", "order_id must be 1-64 characters of A-Z a-z 0-9 . _ : -")
	}
	if in.Amount <= 0 || in.Amount >= MaxAmount {
		return Invalid("amount", "amount must be an integer in minor units, greater than 0 and less than 10^12")
	}
	if !validCurrency(in.Currency) {
		return Invalid("currency", "currency must be three upper-case letters, an ISO 4217 code such as EUR")
	}
	return ValidateContact(in.CustomerContact)
}

// PlainLine reports whether s is one line of text as people type it: UTF-8 without NUL or any
// other control character. PostgreSQL stores it as it is, and a log, a terminal or a message
// header shows it as one line.
func PlainLine(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}

// plainText is PlainLine that also allows line breaks and tabs: a reason or a note.
func plainText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\r' && r != '\t' })
}

// ValidateContact: where the customer's messages (one-time codes) go — at most 320 characters of
// printable UTF-8 (an email address, a phone number, a handle the shop's notifier knows).
// A NUL byte, a line break or an escape in it could never be delivered to anyone and would
// break the message's headers or a terminal showing it. Nor an invisible one (a right-to-left
// override, a zero-width space, a line separator, a private-use character): support reads this
// field to know whom a code goes to, and "\u202egnp.exe@evil.com" shows as another address than
// the one it is.
func ValidateContact(contact string) error {
	if !PlainLine(contact) {
		return Invalid("customer_contact", "customer_contact must be UTF-8 text without control characters (NUL, line breaks, escapes)")
	}
	// Characters that show as themselves only (ShownAsIs): no format character (Cf), line or
	// paragraph separator, private-use character or other default-ignorable code point, which
	// show as nothing or as something else.
	if i := strings.IndexFunc(contact, func(r rune) bool { return !ShownAsIs(r) }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(contact[i:])
		return Invalid("customer_contact", "customer_contact must not contain invisible formatting characters (U+%04X at byte %d): they make it show as another address than it is", r, i+1)
	}
	if utf8.RuneCountInString(contact) > 320 {
		return Invalid("customer_contact", "customer_contact must be at most 320 characters")
	}
	return nil
}

// CreateResult is a Create's outcome. Created is false when an active session with the same
// parameters already existed and was returned as it is now.
type CreateResult struct {
	Session Session
	Created bool
}

// Create is Claim + Register (design.md, "The locking core" 1).
//
// Claim is a short transaction serialised per order by pg_advisory_xact_lock(LockCreateOrder,
// hashtext(order_id)): read the order and its active session, decide, insert a Registering
// session. Register runs after commit, outside any transaction and lock, with the gateway
// idempotency key and reference derived from the session id, so a repeat after a lost answer
// cannot create a second gateway payment and a concurrent Create never waits for the gateway.
func (s *Service) Create(ctx context.Context, actor Actor, in CreateInput) (CreateResult, error) {
	ctx, span := s.startSpan(ctx, "payments.create", "", in.OrderID)
	defer span.End()
	if err := in.Validate(); err != nil {
		return CreateResult{}, err
	}
	sess, created, err := s.claim(ctx, actor, in)
	if err != nil {
		return CreateResult{}, err
	}
	ctx = s.traceSession(ctx, sess)
	if !created {
		return CreateResult{Session: sess}, nil
	}
	if h := s.cfg.Hooks.BeforeRegister; h != nil {
		h(ctx, sess.ID)
	}
	if !s.sendFitsGrace(sess.CreatedAt) {
		// The claim committed so late that the registration could still be in flight when the
		// patrol may take the session up: it is the patrol's (Registering, 202), never sent
		// beside it.
		s.log.Warn("create: the claim committed too late to register before the patrol may; leaving it to the patrol",
			"session", sess.ID, "claimed", sess.CreatedAt)
		return CreateResult{Session: sess, Created: true}, nil
	}
	if s.cfg.Clock.Now().Sub(sess.CreatedAt) > lateSend {
		// The session is due RegisterGrace after its claim, less than that after this send:
		// held RegisterGrace past it first, or the patrol may register beside it should this
		// process die with the request on the wire (holdLateSend).
		if err := s.holdLateSend(ctx, lateSession(sess), sess.ID, sess.CreatedAt); err != nil {
			s.log.Warn("create: could not hold the session for a late registration; leaving it to the patrol",
				"session", sess.ID, "err", err)
			if errors.Is(err, errPatrolsNow) {
				// The patrol may have registered it meanwhile: answered as it is now.
				gctx, gdone := s.detachRecord(ctx)
				defer gdone()
				if cur, gerr := s.Get(gctx, sess.ID); gerr == nil {
					sess = cur
				}
			}
			return CreateResult{Session: sess, Created: true}, nil
		}
	}
	rctx, done := unlessHungUp(ctx)
	defer done()
	out, err := s.register(rctx, actor, sess)
	if err != nil {
		// The session exists (the claim committed) and its registration's outcome is the
		// patrol's to learn if this request could not write it: answered as it is now (201 once
		// Registered, 202 while Registering or Unknown), as a refund whose apply failed is
		// (settleRefund). Answered 503, a Create whose apply committed with its answer lost (a
		// failover) told the shop it failed while the gateway and pitlane held its payment, and
		// the same key's retry replayed it as 200, "already existed" (an outside review, dbfail).
		s.log.Info("create: registration not written by its request; answering the session as it is", "session", sess.ID, "err", err)
		gctx, gdone := s.detachRecord(ctx)
		defer gdone()
		cur, gerr := s.Get(gctx, sess.ID)
		if gerr != nil {
			return CreateResult{}, err
		}
		return CreateResult{Session: cur, Created: true}, nil
	}
	return CreateResult{Session: out, Created: true}, nil
}

// activeSessionOfOrderSQL reads an order's active session ($1: the order id) through the partial
// unique index over active sessions, in every plan (activeStatusSQL).
var activeSessionOfOrderSQL = `SELECT ` + sessionColumns + ` FROM payment_sessions WHERE order_id = $1 AND ` + activeStatusSQL

// activeOrOpenClaimSQL is the hot order's lock-free read ($1: the order id, $2: LockCreateOrder):
// the order's active session if there is one; else, if a claim of the order is open right now
// (pg_try_advisory_xact_lock_shared on the claim's lock fails: the exclusive holder is there), a
// row of NULLs (the outer join's side without a match); else no row. The try is made only on a
// miss, and its shared lock ends with the statement (its own implicit transaction). One round
// trip in every case.
var activeOrOpenClaimSQL = `WITH active AS MATERIALIZED (` + activeSessionOfOrderSQL + `)
	SELECT active.* FROM (SELECT) AS one LEFT JOIN active ON true
	WHERE EXISTS (SELECT FROM active) OR NOT pg_try_advisory_xact_lock_shared($2, hashtext($1))`

// readActive is the lock-free read of the hot order (activeOrOpenClaimSQL). found: the order's
// active session; claimOpen: none, and a claim of the order is open.
func (s *Service) readActive(ctx context.Context, conn *pgxpool.Conn, orderID string) (active Session, found, claimOpen bool, err error) {
	rows, err := conn.Query(ctx, activeOrOpenClaimSQL, orderID, int32(LockCreateOrder))
	if err != nil {
		return Session{}, false, false, err
	}
	if rows.Next() {
		if rows.RawValues()[0] == nil {
			claimOpen = true
		} else {
			active, err = scanSession(rows)
			found = err == nil
		}
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	return active, found && err == nil, claimOpen, err
}

// readActiveAfterClaim waits until no claim of the order is open — pg_advisory_xact_lock_shared
// on the claim's lock, which waits for the exclusive holder and is held by any number of readers
// at once, under the same lock_timeout as every core lock wait — and then reads the order's active
// session: one transaction, one round trip (BEGIN, the lock, the read and COMMIT in one pipeline).
func (s *Service) readActiveAfterClaim(ctx context.Context, conn *pgxpool.Conn, orderID string) (Session, error) {
	var active Session
	var readErr error
	err := s.inTxOn(ctx, conn, "create: wait for the open claim", func(tx pgx.Tx) error {
		var b pgx.Batch
		b.Queue(`SELECT pg_advisory_xact_lock_shared($1, hashtext($2))`, int32(LockCreateOrder), orderID).Exec(func(pgconn.CommandTag) error { return nil })
		b.Queue(activeSessionOfOrderSQL, orderID).QueryRow(func(r pgx.Row) error {
			active, readErr = scanSession(r)
			if errors.Is(readErr, pgx.ErrNoRows) {
				return nil // not a failure of the transaction: reported below
			}
			return readErr
		})
		return commitWith(ctx, tx, &b)
	})
	if err != nil {
		return Session{}, err
	}
	return active, readErr
}

func (s *Service) claim(ctx context.Context, actor Actor, in CreateInput) (Session, bool, error) {
	ctx, span := s.startSpan(ctx, "payments.claim", "", in.OrderID)
	defer span.End()
	// One connection for the whole claim: the read, a wait for an open claim, the claim's
	// transaction. Giving it back between them would put the claim behind every request queued
	// for the pool — in a storm, behind the very duplicates that wait for it.
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return Session{}, false, dbError("create: connection", err, "")
	}
	defer conn.Release()
	if !in.FirstAttempt && !in.checkoutPrice {
		// A first attempt (a fresh idempotency key) skips the lock-free read: there is normally
		// nothing to find. So does a checkout page's Pay click: the claim judges it under the
		// order's lock with the order's price and its late payments (a late payment in review
		// refuses it even while another payment is active).
		active, found, err := s.readActiveOrWait(ctx, conn, in.OrderID)
		switch {
		case err != nil:
			return Session{}, false, dbError("create: read active", err, "")
		case found && active.Amount == in.Amount && active.Currency == in.Currency:
			span.SetAttributes(AttrSessionID.String(active.ID))
			return active, false, nil
		}
	}
	out, created, err := s.claimLocked(ctx, conn, actor, in)
	if err != nil {
		return Session{}, false, err
	}
	span.SetAttributes(AttrSessionID.String(out.ID))
	return out, created, nil
}

// readActiveOrWait is the lock-free read of the hot order (a customer clicking Pay again, a
// retrying client, a storm of duplicates): an active session that is already committed is the
// answer, and reading it needs no lock. The claim would read the same row (or a newer state of
// it) under the lock; answering from this read is answering as of a moment just before.
//
// A miss while a claim of the order is open (a storm of duplicates arriving while the first
// Create is inside its claim) waits for that claim with the order's lock taken SHARED, which
// every duplicate can hold at once, and reads again: the duplicates then read the committed
// session together instead of taking the exclusive claim one after another. Learning that a
// claim is open costs nothing more on the way (the same round trip as the read), so a first
// Create of a new order goes to its claim as fast as before.
func (s *Service) readActiveOrWait(ctx context.Context, conn *pgxpool.Conn, orderID string) (Session, bool, error) {
	active, found, claimOpen, err := s.readActive(ctx, conn, orderID)
	if err != nil || !claimOpen {
		return active, found, err
	}
	active, err = s.readActiveAfterClaim(ctx, conn, orderID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Session{}, false, nil
	}
	return active, err == nil, err
}

// claimLocked is the claim's transaction: under the order's advisory lock, the order row and the
// active session decide; a new session is inserted when there is none.
func (s *Service) claimLocked(ctx context.Context, conn *pgxpool.Conn, actor Actor, in CreateInput) (Session, bool, error) {
	now := s.cfg.Clock.Now()
	var out Session
	var created bool
	var claimed string // the id of the session this transaction inserts, once queued
	mayHaveCommitted, err := s.runTx(ctx, conn, "create: claim", func(tx pgx.Tx) error {
		// The lock, the order row (created on the first Create, then locked: that keeps the lock
		// order order → session and orders us after a Check that is marking it Paid) and the
		// active session, in one round trip: a pipelined batch, run by the server statement after
		// statement, each with its own snapshot, so the reads see everything committed before the
		// lock was granted.
		var (
			b           pgx.Batch
			orderStatus string
			hasActive   bool
			active      Session
		)
		b.Queue(`SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(LockCreateOrder), in.OrderID).Exec(func(_ pgconn.CommandTag) error { return nil })
		b.Queue(`INSERT INTO orders (order_id, customer_contact, created_at, updated_at)
			VALUES ($1, nullif($2, ''), $3, $3) ON CONFLICT (order_id) DO NOTHING`, in.OrderID, in.CustomerContact, now)
		b.Queue(`SELECT status FROM orders WHERE order_id = $1 FOR UPDATE`, in.OrderID).QueryRow(func(r pgx.Row) error {
			return r.Scan(&orderStatus)
		})
		// A staff member's start: their session still stands once the order's lock is theirs (a
		// click that waited for it while they were disabled claimed and registered a payment,
		// an outside review, staff).
		queueStaffStands(ctx, &b)
		b.Queue(activeSessionOfOrderSQL, in.OrderID).QueryRow(func(r pgx.Row) error {
			var err error
			active, err = scanSession(r)
			hasActive = err == nil
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
		var (
			priced   bool
			price    CheckoutPrice
			inReview bool
		)
		var (
			refused    Session
			hasRefused bool
		)
		if in.RefusedStands > 0 {
			// The order's latest session (payment_sessions_order_pattern), if the gateway refused it.
			b.Queue(`SELECT `+sessionColumns+` FROM payment_sessions WHERE order_id = $1
				AND created_at = (SELECT max(created_at) FROM payment_sessions WHERE order_id = $1)
				AND status = 'Failed' AND gateway_payment_id IS NULL AND amount = $2 AND currency = $3 AND updated_at > $4
				ORDER BY payment_sessions.id LIMIT 1`, in.OrderID, in.Amount, in.Currency, now.Add(-in.RefusedStands)).QueryRow(func(r pgx.Row) error {
				var err error
				refused, err = scanSession(r)
				hasRefused = err == nil
				if errors.Is(err, pgx.ErrNoRows) {
					return nil
				}
				return err
			})
		}
		if in.checkoutPrice {
			b.Queue(`SELECT amount, currency, generation FROM checkout_prices WHERE order_id = $1`, in.OrderID).QueryRow(func(r pgx.Row) error {
				err := r.Scan(&price.Amount, &price.Currency, &price.Generation)
				priced = err == nil
				if errors.Is(err, pgx.ErrNoRows) {
					return nil
				}
				return err
			})
			// A late payment in finance's hands: no new charge from the checkout (ErrPaymentInReview).
			b.Queue(paymentInReviewSQL, in.OrderID).QueryRow(func(r pgx.Row) error { return r.Scan(&inReview) })
		}
		var holdsKey bool
		in.Bind.queueHolds(&b, &holdsKey)
		var starts checkoutStarts
		if in.checkoutStart != "" {
			b.Queue(checkoutStartsSQL, in.OrderID, now.Add(-time.Hour), in.checkoutStart).QueryRow(func(r pgx.Row) error {
				return r.Scan(&starts.n, &starts.oldest)
			})
		}
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return dbError("create: claim", err, "")
		}
		if h := s.cfg.Hooks.AfterClaimRead; h != nil {
			h(ctx, in.OrderID)
		}
		switch {
		case orderStatus == OrderPaid:
			return Errorf(ECONFLICT, "order %s is already paid", in.OrderID)
		case inReview:
			// Before the active payment: a retry's payment started before the bank reported the
			// late one is not sent to the customer again (TestCheckoutOffersNoActivePaymentWhileALateOneIsInReview).
			return ErrPaymentInReview
		case hasActive && active.Amount == in.Amount && active.Currency == in.Currency:
			out = active
			return nil
		case hasActive && in.checkoutPrice:
			// The customer's words: the amount as the page shows it, no internal id.
			return Errorf(ECONFLICT, "A payment of this order for %s %s is under way already (below): this click started nothing new.",
				FormatMinor(active.Amount, active.Currency), active.Currency)
		case hasActive:
			return Errorf(ECONFLICT, "order %s already has an active payment %s for %d %s", in.OrderID, active.ID, active.Amount, active.Currency)
		case priced && price.Replaces(in.Amount, in.Currency, in.linkGeneration()):
			return ErrLinkReplaced
		case hasRefused:
			out = refused
			return nil
		}
		if in.checkoutStart != "" {
			if err := starts.spent(now); err != nil {
				return err
			}
		}
		if !holdsKey {
			// The key went to the same request sent again (KeyBinding.queueHolds): a new session
			// is that one's to make; its answer is the key's.
			return Errorf(EBUSY, "a request with this key is still in progress; retry shortly")
		}
		id := uuid.NewString()
		// A Registering session is due for the sweeper after RegisterGrace: if this process dies
		// between commit and the gateway's answer, another replica recovers it.
		due := now.Add(s.cfg.RegisterGrace)
		// The session, the order's pointer to it and the timeline event: one statement, sent with
		// the COMMIT (one round trip): it either writes all three or fails and rolls back. The
		// order's contact (where codes of later payments without their own go) is the shop's to
		// change; a checkout page's Pay click (a customer: anyone holding the order's link) only
		// fills it when the order has none.
		var (
			ins  pgx.Batch
			sess Session
		)
		ins.Queue(`WITH sess AS (
				INSERT INTO payment_sessions
				(id, order_id, amount, currency, status, gateway, customer_contact, next_check_at, created_at, updated_at)
				VALUES ($1, $2, $3, $4, 'Registering', $5, nullif($6, ''), $7, $8, $8)
				RETURNING `+sessionColumns+`),
			ord AS (
				UPDATE orders SET active_session_id = $1, customer_contact = CASE WHEN $9 = '`+string(ActorCustomer)+`'
					THEN coalesce(customer_contact, nullif($6, '')) ELSE coalesce(nullif($6, ''), customer_contact) END,
				updated_at = $8 WHERE order_id = $2),
			ev AS (
				INSERT INTO session_events (session_id, from_status, to_status, actor_kind, actor_id, reason, created_at)
				SELECT $1, NULL, 'Registering', $9, $10, 'created', $8 FROM sess)
			SELECT * FROM sess`, id, in.OrderID, in.Amount, in.Currency, s.gw.Name(), in.CustomerContact, due, now,
			string(actor.Kind), actor.ID).QueryRow(func(r pgx.Row) (err error) { sess, err = scanSession(r); return err })
		if in.Bind != nil {
			in.Bind.queue(&ins, id, now)
		}
		if in.checkoutStart != "" {
			// The click's start is counted from the moment its payment exists, under the order's
			// lock: written after Create returned, it left a gap in which the payment could end
			// (a registration refused inside Create) and a new click count one start too few (an
			// outside review: an 11th payment of the hour).
			ins.Queue(`INSERT INTO checkout_intents (key, order_id, amount, currency, session_id, created_at)
				VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (key) DO NOTHING`,
				in.checkoutStart, in.OrderID, in.Amount, in.Currency, id, now)
		}
		claimed = id
		if err := commitWith(ctx, tx, &ins); err != nil {
			return dbError("create: insert", err, "")
		}
		in.Bind.committed()
		out, created = sess, true
		return nil
	})
	if err != nil && mayHaveCommitted && claimed != "" {
		if out, err = s.sessionClaimedAfterAll(ctx, claimed, in.Bind, err); err == nil {
			created = true
		}
	}
	if err != nil {
		return Session{}, false, err
	}
	return out, created, nil
}

// sessionClaimedAfterAll reads back a claim whose COMMIT's answer was lost (a failover,
// pgbouncer's FATAL, a connection cut after the server answered): the session it inserted (id,
// a fresh uuid no other transaction writes) found means the transaction committed, and with it
// the key's binding, which rode the same COMMIT; whether the binding found the key still this
// request's (its UPDATE's answer was lost with the COMMIT's) is read back too: the key records
// this session. The Create then goes on as if the answer had come — it registers the session
// now. It answered 503, and the same key's retry replayed the session Registering until the
// patrol registered it after RegisterGrace (session 53's note). Not found, or not readable: err
// stands, as refunds' claimedAfterAll.
func (s *Service) sessionClaimedAfterAll(ctx context.Context, id string, bind *KeyBinding, err error) (Session, error) {
	rctx, cancel := s.detachRecord(ctx)
	defer cancel()
	sess, gerr := s.Get(rctx, id)
	if gerr != nil {
		return Session{}, err
	}
	if bind != nil && !bind.recordOnly {
		if kerr := s.db.QueryRow(rctx, `SELECT EXISTS (SELECT FROM idempotency_keys
			WHERE client_id = $1 AND kind = $2 AND key = $3 AND resource_id = $4)`,
			bind.r.ClientID, string(bind.r.Kind), bind.r.Key, id).Scan(&bind.matched); kerr != nil {
			return Session{}, err
		}
		bind.committed()
	}
	if derr := s.confirmDurable(rctx); derr != nil {
		s.log.Warn("create: the claim's COMMIT answer was lost; the claim is there, but not known to be on the standbys: not sent", "session", id, "err", derr)
		return Session{}, err
	}
	s.log.Warn("create: the claim's COMMIT answer was lost, and the claim is there: going on with it", "session", id, "err", err)
	return sess, nil
}

// confirmDurable commits a transaction of its own after a claim was read back (its COMMIT's
// answer lost): a COMMIT that wrote WAL waits for the synchronous standbys
// (synchronous_standby_names) up to its own WAL, past the claim's, so acknowledged, the claim is
// on them too. A claim found is not yet one a failover keeps: PostgreSQL ends a backend that waits
// for its standby with FATAL 57P01 after committing locally, and the standby promoted then has no
// claim — sent on, the gateway held a payment (or a refund) pitlane did not know, which
// reconciliation, comparing by session, never finds (a review of the lost-answer read-back). Not
// acknowledged, the request answers as if nothing was read back (503): the patrol takes the claim
// up if it survives.
func (s *Service) confirmDurable(ctx context.Context) error { return confirmDurable(ctx, s.db) }

// confirmDurableSQL writes WAL in its transaction: a transactional logical message (no table, no
// trigger; nothing decodes it unless a logical slot asks for prefix "pitlane"). An xid alone
// (pg_current_xact_id) writes none before the commit record, and such a commit neither flushes
// nor waits for a standby (RecordTransactionCommit's wrote_xlog; a review proved it on a cluster
// with a standby that never answers).
const confirmDurableSQL = `SELECT pg_logical_emit_message(true, 'pitlane', 'read back')`

func confirmDurable(ctx context.Context, db querier) error {
	_, err := db.Exec(ctx, confirmDurableSQL)
	if err == nil && ctx.Err() != nil {
		// The wait cancelled on our end is answered success (PostgreSQL's WARNING "canceling wait
		// for synchronous replication": committed locally only).
		err = context.Cause(ctx)
	}
	return err
}

// sendFitsGrace: work that calls the gateway right after its claim without a lease (a Create's
// registration, a refund's first request) is left alone by the patrol for RegisterGrace from the
// claim's time (claimedAt, the row's created_at); it may start only while a whole gateway call
// still fits before then (at least half the grace). A claim the database answered late (a
// busy pool, a lock wait, a commit waiting for a standby) leaves it to the patrol instead of
// sending it beside the patrol's own request (ConfirmCancel does the same for its reverse).
func (s *Service) sendFitsGrace(claimedAt time.Time) bool {
	return s.cfg.Clock.Now().Sub(claimedAt) < s.sendWithin(s.cfg.RegisterGrace)
}

// lateSend is how long after its claim such work may send on the claim's own grace: the row is
// due RegisterGrace after the claim, so a send this late or less may still be processed by the
// gateway at most lateSend into the patrol's time. One sent later holds its row RegisterGrace
// past the send first (a write the usual send, milliseconds after its claim, is spared).
const lateSend = time.Second

// registerRequest is the session's registration: the same key (the session id) and body
// whichever path sends it — the Create, the patrol's recovery, a cancel asking before it reverses.
func (s *Service) registerRequest(sess Session) RegisterRequest {
	return RegisterRequest{IdempotencyKey: sess.ID, Reference: sess.Reference(), Amount: sess.Amount,
		Currency: sess.Currency, ReturnURL: s.returnURL(sess)}
}

// registerAgain sends the session's registration again under its key and logs the call: the
// gateway answers with the payment an earlier request made (or makes it now), or says why not.
// Sent and not answered (mayBeInFlight), the session's next look waits until the gateway can no
// longer be processing it (holdForRegistration): the patrol's drive and a cancel's looked up by
// reference at the schedule's next step, found nothing yet and registered beside it — two
// payments at a gateway that ignores keys (a review).
func (s *Service) registerAgain(ctx context.Context, sess Session) (GatewayPayment, error) {
	req := s.registerRequest(sess)
	started := time.Now()
	sent := s.cfg.Clock.Now()
	gp, err := s.gwOf(sess).Register(ctx, req)
	s.logGatewayCall(ctx, sess.ID, "register", req.IdempotencyKey, started, err)
	if mayBeInFlight(err) {
		if herr := s.holdForRegistration(ctx, sess, func() time.Time { return sent.Add(s.cfg.RegisterGrace) }); herr != nil {
			s.log.Warn("register: hold for a registration in flight", "session", sess.ID, "err", herr)
		}
	}
	return gp, err
}

// register asks the gateway to create the payment of a Registering session and applies the
// answer: Registered (ok), Unknown (the gateway may have acted), Failed (a definitive refusal).
// Not sent leaves it Registering for the sweeper: certain nothing happened, safe to repeat.
func (s *Service) register(ctx context.Context, actor Actor, sess Session) (Session, error) {
	ctx, span := s.startSpan(ctx, "payments.register", sess.ID, sess.OrderID)
	defer span.End()
	req := s.registerRequest(sess)
	started := time.Now()
	sent := s.cfg.Clock.Now()
	gp, gerr := s.gwOf(sess).Register(ctx, req)
	if gerr == nil {
		// The call's log row rides in the apply transaction (deferCallLog).
		actx, flush := s.deferCallLog(ctx)
		defer flush()
		s.logGatewayCall(actx, sess.ID, "register", req.IdempotencyKey, started, gerr)
		return s.applyGatewayPayment(actx, actor, sess, gp, "registered at the gateway")
	}
	s.logGatewayCall(ctx, sess.ID, "register", req.IdempotencyKey, started, gerr)
	return s.registrationFailed(ctx, actor, sess, gerr, sent)
}

// registrationFailed applies a registration the gateway did not answer with a payment: a
// Registering session becomes Failed (a definitive refusal), Unknown (the gateway may have
// acted) or stays Registering, due again (not sent). An Unknown session the patrol registered
// again (nothing found under its reference first) becomes Failed on a definitive refusal too:
// the gateway refused the request itself and made nothing under its key, and asking again for
// days would keep the order blocked behind a payment that never existed (an outside review).
// Any other failure leaves an Unknown session as it is, for the next look.
func (s *Service) registrationFailed(ctx context.Context, actor Actor, sess Session, gerr error, sent time.Time) (Session, error) {
	// The request's context may be gone (client hung up); the outcome must still be written.
	ctx, done := s.detachRecord(ctx)
	defer done()
	now := s.cfg.Clock.Now()
	refused := FailureOf(gerr) == FailureDefinitive
	_, leased := leaseOf(ctx, sess.ID)
	var out Session
	err := s.inTx(ctx, "register: apply", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sess.ID)
		if err != nil {
			return err
		}
		if cur.Status != StatusRegistering && (cur.Status != StatusUnknown || !refused || cur.GatewayPaymentID != "") {
			out = cur // someone (sweeper, webhook) got there first
			return nil
		}
		switch FailureOf(gerr) {
		case FailureDefinitive:
			// A patrol drive's lease ends with the state, its look counted (sessionPatch.endLease).
			out, err = applyTransition(ctx, tx, sess.ID, StatusFailed, actor, "gateway refused registration: "+gerr.Error(), now, sessionPatch{endLease: leased})
		case FailureNotSent:
			next := now.Add(s.cfg.Backoff[0])
			_, err = tx.Exec(ctx, `UPDATE payment_sessions SET next_check_at = $2, updated_at = $3 WHERE id = $1`, sess.ID, next, now)
			out = cur
			out.NextCheckAt = &next
		default:
			// Not before the registration can no longer be in flight (RegisterGrace from its
			// send, as the claim set it from the claim): a request cut a second after sending
			// (the replica's stop, the client gone) was given the schedule's first step, and the
			// patrol looked up by reference, found nothing yet and registered beside it (an
			// outside review, stop; a patrol drive's timed-out one alike, a review).
			next := now.Add(s.cfg.Backoff[0])
			if grace := sent.Add(s.cfg.RegisterGrace); mayBeInFlight(gerr) && grace.After(next) {
				next = grace
			}
			out, err = applyTransition(ctx, tx, sess.ID, StatusUnknown, actor, "no trustworthy answer to registration: "+gerr.Error(), now, sessionPatch{nextCheckAt: &next})
		}
		return err
	})
	return out, err
}

// inFlightStatuses are the answers of a proxy in front of the gateway whose upstream may still
// be working on the request: 502, 504, and 408 (it gave up waiting; refgw and stripegw read it
// unknown for that reason, and a cancel registered beside one: a review); Cloudflare's 524 (a
// connection to the origin made, its answer not in time) and 520 (the origin's connection ended
// unexpectedly), which a gateway behind it answers so. Not 522 or 523: no connection was made.
var inFlightStatuses = []int32{http.StatusRequestTimeout, http.StatusBadGateway, http.StatusGatewayTimeout, 520, 524}

// inFlightStatus is inFlightStatuses as a set.
var inFlightStatus = func() map[int]bool {
	set := map[int]bool{}
	for _, st := range inFlightStatuses {
		set[int(st)] = true
	}
	return set
}()

// mayBeInFlight says whether a call that failed with err may still be processed by the gateway
// (registrationInFlight reads the call log by the same rule):
// it got no answer (a timeout, a broken connection, a cut by our stop), or a proxy's in front of
// it (inFlightStatus: the upstream may be working on it still). A gateway that answered, even 5xx,
// has stopped working on it; one that was never reached has nothing to work on.
func mayBeInFlight(err error) bool {
	var ge *GatewayError
	if FailureOf(err) != FailureUnknown {
		return false
	}
	return !errors.As(err, &ge) || ge.HTTPStatus == 0 || inFlightStatus[ge.HTTPStatus]
}

// registrationInFlight is until when a registration of the session that was sent and not
// answered may still be processed by the gateway (mayBeInFlight: no answer at all, not even a
// 5xx): RegisterGrace after its last such register call was logged (a call cut by the stop or by
// its own timeout is logged as it is given up); the zero time when there is none.
func registrationInFlight(ctx context.Context, tx pgx.Tx, sessionID string, now time.Time, grace time.Duration) (time.Time, error) {
	return callInFlight(ctx, tx, "payment_sessions", `session_id = $1 AND operation = 'register'`, sessionID, now, grace)
}

// refundInFlight is registrationInFlight for a refund's requests (logged under its id).
func refundInFlight(ctx context.Context, tx pgx.Tx, refundID string, now time.Time, grace time.Duration) (time.Time, error) {
	return callInFlight(ctx, tx, "refunds", `idempotency_key = $1 AND operation = 'refund'`, refundID, now, grace)
}

// callInFlight is until when the last of the gateway calls that which ($1: id) selects, sent and
// not answered (mayBeInFlight's rule) within grace before now, may still be processed — or a
// send held for row id of table (send_held_at) within grace whose call was never logged: its log
// row is written after the call and may be lost (a drive cut by a stop, the session's row locked
// past lock_timeout), and finance's Retry made the row due at once beside it (a review of this
// session's send_held_at). A hold is taken only right before a send (drive, driveReverse).
func callInFlight(ctx context.Context, tx pgx.Tx, table, which, id string, now time.Time, grace time.Duration) (time.Time, error) {
	var last *time.Time
	if err := tx.QueryRow(ctx, `SELECT greatest(
			(SELECT max(created_at) FROM gateway_calls WHERE `+which+` AND created_at > $2
				AND outcome = 'unknown' AND (http_status IS NULL OR http_status = ANY($3))),
			(SELECT t.send_held_at FROM `+table+` t WHERE t.id = $1::uuid AND t.send_held_at > $2
				AND NOT EXISTS (SELECT FROM gateway_calls WHERE `+which+` AND created_at >= t.send_held_at)))`,
		id, now.Add(-grace), inFlightStatuses).Scan(&last); err != nil {
		return time.Time{}, dbError("gateway calls in flight", err, "")
	}
	if last == nil {
		return time.Time{}, nil
	}
	return last.Add(grace), nil
}

// holdForRegistration makes a session due no earlier than until() — read once the order →
// session locks (and its lease, lockOrderAndSession) are held — : a registration sent and not
// answered may be in flight until then, or one about to be sent (holdForSend); the release of
// a leased one keeps the later of its step and this.
func (s *Service) holdForRegistration(ctx context.Context, sess Session, until func() time.Time) error {
	ctx, done := s.detachRecord(ctx)
	defer done()
	return s.inTx(ctx, "register: hold", func(tx pgx.Tx) error {
		if _, err := lockOrderAndSession(ctx, tx, sess.OrderID, sess.ID); err != nil {
			return err
		}
		// Only a session still waiting for its registration's word, and not in finance's hands:
		// a settled one has no next look, a flagged one none until finance sends it back
		// (RetryFlagged then waits out the same registration).
		_, err := tx.Exec(ctx, `UPDATE payment_sessions SET next_check_at = greatest(next_check_at, $2), send_held_at = $3
			WHERE id = $1 AND status IN ('Registering', 'Unknown', 'Canceling') AND flagged_at IS NULL`, sess.ID, until(), s.cfg.Clock.Now())
		return err
	})
}

// errPatrolsNow: a late sender's hold (holdLateSend) found its row no longer its own to send.
var errPatrolsNow = errors.New("no longer this request's to send: the patrol's")

// lateSender is a row whose first send to the gateway the request that claimed it makes without
// a lease (a Create's session, a refund), and how holdLateSend holds it.
type lateSender struct {
	op     string // names the hold's transaction
	table  string // payment_sessions or refunds
	status string // the row's status until its first answer
	calls  string // SQL over $1 (the row's id): a gateway call logged for it
	lock   func(ctx context.Context, tx pgx.Tx) error
}

// lateSession is a late Create's session, locked order → session as every transition is.
func lateSession(sess Session) lateSender {
	return lateSender{op: "create: hold for a late send", table: "payment_sessions", status: string(StatusRegistering),
		calls: `session_id = $1`,
		lock: func(ctx context.Context, tx pgx.Tx) error {
			_, err := lockOrderAndSession(ctx, tx, sess.OrderID, sess.ID)
			return err
		}}
}

// lateRefund is a refund's first send by the request that claimed it; its row alone is locked.
func lateRefund(r Refund) lateSender {
	return lateSender{op: "refund: hold for a late send", table: "refunds", status: string(RefundPending),
		calls: `idempotency_key = $1::text`,
		lock: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT FROM refunds WHERE id = $1 FOR UPDATE`, r.ID)
			return err
		}}
}

// holdLateSend is the hold before a first send that comes more than lateSend after its claim
// (holdForSend's for a sender without a lease): the row (id, claimed at claimed) is made due no
// sooner than RegisterGrace from the time read once its locks are held — and only while it is
// still the sender's alone: in its first status, not flagged, never leased nor looked at by the
// patrol (no lease, no look counted, no send held for it — send_held_at, written before a send
// goes, where the call's log row is written after and may be lost — no gateway call logged since
// its claim) and not yet due.
// Otherwise errPatrolsNow, and the request leaves the row to the patrol. A late Create's hold
// waited for the order's row (or a connection) past the claim's grace; the patrol meanwhile
// claimed the session, looked it up and registered it under its lease; the hold then took the
// row and the Create sent its registration beside the patrol's: two payments at a gateway that
// ignores keys (a review of the lease edge). A refund's late first send was not held at all: a
// replica dying with it on the wire left it due at its claim's grace, and the patrol sent it
// again (a review of late refund sends).
func (s *Service) holdLateSend(ctx context.Context, row lateSender, id string, claimed time.Time) error {
	ctx, done := s.detachRecord(ctx)
	defer done()
	if h := s.cfg.Hooks.BeforeLateHold; h != nil {
		h(ctx, id)
	}
	return s.inTx(ctx, row.op, func(tx pgx.Tx) error {
		if err := row.lock(ctx, tx); err != nil {
			return dbError(row.op, err, "")
		}
		now := s.cfg.Clock.Now()
		tag, err := tx.Exec(ctx, `UPDATE `+row.table+` t SET next_check_at = greatest(t.next_check_at, $3), send_held_at = $2
			WHERE t.id = $1 AND t.status = '`+row.status+`' AND t.flagged_at IS NULL AND t.lease_token IS NULL AND t.check_attempts = 0
				AND t.send_held_at IS NULL AND t.next_check_at > $2
				AND NOT EXISTS (SELECT FROM gateway_calls WHERE created_at >= $4 AND `+row.calls+`)`,
			id, now, now.Add(s.cfg.RegisterGrace), claimed)
		if err != nil {
			return dbError(row.op, err, "")
		}
		if tag.RowsAffected() == 0 {
			return errPatrolsNow
		}
		return nil
	})
}

// linkGeneration is the generation a Pay click's link was made in: its CheckoutLinkGen, or
// NoLinkGeneration (judged by amount and currency alone).
func (in CreateInput) linkGeneration() int64 {
	if in.CheckoutLinkGen == nil {
		return NoLinkGeneration
	}
	return *in.CheckoutLinkGen
}

func validUUID(s string) bool {
	_, err := uuid.Parse(s)
	return err == nil && len(s) == 36
}
