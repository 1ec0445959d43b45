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

// APIClient is a caller of the JSON API (a shop backend). Its key is never stored: only the
// key's SHA-256 and its non-secret prefix.
type APIClient struct {
	ID        string
	Name      string
	KeyPrefix string // "pl_" + 12 hex digits: shown in lists, used to find the row
	Scopes    []Scope
	CreatedAt time.Time
	RevokedAt *time.Time
}

// Revoked reports whether the client's key no longer works.
func (c APIClient) Revoked() bool { return c.RevokedAt != nil }

// Allows reports whether the client's key has the scope.
func (c APIClient) Allows(sc Scope) bool { return slices.Contains(c.Scopes, sc) }

// Authorize is EFORBIDDEN unless the client's key has the scope.
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

const apiClientColumns = `id::text, name, key_prefix, scopes, created_at, revoked_at`

func scanAPIClient(row pgx.Row, extra ...any) (APIClient, error) {
	var c APIClient
	var scopes []string
	err := row.Scan(append([]any{&c.ID, &c.Name, &c.KeyPrefix, &scopes, &c.CreatedAt, &c.RevokedAt}, extra...)...)
	for _, sc := range scopes {
		c.Scopes = append(c.Scopes, Scope(sc))
	}
	return c, err
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
	for range 5 { // a prefix collision (48 random bits) is astronomically rare; try again
		prefixHex, err := randomHex(apiKeyPrefixHex)
		if err != nil {
			return APIClient{}, "", fmt.Errorf("create api client: random: %w", err)
		}
		secret, err := randomHex(apiKeySecretHex)
		if err != nil {
			return APIClient{}, "", fmt.Errorf("create api client: random: %w", err)
		}
		prefix := "pl_" + prefixHex
		key := prefix + "_" + secret
		// The client and its audit entry commit together: a key that can refund money is never
		// made (or revoked) without the log naming who did it.
		var c APIClient
		err = s.inTx(ctx, "create api client", func(tx pgx.Tx) error {
			var err error
			c, err = scanAPIClient(tx.QueryRow(ctx, `INSERT INTO api_clients (id, name, key_prefix, key_hash, scopes, created_at)
				VALUES ($1, $2, $3, $4, $5, $6) RETURNING `+apiClientColumns, uuid.NewString(), name, prefix, hashAPIKey(key), names, now))
			if err != nil {
				return err
			}
			return payments.AppendAudit(ctx, tx, payments.AuditEntry{Actor: by.Email, Role: by.Role, Action: payments.AuditAPIKeyCreate,
				Target: c.KeyPrefix, Detail: fmt.Sprintf("client %q id %s scopes %s", c.Name, c.ID, JoinScopes(c.Scopes))}, now)
		})
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "api_clients_key_prefix_key" {
			continue
		}
		if err != nil {
			return APIClient{}, "", fmt.Errorf("create api client: %w", err)
		}
		return c, key, nil
	}
	return APIClient{}, "", errors.New("create api client: no free key prefix after 5 tries")
}

// AuthenticateAPIKey returns the client a bearer key belongs to. The row is found by the key's
// non-secret prefix and the hashes are compared in constant time, so neither the lookup nor the
// comparison tells an attacker how much of a guessed secret was right. Unknown or malformed keys
// are ErrUnauthenticated; a revoked client's key is ErrRevoked (with the client).
func (s *Service) AuthenticateAPIKey(ctx context.Context, key string) (APIClient, error) {
	m := apiKeyRe.FindStringSubmatch(key)
	if m == nil {
		return APIClient{}, ErrUnauthenticated
	}
	var stored []byte
	c, err := scanAPIClient(s.db.QueryRow(ctx, `SELECT `+apiClientColumns+`, key_hash FROM api_clients WHERE key_prefix = $1`, m[1]), &stored)
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

// RevokeAPIClient revokes a client named by its id or its key prefix. Revoking twice is not an
// error; the first revocation time stays.
func (s *Service) RevokeAPIClient(ctx context.Context, by payments.Staff, idOrPrefix string) (APIClient, error) {
	var where string
	switch {
	case uuid.Validate(idOrPrefix) == nil && len(idOrPrefix) == 36:
		where = `id = $1::uuid`
	case apiKeyPrefixRe.MatchString(idOrPrefix):
		where = `key_prefix = $1`
	default:
		return APIClient{}, payments.Invalid("client", "name a client by its id (a UUID) or its key prefix (pl_ and 12 hex digits)")
	}
	now := s.clock.Now()
	var c APIClient
	err := s.inTx(ctx, "revoke api client", func(tx pgx.Tx) error {
		var err error
		if c, err = scanAPIClient(tx.QueryRow(ctx, `UPDATE api_clients SET revoked_at = coalesce(revoked_at, $2)
			WHERE `+where+` AND id <> '`+payments.RefundIntentOwner+`' RETURNING `+apiClientColumns, idOrPrefix, now)); err != nil {
			return payments.DBError("revoke api client", err, "no API client %q", idOrPrefix)
		}
		return payments.AppendAudit(ctx, tx, payments.AuditEntry{Actor: by.Email, Role: by.Role, Action: payments.AuditAPIKeyRevoke,
			Target: c.KeyPrefix, Detail: fmt.Sprintf("client %q id %s", c.Name, c.ID)}, now)
	})
	if err != nil {
		return APIClient{}, err
	}
	return c, nil
}

// ListAPIClients lists every client, oldest first: not the reserved owner of keyless refund
// intents (payments.RefundIntentOwner), which is no one's key.
func (s *Service) ListAPIClients(ctx context.Context) ([]APIClient, error) {
	rows, err := s.db.Query(ctx, `SELECT `+apiClientColumns+` FROM api_clients WHERE id <> $1 ORDER BY created_at, id`, payments.RefundIntentOwner)
	if err != nil {
		return nil, fmt.Errorf("list api clients: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (APIClient, error) { return scanAPIClient(r) })
	if err != nil {
		return nil, fmt.Errorf("list api clients: %w", err)
	}
	return out, nil
}
