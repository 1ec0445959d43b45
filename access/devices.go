package access

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Device cookies (OWASP, "Slow down online guessing attacks with device cookies"). The sign-in
// throttle's address and global buckets stop a botnet, but a botnet (or one IPv6 /56, 256 of
// the /64s the address bucket counts) can also fill them and so refuse every sign-in in the
// world, and five guesses lock an account for its owner too. A browser that signed in to an
// account gets a device token (RememberDevice; the web layer keeps it in a long-lived cookie);
// its later attempts at that account, with that token, are trusted: they skip the address and
// global buckets and the account's lock. A trusted device that gets the password wrong
// AccountFailures times in a row is trusted no more. Only the token's SHA-256 is stored; a
// token of another account, unknown or spent, is an untrusted attempt like any other.

// DeviceTTL is how long an unused device token stays trusted.
const DeviceTTL = 90 * 24 * time.Hour

func deviceHash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// trustedDevice reports whether token is a device token of email still trusted.
func (s *Service) trustedDevice(ctx context.Context, token, email string, now time.Time) (bool, error) {
	if len(token) != 64 {
		return false, nil
	}
	var one int
	err := s.db.QueryRow(ctx, `SELECT 1 FROM staff_devices WHERE token_hash = $1 AND email = $2 AND failures < $3 AND last_used_at > $4`,
		deviceHash(token), email, s.Limits.AccountFailures, now.Add(-DeviceTTL)).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("sign in: device: %w", err)
	}
	return true, nil
}

// RememberDevice returns the device token of a browser that just signed in to email: the one it
// sent when that is still trusted for email (its failures cleared), else a new one.
func (s *Service) RememberDevice(ctx context.Context, email, sent string) (string, error) {
	now := s.clock.Now()
	if len(sent) == 64 {
		tag, err := s.db.Exec(ctx, `UPDATE staff_devices SET failures = 0, last_used_at = $3
			WHERE token_hash = $1 AND email = $2 AND failures < $4 AND last_used_at > $5`,
			deviceHash(sent), email, now, s.Limits.AccountFailures, now.Add(-DeviceTTL))
		if err != nil {
			return "", fmt.Errorf("remember device: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return sent, nil
		}
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	if _, err := s.db.Exec(ctx, `INSERT INTO staff_devices (token_hash, email, created_at, last_used_at) VALUES ($1, $2, $3, $3)`,
		deviceHash(token), email, now); err != nil {
		return "", fmt.Errorf("remember device: %w", err)
	}
	return token, nil
}

// deviceFailed counts a trusted device's wrong password.
func (s *Service) deviceFailed(ctx context.Context, token string) error {
	if _, err := s.db.Exec(ctx, `UPDATE staff_devices SET failures = failures + 1 WHERE token_hash = $1`, deviceHash(token)); err != nil {
		return fmt.Errorf("sign in: device failure: %w", err)
	}
	return nil
}
