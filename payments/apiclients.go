package payments

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// APIClient is a caller of the JSON API (a shop backend). Its key is never stored: only the
// key's SHA-256 and its non-secret prefix.
type APIClient struct {
	ID        string
	Name      string
	KeyPrefix string // "pl_" + 12 hex digits: shown in lists, used to find the row
	CreatedAt time.Time
	RevokedAt *time.Time
}

// Revoked reports whether the client's key no longer works.
func (c APIClient) Revoked() bool { return c.RevokedAt != nil }

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
// accept; the web layer answers 401 and 403.
var (
	ErrUnauthenticated = errors.New("unknown API key")
	ErrRevoked         = errors.New("API key revoked")
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

const apiClientColumns = `id::text, name, key_prefix, created_at, revoked_at`

func scanAPIClient(row pgx.Row) (APIClient, error) {
	var c APIClient
	err := row.Scan(&c.ID, &c.Name, &c.KeyPrefix, &c.CreatedAt, &c.RevokedAt)
	return c, err
}

// CreateAPIClient registers a client and returns it with its key. The key exists only in this
// return value: print it once; it cannot be shown again.
func (s *Service) CreateAPIClient(ctx context.Context, name string) (APIClient, string, error) {
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 200 {
		return APIClient{}, "", Invalid("name", "the client name must be 1-200 characters")
	}
	now := s.cfg.Clock.Now()
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
		c, err := scanAPIClient(s.db.QueryRow(ctx, `INSERT INTO api_clients (id, name, key_prefix, key_hash, created_at)
			VALUES ($1, $2, $3, $4, $5) RETURNING `+apiClientColumns, uuid.NewString(), name, prefix, hashAPIKey(key), now))
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
	var c APIClient
	err := s.db.QueryRow(ctx, `SELECT `+apiClientColumns+`, key_hash FROM api_clients WHERE key_prefix = $1`, m[1]).
		Scan(&c.ID, &c.Name, &c.KeyPrefix, &c.CreatedAt, &c.RevokedAt, &stored)
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
func (s *Service) RevokeAPIClient(ctx context.Context, idOrPrefix string) (APIClient, error) {
	var where string
	switch {
	case validUUID(idOrPrefix):
		where = `id = $1::uuid`
	case apiKeyPrefixRe.MatchString(idOrPrefix):
		where = `key_prefix = $1`
	default:
		return APIClient{}, Invalid("client", "name a client by its id (a UUID) or its key prefix (pl_ and 12 hex digits)")
	}
	c, err := scanAPIClient(s.db.QueryRow(ctx, `UPDATE api_clients SET revoked_at = coalesce(revoked_at, $2)
		WHERE `+where+` RETURNING `+apiClientColumns, idOrPrefix, s.cfg.Clock.Now()))
	if err != nil {
		return APIClient{}, dbError("revoke api client", err, "no API client %q", idOrPrefix)
	}
	return c, nil
}

// ListAPIClients lists every client, oldest first.
func (s *Service) ListAPIClients(ctx context.Context) ([]APIClient, error) {
	rows, err := s.db.Query(ctx, `SELECT `+apiClientColumns+` FROM api_clients ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list api clients: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (APIClient, error) { return scanAPIClient(r) })
	if err != nil {
		return nil, fmt.Errorf("list api clients: %w", err)
	}
	return out, nil
}
