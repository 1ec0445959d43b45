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
)

// Idempotency keys (design.md, "Idempotency"; the second seed article).
//
// A key belongs to one API client and to the user's intent, not to a network attempt: every retry
// of one Pay click carries the same key. Keys live in PostgreSQL (table idempotency_keys), never in
// a cache, for 30 days — longer than any client's retry window — and a reaper deletes them after.
//
// Protocol for one request (the API handler drives it):
//
//  1. Validate and authenticate first: a request refused before Acquire never touches its key.
//  2. Acquire: one short transaction under pg_advisory_xact_lock(ns, hashtext(client/key)):
//     INSERT … ON CONFLICT DO NOTHING RETURNING; on conflict read the row FOR UPDATE and decide:
//     another request (fingerprint differs) → EINVALID (422); completed → replay its resource as it
//     is NOW; in flight and its lock not yet stale → EBUSY (409 + Retry-After); in flight but stale
//     (its request died) or abandoned → take it over. No lock is held after this transaction.
//  3. Do the work (Create: its own claim transaction, then the gateway, no key lock held).
//  4. Complete (resource id + response code), or Release when the work failed before any effect
//     (the key is not burnt: the client may fix the request and use it again), or Abandon when
//     the outcome is uncertain (the row stays bound to this request and the same request may
//     take it over at once; the core's per-order claim makes running Create again safe).
//
// The staleness bound: a request that crashed between Acquire and Complete leaves locked_until
// behind. It must outlast any honest request (one register call bounded by GATEWAY_TIMEOUT, plus
// short transactions), so the default is 2 × GATEWAY_TIMEOUT + 10 s (StaleAfterFor). A slow
// request that loses its lock to a takeover finds Complete refused (ErrIdempotencyLockLost); it
// still answers its client, and the taker-over's Create finds the same session.

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
	DefaultIntentTTL        = 24 * time.Hour
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

// ErrIdempotencyLockLost: Complete/Release/Abandon found the key no longer held by this request
// (its lock went stale and another request took it over).
var ErrIdempotencyLockLost = errors.New("idempotency key lock lost to a takeover")

// IdempotencyHooks stop Acquire at a precise point so tests build interleavings on purpose.
type IdempotencyHooks struct {
	// AfterAcquireRead runs inside Acquire's transaction, with the advisory lock held, after the
	// row was inserted or read and before the decision is returned.
	AfterAcquireRead func(ctx context.Context, key string)
}

// IdempotencyConfig configures an Idempotency. Zero values get the defaults.
type IdempotencyConfig struct {
	// StaleAfter: a lock older than this may be taken over (default StaleAfterFor(10s) = 30s).
	StaleAfter time.Duration
	// TTL of client keys (default 30 days).
	TTL time.Duration
	// IntentWindow: requests for the same (client, order, amount, currency) within one window are
	// one intent (default 5 minutes). IntentTTL: how long intent rows are kept (default 1 day;
	// nobody looks one up after its window, the rest is for people reading the table).
	IntentWindow time.Duration
	IntentTTL    time.Duration
	Hooks        IdempotencyHooks
}

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
	if cfg.IntentTTL <= 0 {
		cfg.IntentTTL = DefaultIntentTTL
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

// IntentKey derives the business-intent key of a Create: the same order, amount and currency
// within one window of the injected clock are one intent (a series of quick retries, double
// clicks on a hung page); the next window is a new intent (an honest new attempt after a
// decline). The client is the row's scope, not part of the string.
func IntentKey(orderID string, amount int64, currency string, now time.Time, window time.Duration) string {
	if window <= 0 {
		window = DefaultIntentWindow
	}
	start := now.UTC().Truncate(window)
	return fmt.Sprintf("create/%s/%d/%s/%s", orderID, amount, currency, start.Format(time.RFC3339))
}

// IntentKey derives the intent key with this store's window and the service clock.
func (x *Idempotency) IntentKey(orderID string, amount int64, currency string) string {
	return IntentKey(orderID, amount, currency, x.svc.cfg.Clock.Now(), x.cfg.IntentWindow)
}

// Slot is Acquire's answer when the request may go on.
type Slot struct {
	// Token is set when this request now holds the key: it must Complete, Release or Abandon it.
	Token string
	// TookOver: the key was held by a request whose lock went stale (or that gave up).
	TookOver bool
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
}

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
		return Invalid("Idempotency-Key", "Idempotency-Key must be 1-255 characters")
	}
	if len(r.Fingerprint) == 0 {
		return fmt.Errorf("idempotency: empty fingerprint")
	}
	return nil
}

// lock takes the transaction-scoped advisory lock of one key: every decision about a key is made
// by one transaction at a time, across replicas.
func (x *Idempotency) lock(ctx context.Context, tx pgx.Tx, r IdempotencyRequest) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`,
		int32(x.lockNamespace(r.Kind)), r.ClientID+"/"+r.Key); err != nil {
		return dbError("idempotency: lock", err, "")
	}
	return nil
}

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
		ttl = x.cfg.IntentTTL
	}
	var out Slot
	err := x.svc.inTx(ctx, "idempotency: acquire", func(tx pgx.Tx) error {
		if err := x.lock(ctx, tx, r); err != nil {
			return err
		}
		token := uuid.NewString()
		lockedUntil := now.Add(x.cfg.StaleAfter)
		// Two tries: the reaper (which does not take the advisory lock) may delete an expired
		// row between the conflicting INSERT and the read.
		for range 2 {
			var got string
			err := tx.QueryRow(ctx, `INSERT INTO idempotency_keys
				(client_id, kind, key, fingerprint, method, path, lock_token, locked_until, created_at, expires_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
				ON CONFLICT (client_id, kind, key) DO NOTHING
				RETURNING lock_token::text`,
				r.ClientID, string(r.Kind), r.Key, r.Fingerprint, r.Method, r.Path, token, lockedUntil, now, now.Add(ttl)).Scan(&got)
			if err == nil {
				out = Slot{Token: got, Since: now.Truncate(time.Microsecond)}
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
			switch {
			case !expiresAt.After(now):
				// Expired but not reaped yet: as good as absent. Start it afresh.
				if _, err := tx.Exec(ctx, `UPDATE idempotency_keys SET fingerprint = $4, method = $5, path = $6,
					lock_token = $7, locked_until = $8, resource_id = NULL, response_code = NULL, completed_at = NULL,
					created_at = $9, expires_at = $10 WHERE client_id = $1 AND kind = $2 AND key = $3`,
					r.ClientID, string(r.Kind), r.Key, r.Fingerprint, r.Method, r.Path, token, lockedUntil, now, now.Add(ttl)); err != nil {
					return dbError("idempotency: renew", err, "")
				}
				out = Slot{Token: token, Since: now.Truncate(time.Microsecond)}
				return nil
			case !bytes.Equal(fp, r.Fingerprint):
				return Invalid("Idempotency-Key", "this Idempotency-Key was already used with another request (method, path or body differ); use a new key for a new request")
			case completedAt != nil:
				out = Slot{Done: true, ResourceID: deref(resourceID), CompletedAt: *completedAt, Since: since}
				if responseCode != nil {
					out.ResponseCode = *responseCode
				}
				return nil
			case holder != nil && lockedTill != nil && lockedTill.After(now):
				return Errorf(EBUSY, "a request with this key is still in progress; retry shortly")
			}
			// Held by a request that died (lock stale) or that gave up with an uncertain outcome:
			// the same request takes it over.
			if _, err := tx.Exec(ctx, `UPDATE idempotency_keys SET lock_token = $4, locked_until = $5
				WHERE client_id = $1 AND kind = $2 AND key = $3`, r.ClientID, string(r.Kind), r.Key, token, lockedUntil); err != nil {
				return dbError("idempotency: take over", err, "")
			}
			out = Slot{Token: token, TookOver: holder != nil, Since: since}
			return nil
		}
		return fmt.Errorf("idempotency: key %q vanished twice while acquiring", r.Key)
	})
	if err != nil {
		return Slot{}, err
	}
	return out, nil
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

// Complete records what the key's request did: the resource it created or found and the response
// code it answered. From now on the same request replays that resource as it is at the time.
func (x *Idempotency) Complete(ctx context.Context, r IdempotencyRequest, token, resourceID string, responseCode int) error {
	if !validUUID(token) {
		return ErrIdempotencyLockLost
	}
	tag, err := x.svc.db.Exec(ctx, `UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL,
		resource_id = $5, response_code = $6, completed_at = $7
		WHERE client_id = $1 AND kind = $2 AND key = $3 AND lock_token = $4`,
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
	tag, err := x.svc.db.Exec(ctx, `UPDATE idempotency_keys SET lock_token = NULL, locked_until = NULL
		WHERE client_id = $1 AND kind = $2 AND key = $3 AND lock_token = $4`, r.ClientID, string(r.Kind), r.Key, token)
	if err != nil {
		return dbError("idempotency: abandon", err, "")
	}
	if tag.RowsAffected() != 1 {
		return ErrIdempotencyLockLost
	}
	return nil
}

// ReapIdempotencyKeys deletes keys that expired at now, in batches of at most batch rows, each
// batch its own short statement (FOR UPDATE SKIP LOCKED, so it never waits for a request that is
// reading a key, and reapers on several replicas share the work). It returns how many it deleted.
// The sweeper loop calls it; nothing needs it to run promptly: Acquire treats an expired row as
// absent.
func (s *Service) ReapIdempotencyKeys(ctx context.Context, now time.Time, batch int) (int, error) {
	if batch <= 0 {
		batch = DefaultReapBatch
	}
	total := 0
	for {
		tag, err := s.db.Exec(ctx, `WITH doomed AS (
				SELECT client_id, kind, key FROM idempotency_keys
				WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
			DELETE FROM idempotency_keys k USING doomed d
			WHERE k.client_id = d.client_id AND k.kind = d.kind AND k.key = d.key`, now, batch)
		if err != nil {
			return total, fmt.Errorf("reap idempotency keys: %w", err)
		}
		n := int(tag.RowsAffected())
		total += n
		if n < batch || ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}
