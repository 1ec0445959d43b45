package payments

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Idempotency keys (design.md, "Idempotency"; the second seed article).
//
// A key belongs to one API client and to the user's intent, not to a network attempt: every retry
// of one Pay click carries the same key. Keys live in PostgreSQL (table idempotency_keys), never in
// a cache, for 30 days — longer than any client's retry window — and a reaper deletes them after.
//
// Protocol for one request — Run is its one owner; the API handlers call Run with their effect:
//
//  1. Validate and authenticate first: a request refused before Run never touches its key.
//  2. Acquire: a fresh key is one autocommit INSERT … ON CONFLICT DO NOTHING RETURNING (the
//     primary key lets exactly one of two concurrent inserts create the row). A key that exists
//     is decided in one short transaction under pg_advisory_xact_lock(ns, hashtext(client/key)):
//     the INSERT again (the row may have been released or reaped since), else read the row FOR
//     UPDATE and decide: another request (fingerprint differs) → EINVALID (422); completed →
//     replay its resource as it is NOW; in flight and its lock not yet stale → EBUSY (409 +
//     Retry-After); in flight but stale (its request died) or abandoned → take it over. No lock
//     is held after this transaction.
//  3. Do the work (the effect: Create's claim transaction then the gateway, no key lock held).
//  4. Complete (resource id + response code), or Release when the work failed before any effect
//     (the key is not burnt: the client may fix the request and use it again; never an intent,
//     whose use outlives a refusal: giveUp), or Abandon when
//     the outcome is uncertain (the row stays bound to this request and the same request may
//     take it over at once; the core's per-order claim makes running Create again safe). An
//     intent key is completed by the effect's own transaction where the effect offers one
//     (Create's claim, KeyBinding): bound to its session from then on, whatever follows.
//
// The staleness bound: a request that crashed between Acquire and Complete leaves locked_until
// behind. It must outlast any honest request (one register call bounded by GATEWAY_TIMEOUT, plus
// short transactions), so the default is 2 × GATEWAY_TIMEOUT + 10 s (StaleAfterFor). A slow
// request that loses its lock to a takeover finds Complete refused (ErrIdempotencyLockLost); it
// still answers its client, and the taker-over's Create finds the same session.
//
// Intent keys (requests without an Idempotency-Key) slide: each identical request keeps the
// intent alive for IntentWindow from itself (its row's expires_at moves), so a burst of retries
// is one intent however it falls on the clock, and the same operation after IntentWindow of
// silence is a new intent. No clock boundary splits a burst.

// IdempotencyKind separates client keys from derived business-intent keys in one table.
type IdempotencyKind string

const (
	// IdempotencyClientKey is a client's Idempotency-Key header.
	IdempotencyClientKey IdempotencyKind = "key"
	// IdempotencyIntentKey is derived from the business operation when the client sent no key.
	IdempotencyIntentKey IdempotencyKind = "intent"
)

// Defaults of IdempotencyConfig.
const (
	DefaultIdempotencyTTL   = 30 * 24 * time.Hour
	DefaultIntentWindow     = 5 * time.Minute
	defaultGatewayTimeout   = 10 * time.Second
	idempotencyStaleMargin  = 10 * time.Second
	DefaultReapBatch        = 1000
	maxIdempotencyKeyLength = 255
)

// StaleAfterFor is how long a request may hold a key before its lock counts as abandoned:
// twice the gateway timeout (one register call, and whatever retry a client library adds around
// it) plus a margin for the short transactions around it.
func StaleAfterFor(gatewayTimeout time.Duration) time.Duration {
	if gatewayTimeout <= 0 {
		gatewayTimeout = defaultGatewayTimeout
	}
	return 2*gatewayTimeout + idempotencyStaleMargin
}

// IntentGraceFor is how long past its window an intent (a keyless request's key) stays alive
// for a request that read its time inside the window: the longest such a request may take to
// reach its key — its whole bound, web.RequestTimeoutFor (3 × GATEWAY_TIMEOUT + 25 s), a pool
// connection's wait included — and 5 s for the replicas' clocks (DatabaseClock keeps them within
// milliseconds of the database's). 60 s at the default GATEWAY_TIMEOUT.
func IntentGraceFor(gatewayTimeout time.Duration) time.Duration {
	if gatewayTimeout <= 0 {
		gatewayTimeout = defaultGatewayTimeout
	}
	return 3*gatewayTimeout + 30*time.Second
}

// ErrIdempotencyLockLost: Complete/Release/Abandon found the key no longer held by this request
// (its lock went stale and another request took it over).
var ErrIdempotencyLockLost = errors.New("idempotency key lock lost to a takeover")

// IdempotencyHooks stop Acquire at a precise point so tests build interleavings on purpose.
type IdempotencyHooks struct {
	// AfterAcquireRead runs inside Acquire's transaction for a key that already existed, with the
	// advisory lock held, after the row was inserted or read and before the decision is returned.
	// A fresh key's single INSERT has no transaction to stop in (tests park it on the row lock
	// of its client, which the INSERT's foreign key takes).
	AfterAcquireRead func(ctx context.Context, key string)
	// AfterLetGo runs when a key's last write that failed and was retried in the background
	// (retryLater: what names it, "abandon", "release", "complete") is done: err nil once it
	// was written (or nothing was left to write), else why it was given up.
	AfterLetGo func(key, what string, err error)
	// AfterLetGoTry runs after each try of such a write, with its error.
	AfterLetGoTry func(key, what string, err error)
}

// IdempotencyConfig configures an Idempotency. Zero values get the defaults.
type IdempotencyConfig struct {
	// StaleAfter: a lock older than this may be taken over (default StaleAfterFor(10s) = 30s).
	StaleAfter time.Duration
	// TTL of client keys (default 30 days).
	TTL time.Duration
	// IntentWindow: a request without a key is the same intent as an identical one of the same
	// client within IntentWindow before it (default 5 minutes). The window slides: every
	// identical request extends it; an intent row lives that long, and IntentGraceFor more for a
	// request that read its time inside the window and reaches the key late (Acquire).
	IntentWindow time.Duration
	Hooks        IdempotencyHooks
	// OnConflict, when set, is told of every request refused because of its key (reason
	// ConflictInProgress: 409, the key's first request still runs; ConflictReused: 422, the key
	// was used with another request). The server counts them for its metrics
	// (pitlane_idempotency_conflicts_total): a spike means a client retries too eagerly or
	// reuses keys across requests.
	OnConflict func(kind IdempotencyKind, reason string)
}

// Reasons given to IdempotencyConfig.OnConflict.
const (
	ConflictInProgress = "in_progress"
	ConflictReused     = "reused"
)

// Idempotency is the key store over the service's database and clock.
type Idempotency struct {
	svc *Service
	cfg IdempotencyConfig
}

// NewIdempotency builds the key store for a service.
func NewIdempotency(svc *Service, cfg IdempotencyConfig) *Idempotency {
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = StaleAfterFor(0)
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultIdempotencyTTL
	}
	if cfg.IntentWindow <= 0 {
		cfg.IntentWindow = DefaultIntentWindow
	}
	return &Idempotency{svc: svc, cfg: cfg}
}

// Config returns the effective configuration.
func (x *Idempotency) Config() IdempotencyConfig { return x.cfg }

// IdempotencyRequest names one key and the request that uses it.
type IdempotencyRequest struct {
	ClientID string
	Kind     IdempotencyKind
	Key      string
	Method   string
	Path     string
	// Fingerprint identifies the request (Fingerprint(method, path, canonical body)); the same
	// key with another fingerprint is refused.
	Fingerprint []byte
	// BusyRunsEffect: for an intent key whose first request still runs, Run runs the effect
	// anyway, without the key, instead of answering EBUSY. Only for an effect that is itself
	// idempotent for the business operation: Create, whose per-order claim answers "same
	// parameters → this session", so identical keyless Creates arriving together all get the one
	// session (200/201/202), never a 409 (contract: "Keyless requests"); and a refund, whose
	// effect gets the slot's Since (the use the holder runs under) and so the holder's own
	// RequestKey: under the payment's locks the one refund of that key is made once and found
	// by the other ("is the same refund").
	BusyRunsEffect bool
}

// Fingerprint is SHA-256 over method, path and the canonical body, with separators that cannot
// occur in a method or path.
func Fingerprint(method, path string, canonicalBody []byte) []byte {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write(canonicalBody)
	return h.Sum(nil)
}

// IntentKey derives the business-intent key of a Create without an Idempotency-Key: the same
// order, amount and currency. Whether a request is the same intent as an earlier one is decided
// by time, in Acquire (the window slides with each request), not by the string. The client is
// the row's scope, not part of the string.
func IntentKey(orderID string, amount int64, currency string) string {
	return fmt.Sprintf("create/%s/%d/%s", orderID, amount, currency)
}

// RefundIntentKey is the business-intent key of a refund without an Idempotency-Key: the same
// payment and amount. The "refund/" prefix keeps it apart from Create's keys in the intent
// namespace. Its row is RefundIntentOwner's, whichever client asks.
func RefundIntentKey(paymentID string, amount int64) string {
	return fmt.Sprintf("refund/%s/%d", paymentID, amount)
}

// RefundIntentOwner is the reserved API client (migration 00590; never a credential) that owns
// every keyless refund's intent: the same refund asked for by two clients within the window is
// one refund, as it is for one client (a key rotation half-way, two services of one shop). A
// Create's intent needs no such owner: the order's lock makes identical Creates one session
// whoever asks.
const RefundIntentOwner = "00000000-0000-0000-0000-000000000000"

// Slot is Acquire's answer when the request may go on.
type Slot struct {
	// Token is set when this request now holds the key: it must Complete, Release or Abandon it.
	Token string
	// TookOver: the key was held by a request whose lock went stale (it may still be running).
	TookOver bool
	// Fresh: this request began a new use of the key (its row did not exist or had expired), so
	// no earlier request of this key ran an effect in this use.
	Fresh bool
	// Done: the key's request completed earlier; replay ResourceID as it is now, with the first
	// request's ResponseCode.
	Done         bool
	ResourceID   string
	ResponseCode int
	CompletedAt  time.Time
	// Since is when this use of the key began (the row's created_at): a key reused after it
	// expired is a new use with a new Since, so effects bound to (key, Since) are not confused
	// with the old use's.
	Since time.Time
	// Binding is set by Run for an intent key this request holds: an effect that creates its
	// resource in a transaction of its own may complete the key there (CreateInput.Bind).
	Binding *KeyBinding
}

// KeyBinding completes an intent key in the transaction that creates the key's resource — for
// Create, the claim's, with its session — instead of a round trip of its own after the effect.
// From that commit on, the key points at the session: an identical keyless request replays it
// (200, as it is now) while the first one is still at the gateway. Only intent keys bind early:
// their replays always answer 200, so the response code is not waiting on the gateway's answer;
// a client key keeps the first answer's code and is completed by Run after the effect.
//
// A client key is not completed there, but its resource is recorded (recordOnly): if the request
// then fails (the gateway's answer could not be written, the connection broke after the commit)
// and gives the key up, the same request sent again replays that resource (Acquire's takeover)
// instead of running the effect again — which could answer 409 "already paid" or make a second
// session once the first had ended.
type KeyBinding struct {
	r          IdempotencyRequest
	token      string
	recordOnly bool // a client key: record the resource, leave the completion to Run
	matched    bool // the completion found the key still held by this request (set in the pipeline)
	bound      bool // … and its transaction committed
}

// completeKeySQL records a key's resource and response code and ends its request's hold, only
// while that request still holds it (lock_token).
var completeKeySQL = `UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL,
		resource_id = $5, response_code = $6, completed_at = $7, expires_at = ` + keyLivesOn("$7") + `
		WHERE client_id = $1 AND kind = $2 AND key = $3 AND lock_token = $4`

// keyAfterUse is how long at least a client's key lives past the end of a use's last request
// (keyLivesOn): a key taken over or completed just before its TTL ran out is still there for
// that request's own retry — one that lost its answer replays it rather than starting a new use
// (a second refund) a second after the TTL. An hour, as long as IdempotencyReapGrace and for the
// same reason: longer than any request's bound.
const keyAfterUse = time.Hour

// keyLivesOn is the SQL for a key row's expires_at once a request of its use holds it until, or
// completed it at, the timestamptz at param: a client's key lives keyAfterUse past that; an
// intent's window is its own (it slides with each identical request, Acquire).
func keyLivesOn(param string) string {
	return fmt.Sprintf(`CASE WHEN kind = '%s' THEN expires_at ELSE greatest(expires_at, %s::timestamptz + interval '%d seconds') END`,
		IdempotencyIntentKey, param, int(keyAfterUse.Seconds()))
}

// recordKeySQL records the resource a client key's request created, while that request still
// holds the key; Run completes it after the effect with the answer's code.
const recordKeySQL = `UPDATE idempotency_keys SET resource_id = $5
		WHERE client_id = $1 AND kind = $2 AND key = $3 AND lock_token = $4 AND completed_at IS NULL`

func (kb *KeyBinding) statement() string {
	if kb.recordOnly {
		return recordKeySQL
	}
	return completeKeySQL
}

// queueHolds adds to b a read of whether this request still holds its client key, locking the
// key's row until b's transaction ends; *holds is true for an intent's binding or none (they
// need no such read). A client key's request that was slower than StaleAfter before its claim
// may have lost the key to the same request sent again, and that one may have ended its payment
// since (refused, declined): the slow one's claim then made a second session and registration
// for one key, which no replay of the key returned (an outside review). Read under the lock,
// a takeover waits for the claim and finds the resource it records.
func (kb *KeyBinding) queueHolds(b *pgx.Batch, holds *bool) {
	*holds = true
	if kb == nil || !kb.recordOnly {
		return
	}
	b.Queue(`SELECT coalesce(lock_token = $4::uuid, false) AND completed_at IS NULL FROM idempotency_keys
		WHERE client_id = $1 AND kind = $2 AND key = $3 FOR UPDATE`, kb.r.ClientID, string(kb.r.Kind), kb.r.Key, kb.token).
		QueryRow(func(r pgx.Row) error {
			err := r.Scan(holds)
			if errors.Is(err, pgx.ErrNoRows) {
				*holds = false
				return nil
			}
			return err
		})
}

// queue adds the key's completion with resourceID to a batch that will commit with it. Call
// committed once the batch's transaction committed.
func (kb *KeyBinding) queue(b *pgx.Batch, resourceID string, now time.Time) {
	b.Queue(kb.statement(), kb.completion(resourceID, now)...).
		Exec(func(tag pgconn.CommandTag) error {
			kb.matched = tag.RowsAffected() == 1
			return nil
		})
}

// exec completes the key with resourceID in the caller's transaction (one statement of its
// own, where the effect has no batch to queue it in). Call committed once that transaction
// committed.
func (kb *KeyBinding) exec(ctx context.Context, tx pgx.Tx, resourceID string, now time.Time) error {
	tag, err := tx.Exec(ctx, kb.statement(), kb.completion(resourceID, now)...)
	if err != nil {
		return dbError("idempotency: bind", err, "")
	}
	kb.matched = tag.RowsAffected() == 1
	return nil
}

// completion is completeKeySQL's arguments for resourceID. 202: the resource exists, its
// outcome is not confirmed yet; an intent replay answers by the resource's state whatever is
// recorded (API.replay, API.replayRefund).
func (kb *KeyBinding) completion(resourceID string, now time.Time) []any {
	if kb.recordOnly {
		return []any{kb.r.ClientID, string(kb.r.Kind), kb.r.Key, kb.token, resourceID}
	}
	return []any{kb.r.ClientID, string(kb.r.Kind), kb.r.Key, kb.token, resourceID, 202, now}
}

func (kb *KeyBinding) committed() {
	if kb != nil && !kb.recordOnly {
		kb.bound = kb.matched
	}
}

// Bound reports whether the key was completed with its resource by the effect's transaction.
func (kb *KeyBinding) Bound() bool { return kb != nil && kb.bound }

func (x *Idempotency) lockNamespace(k IdempotencyKind) LockNamespace {
	if k == IdempotencyIntentKey {
		return LockIntentKey
	}
	return LockIdempotencyKey
}

func (x *Idempotency) validate(r IdempotencyRequest) error {
	if !validUUID(r.ClientID) {
		return fmt.Errorf("idempotency: client id %q is not a UUID", r.ClientID)
	}
	if r.Kind != IdempotencyClientKey && r.Kind != IdempotencyIntentKey {
		return fmt.Errorf("idempotency: unknown kind %q", r.Kind)
	}
	if r.Key == "" || len(r.Key) > maxIdempotencyKeyLength {
		return Invalid("Idempotency-Key", "Idempotency-Key must be 1-255 printable ASCII characters")
	}
	if len(r.Fingerprint) == 0 {
		return fmt.Errorf("idempotency: empty fingerprint")
	}
	return nil
}

// lock takes the transaction-scoped advisory lock of one key: every decision about a key is made
// by one transaction at a time, across replicas.
func (x *Idempotency) lock(ctx context.Context, tx pgx.Tx, r IdempotencyRequest) error {
	if _, err := tx.Exec(ctx, lockKeySQL, int32(x.lockNamespace(r.Kind)), r.ClientID+"/"+r.Key); err != nil {
		return dbError("idempotency: lock", err, "")
	}
	return nil
}

const lockKeySQL = `SELECT pg_advisory_xact_lock($1, hashtext($2))`

// queueLock is lock as the first statement of a batch.
func (x *Idempotency) queueLock(b *pgx.Batch, r IdempotencyRequest) {
	b.Queue(lockKeySQL, int32(x.lockNamespace(r.Kind)), r.ClientID+"/"+r.Key).Exec(func(pgconn.CommandTag) error { return nil })
}

// acquireInsertSQL creates a key's row held by the request, unless the key exists.
const acquireInsertSQL = `INSERT INTO idempotency_keys
	(client_id, kind, key, fingerprint, method, path, lock_token, locked_until, created_at, expires_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
	ON CONFLICT (client_id, kind, key) DO NOTHING
	RETURNING lock_token::text`

// Acquire claims a key for a request, or says what became of it (see the protocol above).
// Errors: EINVALID (the key was used with another request: 422), EBUSY (its request still runs:
// 409 + Retry-After), EUNAVAIL (lock timeout), internal.
func (x *Idempotency) Acquire(ctx context.Context, r IdempotencyRequest) (Slot, error) {
	if err := x.validate(r); err != nil {
		return Slot{}, err
	}
	now := x.svc.cfg.Clock.Now()
	ttl := x.cfg.TTL
	if r.Kind == IdempotencyIntentKey {
		ttl = x.cfg.IntentWindow // and every identical request moves it on (slide, below)
	}
	token := uuid.NewString()
	lockedUntil := now.Add(x.cfg.StaleAfter)
	args := []any{r.ClientID, string(r.Kind), r.Key, r.Fingerprint, r.Method, r.Path, token, lockedUntil, now, now.Add(ttl)}
	// A fresh key — every keyless Create of a new order, every first use of a client's key — is
	// one autocommit INSERT: no transaction, no advisory lock. The primary key decides between
	// two requests inserting the same key at once: the second one's INSERT waits for the first
	// one's to commit and then finds the row (DO NOTHING, no row returned), and goes on to the
	// locked path below, which reads the row under the key's lock. The wait is bounded by the
	// other statement: an autocommit INSERT, or a locked-path transaction (which runs under
	// lock_timeout and holds no lock across anything slow). A key that exists (in flight,
	// completed, expired, released under us) is decided only under the lock.
	var got string
	err := x.svc.db.QueryRow(ctx, acquireInsertSQL, args...).Scan(&got)
	switch {
	case err == nil:
		return Slot{Token: got, Fresh: true, Since: now.Truncate(time.Microsecond)}, nil
	case !errors.Is(err, pgx.ErrNoRows):
		// The INSERT may have committed with its answer lost (a connection cut after the
		// server's commit: a failover): the key would then stay held by this request, which
		// answers 503, and the same request again was refused 409 "in progress" until
		// StaleAfter (an outside review, dbfail). The key is let go of by its token.
		x.abandonLater(r, token, err)
		return Slot{}, dbError("idempotency: insert", err, "")
	}
	var out Slot
	var busySince time.Time
	busy, reused := false, false
	mayHaveCommitted, err := x.svc.inTxCommit(ctx, "idempotency: acquire", func(tx pgx.Tx) error {
		// Two tries: the reaper (which does not take the advisory lock) may delete an expired
		// row between the conflicting INSERT and the read.
		for try := range 2 {
			var err error
			if try == 0 {
				// The key's lock and the first INSERT in one round trip: a pipelined batch, run by
				// the server one statement after the other, so the INSERT runs under the lock.
				var b pgx.Batch
				x.queueLock(&b, r)
				b.Queue(acquireInsertSQL, args...).QueryRow(func(row pgx.Row) error {
					err = row.Scan(&got)
					return nil
				})
				if berr := tx.SendBatch(ctx, &b).Close(); berr != nil {
					return dbError("idempotency: lock", berr, "")
				}
			} else {
				err = tx.QueryRow(ctx, acquireInsertSQL, args...).Scan(&got)
			}
			if err == nil {
				out = Slot{Token: got, Fresh: true, Since: now.Truncate(time.Microsecond)}
				x.afterRead(ctx, r)
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return dbError("idempotency: insert", err, "")
			}
			var (
				fp           []byte
				holder       *string
				lockedTill   *time.Time
				resourceID   *string
				responseCode *int
				completedAt  *time.Time
				expiresAt    time.Time
				since        time.Time
			)
			err = tx.QueryRow(ctx, `SELECT fingerprint, lock_token::text, locked_until, resource_id::text, response_code,
				completed_at, expires_at, created_at FROM idempotency_keys WHERE client_id = $1 AND kind = $2 AND key = $3 FOR UPDATE`,
				r.ClientID, string(r.Kind), r.Key).Scan(&fp, &holder, &lockedTill, &resourceID, &responseCode, &completedAt, &expiresAt, &since)
			if errors.Is(err, pgx.ErrNoRows) {
				continue // reaped under us: insert again
			}
			if err != nil {
				return dbError("idempotency: read", err, "")
			}
			x.afterRead(ctx, r)
			// An intent is alive IntentGraceFor(GATEWAY_TIMEOUT) past its expires_at: a request
			// that read its time inside the window and then waited (a connection, the key's lock,
			// a replica whose clock runs behind) may still be on its way, and a later identical
			// request that reached the key first started a new use under it — R1 at 14m59s
			// waiting, its client's retry R2 at 15m00.5s renewed the intent and refunded again,
			// then R1 replayed R2's refund: two refunds for one chain (an outside review of
			// clock-order decisions; the stale bound first chosen was shorter than a request's
			// own bound, a review of that fix). A new intent starts only after that much quiet.
			// A client's key is alive while a request of its use holds it, whatever its age: a
			// use taken over just before its TTL ran out and still running was handed to an
			// identical request at the TTL as a new use (a new Since), and a refund keyed by that
			// ran beside the first (a review of time windows). Taken over or completed, a key
			// lives keyAfterUse past that (keyLivesOn).
			live := expiresAt.After(now) || holder != nil && lockedTill != nil && lockedTill.After(now)
			if r.Kind == IdempotencyIntentKey {
				live = expiresAt.Add(IntentGraceFor(x.svc.cfg.GatewayTimeout)).After(now)
			}
			if r.Kind == IdempotencyIntentKey && live {
				// The window slides: this identical request keeps the intent alive for another
				// IntentWindow, whatever it is answered (replay, busy, takeover). Only forward: a
				// request of the same burst that read its time earlier (it waited for a
				// connection or the key's lock) and slides after a later one must not move the
				// window back, or a repeat inside it is a new intent (a second refund).
				if _, err := tx.Exec(ctx, `UPDATE idempotency_keys SET expires_at = greatest(expires_at, $4)
					WHERE client_id = $1 AND kind = $2 AND key = $3`, r.ClientID, string(r.Kind), r.Key, now.Add(ttl)); err != nil {
					return dbError("idempotency: slide", err, "")
				}
			}
			switch {
			case !live:
				// Expired but not reaped yet: as good as absent. Start it afresh.
				if _, err := tx.Exec(ctx, `UPDATE idempotency_keys SET fingerprint = $4, method = $5, path = $6,
					lock_token = $7, locked_until = $8, resource_id = NULL, response_code = NULL, completed_at = NULL,
					created_at = $9, expires_at = $10 WHERE client_id = $1 AND kind = $2 AND key = $3`,
					r.ClientID, string(r.Kind), r.Key, r.Fingerprint, r.Method, r.Path, token, lockedUntil, now, now.Add(ttl)); err != nil {
					return dbError("idempotency: renew", err, "")
				}
				out = Slot{Token: token, Fresh: true, Since: now.Truncate(time.Microsecond)}
				return nil
			case !bytes.Equal(fp, r.Fingerprint):
				reused = true
				return Invalid("Idempotency-Key", "this Idempotency-Key was already used with another request (method, path or body differ); use a new key for a new request")
			case completedAt != nil:
				out = Slot{Done: true, ResourceID: deref(resourceID), CompletedAt: *completedAt, Since: since}
				if responseCode != nil {
					out.ResponseCode = *responseCode
				}
				return nil
			case holder != nil && lockedTill != nil && lockedTill.After(now):
				busy, busySince = true, since // committed: the slide above must stay
				return nil
			}
			if resourceID != nil {
				// Held by a request that died or gave up after its effect's transaction had
				// recorded the resource it created (KeyBinding.recordOnly): the effect happened.
				// The key is completed with that resource and the same request replays it.
				if _, err := tx.Exec(ctx, `UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL, completed_at = $4,
					expires_at = `+keyLivesOn("$4")+` WHERE client_id = $1 AND kind = $2 AND key = $3`, r.ClientID, string(r.Kind), r.Key, now); err != nil {
					return dbError("idempotency: complete recorded", err, "")
				}
				out = Slot{Done: true, ResourceID: *resourceID, CompletedAt: now, Since: since}
				return nil
			}
			// Held by a request that died (lock stale) or that gave up with an uncertain outcome:
			// the same request takes it over.
			if _, err := tx.Exec(ctx, `UPDATE idempotency_keys SET lock_token = $4, locked_until = $5, expires_at = `+keyLivesOn("$5")+`
				WHERE client_id = $1 AND kind = $2 AND key = $3`, r.ClientID, string(r.Kind), r.Key, token, lockedUntil); err != nil {
				return dbError("idempotency: take over", err, "")
			}
			out = Slot{Token: token, TookOver: holder != nil, Since: since}
			return nil
		}
		return fmt.Errorf("idempotency: key %q vanished twice while acquiring", r.Key)
	})
	if err != nil {
		if reused {
			x.conflict(r, ConflictReused)
			return Slot{}, err
		}
		if mayHaveCommitted && out.Token != "" {
			// Its COMMIT may have taken the key under token (as above). A transaction that
			// failed before its COMMIT went out (a context cut mid-statement, a connection lost
			// while it read), or that took nothing under token (the key busy, completed, or
			// completed with its recorded resource: out carries no token), has nothing to let go
			// of: a let-go then held one of the background's slots until the stale bound,
			// finding nothing (a re-read; a review of its first fix).
			x.abandonLater(r, token, err)
		}
		return Slot{}, err
	}
	if busy {
		if r.Kind != IdempotencyIntentKey || !r.BusyRunsEffect { // otherwise Run answers it anyway
			x.conflict(r, ConflictInProgress)
		}
		// The use the holder runs under (Since) comes back with the refusal: Run's
		// BusyRunsEffect hands it to the effect.
		return Slot{Since: busySince}, Errorf(EBUSY, "a request with this key is still in progress; retry shortly")
	}
	return out, nil
}

func (x *Idempotency) conflict(r IdempotencyRequest, reason string) {
	if x.cfg.OnConflict != nil {
		x.cfg.OnConflict(r.Kind, reason)
	}
}

func (x *Idempotency) afterRead(ctx context.Context, r IdempotencyRequest) {
	if h := x.cfg.Hooks.AfterAcquireRead; h != nil {
		h(ctx, r.Key)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Effect is the work of one idempotent request, run by Run once the request holds its key (or,
// with BusyRunsEffect, without it: then slot is the zero Slot). It returns the id of the
// resource it created or found and the response code the key remembers for replays.
type Effect func(ctx context.Context, slot Slot) (resourceID string, status int, err error)

// Outcome is what Run did for a request.
type Outcome struct {
	ResourceID string
	// Status: the effect's, or for a replay the first request's (0 when it was not recorded).
	Status int
	// Replayed: the key's earlier request created ResourceID and nothing ran now; answer the
	// resource as it is now.
	Replayed bool
}

// Run is the idempotency protocol's one owner (see the top of this file): acquire the key; a
// completed key is a replay; otherwise run the effect with no lock held and then complete the
// key with its result, or give the key up by the rule of giveUp. Errors are the effect's, or
// Acquire's (EINVALID: the key was used with another request; EBUSY: its request still runs).
//
// Completing after the effect is bookkeeping on a detached context: the effect happened, and the
// client gets its answer even when the key cannot be completed (its lock went stale and another
// request took it over; that one finds the same resource through the core's own rules).
func (x *Idempotency) Run(ctx context.Context, r IdempotencyRequest, effect Effect) (Outcome, error) {
	slot, err := x.Acquire(ctx, r)
	if err != nil {
		if ErrorCode(err) == EBUSY && r.Kind == IdempotencyIntentKey && r.BusyRunsEffect {
			// Without the key: no Token, no Binding; Since is the holder's use.
			id, status, err := effect(ctx, Slot{Since: slot.Since})
			return Outcome{ResourceID: id, Status: status}, err
		}
		return Outcome{}, err
	}
	if slot.Done {
		return Outcome{ResourceID: slot.ResourceID, Status: slot.ResponseCode, Replayed: true}, nil
	}
	if validUUID(slot.Token) {
		slot.Binding = &KeyBinding{r: r, token: slot.Token, recordOnly: r.Kind != IdempotencyIntentKey}
	}
	id, status, err := effect(ctx, slot)
	if slot.Binding.Bound() {
		// The effect's own transaction completed the key with the resource it created: the key
		// is bound to it whatever happened after (an error after that commit — at the gateway,
		// in the apply — leaves the session to the patrol, and the intent's retries replay it).
		if err != nil {
			return Outcome{}, err
		}
		return Outcome{ResourceID: id, Status: status}, nil
	}
	if err != nil {
		x.giveUp(ctx, r, slot, err)
		return Outcome{}, err
	}
	rctx, cancel := x.recordContext(ctx)
	defer cancel()
	if cerr := x.Complete(rctx, r, slot.Token, id, status); cerr != nil && !errors.Is(cerr, ErrIdempotencyLockLost) {
		x.svc.log.Warn("idempotency: completing key failed; trying again in the background", "client", r.ClientID, "kind", string(r.Kind),
			"resource", id, "err", cerr)
		x.retryLater(r, "complete", true, func(ctx context.Context) error { return x.Complete(ctx, r, slot.Token, id, status) })
	}
	return Outcome{ResourceID: id, Status: status}, nil
}

// recordContext is ctx for a key's last write once its effect ran or failed: it outlives the
// caller (a client that hung up, an API call cut by its bound) by RecordGrace, since the key must
// say what happened, and is bounded by StaleAfter in any case, after which the key is another
// request's to take over anyway. Unbounded, a database that did not answer held the request (its
// answer already made) as long as it did; bounded by StaleAfter alone, a call cut at its bound
// waited StaleAfter more, past the server's write timeout, and its 503 was never written (an
// outside review). A write given up leaves the key to go stale, as after a crash. Each write
// also waits for locks at most lock_timeout (execBounded: an autocommit UPDATE behind a
// transaction whose client died holding the key's row waited for hours).
func (x *Idempotency) recordContext(ctx context.Context) (context.Context, context.CancelFunc) {
	octx, stop := Outlive(ctx, RecordGrace)
	tctx, cancel := context.WithTimeout(octx, x.cfg.StaleAfter)
	return tctx, func() { cancel(); stop() }
}

// giveUp lets go of a key after the effect failed. Failures that by their code had no effect
// (invalid input, not found, a conflict, busy) release a client's key, so the client can use it
// again for a corrected request; anything else (a database outage or lock timeout mid-way, an
// internal error) may have had an effect, so the key stays bound to this request and is
// abandoned for the same request to take over at once (running the effect again is safe:
// Create's per-order claim finds the session it made, a refund's RequestKey finds the refund).
//
// An intent is always abandoned, never released: its use (Since) outlives a refusal of this
// request. An identical request that found the intent busy ran its effect under this use
// (BusyRunsEffect) and may have made the resource after this one was refused — a refund claimed
// once the patrol settled a Pending one Failed, freeing the room this one lacked. Released, the
// next identical request started a new use, and a refund keyed by it was a second refund of
// the same keyless intent (an outside review). Kept, it takes the use over and finds that
// resource. There is no corrected request to free it for: an intent's key is its request.
//
// For the same reason a client's key is released only by the request that began its use
// (Slot.Fresh); one taken over is abandoned: an earlier request of the same use may still be
// running, only slow (a pool with no free connection, a slow gateway in its re-check), and make
// the refund after this one was refused for want of room. Released, the client's next use of the
// key (free to it after a 409) started a new use and a second refund (an outside review). A
// takeover of a key a refused takeover abandoned is no different (the slow request may still
// run): the same review's second retry. The cost: after a takeover, a corrected body with the
// same key is refused 422, as the contract says of a key reused with another body.
func (x *Idempotency) giveUp(ctx context.Context, r IdempotencyRequest, slot Slot, cause error) {
	ctx, cancel := x.recordContext(ctx)
	defer cancel()
	what, op := "abandon", func(ctx context.Context) error { return x.Abandon(ctx, r, slot.Token) }
	switch ErrorCode(cause) {
	case EINVALID, ENOTFOUND, ECONFLICT, EBUSY:
		if r.Kind != IdempotencyIntentKey && slot.Fresh {
			what, op = "release", func(ctx context.Context) error { return x.Release(ctx, r, slot.Token) }
		}
	}
	if err := op(ctx); err != nil && !errors.Is(err, ErrIdempotencyLockLost) {
		// The database failed the request and then this write (an outage): tried once, the key
		// stayed held until StaleAfter, and the same request was refused 409 "in progress"
		// though nothing ran (an outside review, dbfail).
		x.svc.log.Warn("idempotency: giving up key failed; trying again in the background", "client", r.ClientID, "kind", string(r.Kind), "err", err)
		x.retryLater(r, what, true, op)
	}
}

// abandonLater lets go of the key r under token in the background (Abandon, retried): after an
// Acquire whose outcome the database left unknown (err). One whose statement provably never ran
// (mayHaveRun) left nothing to let go of. Finding no row under token is not the end while the
// key's INSERT may still be running on the server with its connection gone (a cancel request
// pgbouncer dropped: it commits later, and an Abandon that had given up at once left the key
// held until the stale bound: a review): it is tried again until the stale bound.
func (x *Idempotency) abandonLater(r IdempotencyRequest, token string, err error) {
	if !mayHaveRun(err) {
		return
	}
	x.retryLater(r, "abandon", false, func(ctx context.Context) error { return x.Abandon(ctx, r, token) })
}

// retryLater runs op, a key's last write for a request that has answered, in the background
// until it is written — or there is nothing left to write (ErrIdempotencyLockLost), at once when
// lostIsFinal — for at most StaleAfter, after which the key is any request's to take over
// anyway (letGoLater). Guarded by the request's lock token, a late write changes nothing another
// request did meanwhile.
func (x *Idempotency) retryLater(r IdempotencyRequest, what string, lostIsFinal bool, op func(context.Context) error) {
	x.svc.letGoLater("idempotency key "+what, x.cfg.StaleAfter, func(ctx context.Context) (bool, error) {
		err := op(ctx)
		if h := x.cfg.Hooks.AfterLetGoTry; h != nil {
			h(r.Key, what, err)
		}
		return err == nil || errors.Is(err, ErrIdempotencyLockLost) && lostIsFinal, err
	}, func(err error) {
		if err != nil && !errors.Is(err, ErrIdempotencyLockLost) {
			x.svc.log.Warn("idempotency: key not let go; it is free once stale", "client", r.ClientID, "kind", string(r.Kind), "write", what, "err", err)
		}
		if h := x.cfg.Hooks.AfterLetGo; h != nil {
			h(r.Key, what, err)
		}
	})
}

// Complete records what the key's request did: the resource it created or found and the response
// code it answered. From now on the same request replays that resource as it is at the time.
func (x *Idempotency) Complete(ctx context.Context, r IdempotencyRequest, token, resourceID string, responseCode int) error {
	if !validUUID(token) {
		return ErrIdempotencyLockLost
	}
	tag, err := x.svc.execBounded(ctx, "idempotency: complete", completeKeySQL,
		r.ClientID, string(r.Kind), r.Key, token, resourceID, responseCode, x.svc.cfg.Clock.Now())
	if err != nil {
		return dbError("idempotency: complete", err, "")
	}
	if tag.RowsAffected() != 1 {
		return ErrIdempotencyLockLost
	}
	return nil
}

// Release forgets a key whose request failed before any effect (validation, conflict): the key is
// not burnt, and the client may send a corrected request with it.
func (x *Idempotency) Release(ctx context.Context, r IdempotencyRequest, token string) error {
	if !validUUID(token) {
		return ErrIdempotencyLockLost
	}
	var n int64
	err := x.svc.inTx(ctx, "idempotency: release", func(tx pgx.Tx) error {
		if err := x.lock(ctx, tx, r); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM idempotency_keys
			WHERE client_id = $1 AND kind = $2 AND key = $3 AND lock_token = $4 AND completed_at IS NULL AND resource_id IS NULL`,
			r.ClientID, string(r.Kind), r.Key, token)
		if n = tag.RowsAffected(); err != nil || n == 1 {
			return err
		}
		// The effect recorded a resource before it failed: the key stays bound to it, given up
		// (Abandon) for the same request to replay it.
		tag, err = tx.Exec(ctx, `UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL
			WHERE client_id = $1 AND kind = $2 AND key = $3 AND lock_token = $4 AND completed_at IS NULL`,
			r.ClientID, string(r.Kind), r.Key, token)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return err
	}
	if n != 1 {
		return ErrIdempotencyLockLost
	}
	return nil
}

// Abandon gives a key up after a failure whose effect is uncertain (a database or gateway error
// mid-way). The row stays bound to this request's fingerprint — another request with the key is
// still refused — but the same request may take it over at once instead of waiting for staleness.
func (x *Idempotency) Abandon(ctx context.Context, r IdempotencyRequest, token string) error {
	if !validUUID(token) {
		return ErrIdempotencyLockLost
	}
	tag, err := x.svc.execBounded(ctx, "idempotency: abandon", `UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL
		WHERE client_id = $1 AND kind = $2 AND key = $3 AND lock_token = $4`, r.ClientID, string(r.Kind), r.Key, token)
	if err != nil {
		return dbError("idempotency: abandon", err, "")
	}
	if tag.RowsAffected() != 1 {
		return ErrIdempotencyLockLost
	}
	return nil
}

// IdempotencyReapGrace is how long after it expired a key is kept before the reaper may delete
// it. Acquire decides by the time its request read before it reached the database; a request
// that read its time just inside a key's life and then waited (for a pool connection, the key's
// lock, its body) must still find the row, or its INSERT starts a new use: a keyless refund
// retried at 4m59s became a second refund when another replica's reaper ran at the intent's
// expiry (an outside review, retention). An hour is longer than any request's bound (three
// calls at the longest GATEWAY_TIMEOUT, 10 minutes, and 25 s) and any clock skew between
// replicas.
const IdempotencyReapGrace = time.Hour

// ReapIdempotencyKeys deletes keys that expired at least IdempotencyReapGrace before now, in
// batches of at most batch rows, each batch its own short transaction (FOR UPDATE SKIP LOCKED, so
// it never waits for a request that is reading a key, and reapers on several replicas share the
// work). It returns how many it deleted. The sweeper loop calls it; nothing needs it to run
// promptly: Acquire treats an expired row as absent.
func (s *Service) ReapIdempotencyKeys(ctx context.Context, now time.Time, batch int) (int, error) {
	return s.execBatches(ctx, "reap idempotency keys", batch, `WITH doomed AS (
			SELECT client_id, kind, key FROM idempotency_keys
			WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
		DELETE FROM idempotency_keys k USING doomed d
		WHERE k.client_id = d.client_id AND k.kind = d.kind AND k.key = d.key`, now.Add(-IdempotencyReapGrace))
}

// execBatches runs sql, a statement that touches at most batch rows (its last parameter, after
// args; DefaultReapBatch when batch <= 0), again and again until a run touches fewer or ctx
// ends, each run its own short transaction under the core's bounded lock wait (execBounded): as
// an autocommit statement, a reaper behind a lock of its table (a REINDEX, a non-concurrent
// index build) waited out the whole upkeep bound, and every housekeeping step after it — the
// redaction of dead codes in the outbox among them — ran on an ended context, pass after pass,
// for as long as the lock lasted (an outside review, patrol). It returns how many rows the runs
// touched.
func (s *Service) execBatches(ctx context.Context, op string, batch int, sql string, args ...any) (int, error) {
	if batch <= 0 {
		batch = DefaultReapBatch
	}
	args = append(args, batch)
	total := 0
	for {
		tag, err := s.execBounded(ctx, op, sql, args...)
		if err != nil {
			return total, fmt.Errorf("%s: %w", op, err)
		}
		n := int(tag.RowsAffected())
		total += n
		if n < batch || ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}
