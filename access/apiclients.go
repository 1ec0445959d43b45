package access

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"pitlane/payments"
)

// Scope is what an API key may call (contract: pitlane apikey create NAME [--scopes S,…]).
// Routes name the scope they need (web/routes.go); a key without it gets 403.
type Scope string

const (
	// ScopePaymentsRead: read payments, orders and refunds.
	ScopePaymentsRead Scope = "payments:read"
	// ScopePaymentsWrite: create, check and cancel payments, make checkout links.
	ScopePaymentsWrite Scope = "payments:write"
	// ScopeRefundsWrite: refund payments (money leaves: a key of its own for the few who may).
	ScopeRefundsWrite Scope = "refunds:write"
)

// Scopes are all scopes, in the order they are listed; a key made without naming any has all.
var Scopes = []Scope{ScopePaymentsRead, ScopePaymentsWrite, ScopeRefundsWrite}

// ParseScopes reads a comma-separated list of scopes ("" is all of them), in Scopes order
// without repeats; an unknown name is EINVALID naming the known ones.
func ParseScopes(list string) ([]Scope, error) {
	if strings.TrimSpace(list) == "" {
		return slices.Clone(Scopes), nil
	}
	want := map[Scope]bool{}
	for _, name := range strings.Split(list, ",") {
		sc := Scope(strings.TrimSpace(name))
		if !slices.Contains(Scopes, sc) {
			return nil, payments.Invalid("scopes", "unknown scope %q (scopes: payments:read, payments:write, refunds:write)", string(sc))
		}
		want[sc] = true
	}
	var out []Scope
	for _, sc := range Scopes {
		if want[sc] {
			out = append(out, sc)
		}
	}
	return out, nil
}

// JoinScopes is the comma-separated form ParseScopes reads.
func JoinScopes(scopes []Scope) string {
	names := make([]string, len(scopes))
	for i, sc := range scopes {
		names[i] = string(sc)
	}
	return strings.Join(names, ",")
}

// APIClient is a caller of the JSON API (a shop backend) seen through one of its keys. A client
// may have several keys (RotateAPIKey): requests under any of them are the same client, with the
// same scopes and the same idempotency keys. A key is never stored: only its SHA-256 and its
// non-secret prefix.
type APIClient struct {
	ID        string
	Name      string
	KeyPrefix string // the key's: "pl_" + 12 hex digits, shown in lists, used to find the key
	Scopes    []Scope
	CreatedAt time.Time  // when the key was made (a client's first key: when the client was)
	RevokedAt *time.Time // when the key stopped working: revoked itself, or its client
	LiveKeys  int        // how many of the client's keys work (RotateAPIKey and RevokeAPIClient say)
}

// Revoked reports whether the key no longer works.
func (c APIClient) Revoked() bool { return c.RevokedAt != nil }

// Allows reports whether the client's keys have the scope.
func (c APIClient) Allows(sc Scope) bool { return slices.Contains(c.Scopes, sc) }

// Authorize is EFORBIDDEN unless the client's keys have the scope.
func (c APIClient) Authorize(sc Scope) error {
	if !c.Allows(sc) {
		return payments.Errorf(payments.EFORBIDDEN, "this API key lacks the scope %s (it has %s)", sc, JoinScopes(c.Scopes))
	}
	return nil
}

// API keys look like pl_<12 hex prefix>_<64 hex secret>. The prefix is random too (48 bits, unique
// in the table) so that it can be shown and searched without revealing anything; the secret part
// is 256 bits from crypto/rand. A fast hash (SHA-256) is the right storage for such a key: there
// is no dictionary to try, and a slow KDF would only cost every request CPU.
const (
	apiKeyPrefixHex = 12
	apiKeySecretHex = 64
)

var (
	apiKeyRe       = regexp.MustCompile(`^(pl_[0-9a-f]{12})_[0-9a-f]{64}$`)
	apiKeyPrefixRe = regexp.MustCompile(`^pl_[0-9a-f]{12}$`)
)

// ErrUnauthenticated and ErrRevoked are what AuthenticateAPIKey says about a key it does not
// accept: EUNAUTHENTICATED (401) and EFORBIDDEN (403).
var (
	ErrUnauthenticated = &payments.Error{Code: payments.EUNAUTHENTICATED, Message: "the API key is not valid"}
	ErrRevoked         = &payments.Error{Code: payments.EFORBIDDEN, Message: "the API key was revoked"}
)

func hashAPIKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

func randomHex(n int) (string, error) {
	b := make([]byte, n/2)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// apiKeysFrom is every key with its client (migration 00700); apiKeyColumns reads one as an
// APIClient. A key stops working at its own revocation or its client's, whichever came first
// (least ignores a NULL).
const (
	apiKeysFrom   = `api_client_keys k JOIN api_clients c ON c.id = k.client_id`
	apiKeyColumns = `c.id::text, c.name, k.key_prefix, c.scopes, k.created_at, least(c.revoked_at, k.revoked_at)`
	// apiClientColumns reads a client by its own row, through its first key.
	apiClientColumns = `id::text, name, key_prefix, scopes, created_at, revoked_at`
)

func scanAPIClient(row pgx.Row, extra ...any) (APIClient, error) {
	var c APIClient
	var scopes []string
	err := row.Scan(append([]any{&c.ID, &c.Name, &c.KeyPrefix, &scopes, &c.CreatedAt, &c.RevokedAt}, extra...)...)
	for _, sc := range scopes {
		c.Scopes = append(c.Scopes, Scope(sc))
	}
	return c, err
}

// newAPIKey makes a key: a random prefix and a random secret.
func newAPIKey() (prefix, key string, err error) {
	prefixHex, err := randomHex(apiKeyPrefixHex)
	if err != nil {
		return "", "", fmt.Errorf("api key: random: %w", err)
	}
	secret, err := randomHex(apiKeySecretHex)
	if err != nil {
		return "", "", fmt.Errorf("api key: random: %w", err)
	}
	prefix = "pl_" + prefixHex
	return prefix, prefix + "_" + secret, nil
}

// withNewAPIKey runs insert with a new key, again with another one when its prefix is taken
// (48 random bits: astronomically rare), and returns the key.
func withNewAPIKey(op string, insert func(prefix, key string) error) (string, error) {
	for range 5 {
		prefix, key, err := newAPIKey()
		if err != nil {
			return "", err
		}
		err = insert(prefix, key)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" && (pe.ConstraintName == "api_clients_key_prefix_key" || pe.ConstraintName == "api_client_keys_pkey") {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", op, err)
		}
		return key, nil
	}
	return "", fmt.Errorf("%s: no free key prefix after 5 tries", op)
}

// CreateAPIClient registers a client whose key has the given scopes (none given: all of them)
// and returns it with its key. The key exists only in this return value: print it once; it
// cannot be shown again.
func (s *Service) CreateAPIClient(ctx context.Context, by payments.Staff, name string, scopes ...Scope) (APIClient, string, error) {
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 200 {
		return APIClient{}, "", payments.Invalid("name", "the client name must be 1-200 characters")
	}
	if !payments.PlainLine(name) {
		return APIClient{}, "", payments.Invalid("name", "the client name must be UTF-8 text without control characters (line breaks, escapes)")
	}
	scopes, err := ParseScopes(JoinScopes(scopes))
	if err != nil {
		return APIClient{}, "", err
	}
	names := strings.Split(JoinScopes(scopes), ",")
	now := s.clock.Now()
	var c APIClient
	key, err := withNewAPIKey("create api client", func(prefix, key string) error {
		// The client and its audit entry commit together: a key that can refund money is never
		// made (or revoked) without the log naming who did it. The trigger of migration 00700
		// files the key among the client's keys.
		return s.inTx(ctx, "create api client", func(tx pgx.Tx) error {
			var err error
			c, err = scanAPIClient(tx.QueryRow(ctx, `INSERT INTO api_clients (id, name, key_prefix, key_hash, scopes, created_at)
				VALUES ($1, $2, $3, $4, $5, $6) RETURNING `+apiClientColumns, uuid.NewString(), name, prefix, hashAPIKey(key), names, now))
			if err != nil {
				return err
			}
			return payments.AppendAudit(ctx, tx, payments.AuditEntry{Actor: by.Email, Role: by.Role, Action: payments.AuditAPIKeyCreate,
				Target: c.KeyPrefix, Detail: fmt.Sprintf("client %q id %s scopes %s", c.Name, c.ID, JoinScopes(c.Scopes))}, now)
		})
	})
	if err != nil {
		return APIClient{}, "", err
	}
	return c, key, nil
}

// AuthenticateAPIKey returns the client a bearer key belongs to. The key is found by its
// non-secret prefix and the hashes are compared in constant time, so neither the lookup nor the
// comparison tells an attacker how much of a guessed secret was right. Unknown or malformed keys
// are ErrUnauthenticated; a revoked key (or a key of a revoked client) is ErrRevoked (with the
// client).
func (s *Service) AuthenticateAPIKey(ctx context.Context, key string) (APIClient, error) {
	m := apiKeyRe.FindStringSubmatch(key)
	if m == nil {
		return APIClient{}, ErrUnauthenticated
	}
	var stored []byte
	c, err := scanAPIClient(s.db.QueryRow(ctx, `SELECT `+apiKeyColumns+`, k.key_hash FROM `+apiKeysFrom+` WHERE k.key_prefix = $1`, m[1]), &stored)
	if errors.Is(err, pgx.ErrNoRows) {
		// Hash anyway so an unknown prefix costs the same as a wrong secret.
		subtle.ConstantTimeCompare(hashAPIKey(key), make([]byte, sha256.Size))
		return APIClient{}, ErrUnauthenticated
	}
	if err != nil {
		return APIClient{}, fmt.Errorf("authenticate api key: %w", err)
	}
	if subtle.ConstantTimeCompare(hashAPIKey(key), stored) != 1 {
		return APIClient{}, ErrUnauthenticated
	}
	if c.Revoked() {
		return c, ErrRevoked
	}
	return c, nil
}

// lockAPIClient finds the client named by its id or by the prefix of one of its keys and locks
// its row until the transaction ends: rotations and revocations of one client are decided one
// after the other. The reserved owner of keyless refund intents is no one's client (ENOTFOUND).
func lockAPIClient(ctx context.Context, tx pgx.Tx, idOrPrefix string) (APIClient, error) {
	var where string
	switch {
	case uuid.Validate(idOrPrefix) == nil && len(idOrPrefix) == 36:
		where = `id = $1::uuid`
	case apiKeyPrefixRe.MatchString(idOrPrefix):
		where = `id = (SELECT client_id FROM api_client_keys WHERE key_prefix = $1)`
	default:
		return APIClient{}, payments.Invalid("client", "name a client by its id (a UUID) or a key prefix (pl_ and 12 hex digits)")
	}
	c, err := scanAPIClient(tx.QueryRow(ctx, `SELECT `+apiClientColumns+` FROM api_clients
		WHERE `+where+` AND id <> '`+payments.RefundIntentOwner+`' FOR UPDATE`, idOrPrefix))
	if err != nil {
		return APIClient{}, payments.DBError("api client", err, "no API client %q", idOrPrefix)
	}
	return c, nil
}

// RotateAPIKey gives a client, named by its id or a key prefix, one more key and returns it with
// the key (shown this once, as CreateAPIClient's). The client's other keys keep working until
// each is revoked by its prefix (RevokeAPIClient), so the shop can switch without a gap; every
// key is the same client: a keyed request retried under the new key is the same request, and
// replays (a keyed refund is never made twice across a rotation). A revoked client gets no key.
func (s *Service) RotateAPIKey(ctx context.Context, by payments.Staff, idOrPrefix string) (APIClient, string, error) {
	now := s.clock.Now()
	var c APIClient
	key, err := withNewAPIKey("rotate api key", func(prefix, key string) error {
		return s.inTx(ctx, "rotate api key", func(tx pgx.Tx) error {
			var err error
			if c, err = lockAPIClient(ctx, tx, idOrPrefix); err != nil {
				return err
			}
			if c.Revoked() {
				return payments.Errorf(payments.ECONFLICT, "API client %q was revoked: it gets no new key (create a new client)", c.Name)
			}
			// The count is the statement's snapshot, before the insert: the keys beside the new one.
			var others int
			if err := tx.QueryRow(ctx, `INSERT INTO api_client_keys (key_prefix, client_id, key_hash, created_at) VALUES ($1, $2, $3, $4)
				RETURNING (SELECT count(*) FROM api_client_keys WHERE client_id = $2 AND revoked_at IS NULL)`,
				prefix, c.ID, hashAPIKey(key), now).Scan(&others); err != nil {
				return err
			}
			c.KeyPrefix, c.CreatedAt, c.LiveKeys = prefix, now, others+1
			return payments.AppendAudit(ctx, tx, payments.AuditEntry{Actor: by.Email, Role: by.Role, Action: payments.AuditAPIKeyRotate,
				Target: prefix, Detail: fmt.Sprintf("client %q id %s: a new key beside %d that still work (revoke each by its prefix once the client has switched)", c.Name, c.ID, others)}, now)
		})
	})
	if err != nil {
		return APIClient{}, "", err
	}
	return c, key, nil
}

// RevokeAPIClient revokes a client named by its id (every key of it), or one key named by its
// prefix; a client whose keys are all revoked is revoked. Revoking twice is not an error; the
// first revocation time stays. It returns the client through the key named (by id: its first
// key, with the client's revocation time), and how many of its keys still work.
func (s *Service) RevokeAPIClient(ctx context.Context, by payments.Staff, idOrPrefix string) (APIClient, error) {
	now := s.clock.Now()
	byKey := apiKeyPrefixRe.MatchString(idOrPrefix)
	var c APIClient
	err := s.inTx(ctx, "revoke api client", func(tx pgx.Tx) error {
		client, err := lockAPIClient(ctx, tx, idOrPrefix)
		if err != nil {
			return err
		}
		if !byKey {
			c, err = scanAPIClient(tx.QueryRow(ctx, `UPDATE api_clients SET revoked_at = coalesce(revoked_at, $2) WHERE id = $1
				RETURNING `+apiClientColumns, client.ID, now))
			if err != nil {
				return err
			}
		} else {
			fake := make([]byte, sha256.Size)
			if _, err := rand.Read(fake); err != nil {
				return err
			}
			// The key, and its client once no key of it works. A first key's hash in api_clients
			// is overwritten too: a replica of the release before (a rolling deploy) reads it
			// there and knows nothing of a key revoked alone.
			if _, err := tx.Exec(ctx, `WITH k AS (UPDATE api_client_keys SET revoked_at = coalesce(revoked_at, $3) WHERE key_prefix = $2)
				UPDATE api_clients SET key_hash = CASE WHEN key_prefix = $2 THEN $4 ELSE key_hash END,
					revoked_at = CASE WHEN revoked_at IS NULL AND NOT EXISTS (SELECT 1 FROM api_client_keys
						WHERE client_id = $1 AND key_prefix <> $2 AND revoked_at IS NULL) THEN $3 ELSE revoked_at END
				WHERE id = $1`, client.ID, idOrPrefix, now, fake); err != nil {
				return err
			}
			if c, err = scanAPIClient(tx.QueryRow(ctx, `SELECT `+apiKeyColumns+` FROM `+apiKeysFrom+` WHERE k.key_prefix = $1`, idOrPrefix)); err != nil {
				return err
			}
		}
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+apiKeysFrom+` WHERE c.id = $1 AND k.revoked_at IS NULL AND c.revoked_at IS NULL`,
			c.ID).Scan(&c.LiveKeys); err != nil {
			return err
		}
		detail := fmt.Sprintf("client %q id %s", c.Name, c.ID)
		if byKey {
			detail += fmt.Sprintf(": this key; %d other keys of the client work", c.LiveKeys)
		}
		return payments.AppendAudit(ctx, tx, payments.AuditEntry{Actor: by.Email, Role: by.Role, Action: payments.AuditAPIKeyRevoke,
			Target: c.KeyPrefix, Detail: detail}, now)
	})
	if err != nil {
		return APIClient{}, err
	}
	return c, nil
}

// ListAPIClients lists every key of every client, oldest client first and each client's keys
// oldest first: not the reserved owner of keyless refund intents (payments.RefundIntentOwner),
// which is no one's key.
func (s *Service) ListAPIClients(ctx context.Context) ([]APIClient, error) {
	rows, err := s.db.Query(ctx, `SELECT `+apiKeyColumns+` FROM `+apiKeysFrom+` WHERE c.id <> $1
		ORDER BY c.created_at, c.id, k.created_at, k.key_prefix`, payments.RefundIntentOwner)
	if err != nil {
		return nil, fmt.Errorf("list api clients: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (APIClient, error) { return scanAPIClient(r) })
	if err != nil {
		return nil, fmt.Errorf("list api clients: %w", err)
	}
	return out, nil
}
