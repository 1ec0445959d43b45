// Package access decides who may do what: staff users of the console with their roles and
// permissions, API clients with their keys and scopes, and the sign-in throttle in front of
// passwords. It sits beside the locking core (package payments) and needs no gateway, so the
// console signs people in whatever the gateway does, and the admin commands (pitlane user,
// pitlane apikey) work with nothing but the database.
//
// Errors are the core's one error type (payments.Error with its codes), so the web layer maps
// them to HTTP in its one place. Every rule about time takes the injected clock.
package access

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"pitlane/payments"
	"pitlane/payments/dbconn"
)

// DefaultPasswordCost is the bcrypt cost of new password hashes (each hash carries its cost, so
// changing it affects only new ones). Test binaries lower it in TestMain; a Service copies it
// when it is built.
var DefaultPasswordCost = 12

// lockTimeout bounds every lock wait of this package's transactions: they are short, so a
// longer wait means something is stuck and the caller should hear EUNAVAIL.
const lockTimeout = 5 * time.Second

// Service is the access rules over the database. Safe for concurrent use; what replicas must
// agree on (throttle counts, users, keys) lives in PostgreSQL only.
type Service struct {
	db    *pgxpool.Pool
	clock payments.Clock

	// PasswordCost is the bcrypt cost of new hashes and of the dummy hash compared for unknown
	// emails. Set it before the service is used.
	PasswordCost int
	// Limits of the sign-in throttle. Set them before the service is used.
	Limits Limits

	dummyOnce sync.Once
	dummy     []byte
	dummyErr  error

	// signIns is the room for sign-ins using the database at once on this replica
	// (signInRoom): the rest wait here, holding no connection.
	signIns chan struct{}
}

// signInRoom is how many sign-ins (SignIn, and ChangeOwnPassword's proof) use the database at
// once on one replica: a quarter of its pool, at least one. The throttle lives in PostgreSQL,
// so every attempt — one about to be refused too — takes a connection and queues on its
// buckets' rows (the global one is everyone's); unbounded, a flood of anonymous POST /login
// held every connection of the pool while one of those rows was busy, and the API's and
// console's requests failed waiting for one (an outside review, hostile). A bound in the
// process coordinates nothing across replicas (the counts stay in PostgreSQL): it only keeps
// this replica's pool for the rest of its work.
func signInRoom(db *pgxpool.Pool) int {
	if db == nil {
		return 1
	}
	return max(1, int(db.Config().MaxConns)/4)
}

// signInWait is the longest a sign-in waits for room (signInRoom) before it is refused as
// throttled: a staff member under a flood is told to try again rather than left waiting for
// the request's limit.
const signInWait = 3 * time.Second

// New builds the access service over a pool. clock nil: the system clock.
func New(db *pgxpool.Pool, clock payments.Clock) *Service {
	if clock == nil {
		clock = payments.SystemClock{}
	}
	return &Service{db: db, clock: clock, PasswordCost: DefaultPasswordCost, Limits: DefaultLimits,
		signIns: make(chan struct{}, signInRoom(db))}
}

// dummyHash is what an unknown email's password is compared against: a real bcrypt hash of the
// configured cost, made once (it costs as much as a sign-in), so that an unknown email takes as
// long as a known one with a wrong password.
func (s *Service) dummyHash() ([]byte, error) {
	s.dummyOnce.Do(func() {
		s.dummy, s.dummyErr = bcrypt.GenerateFromPassword([]byte("pitlane: no such user"), s.PasswordCost)
	})
	return s.dummy, s.dummyErr
}

// inTx runs fn in a short READ COMMITTED transaction with a bounded lock wait, and bounded on the
// server as the core's are (payments.IdleInTransaction). As in the core, a commit error is an
// unknown outcome for the caller to read back, never to repeat blindly.
func (s *Service) inTx(ctx context.Context, op string, fn func(tx pgx.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{BeginQuery: fmt.Sprintf(
		"BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '%dms'; ", lockTimeout.Milliseconds()) +
		payments.SetIdleInTransaction(payments.IdleInTransaction)})
	if err != nil {
		return fmt.Errorf("%s: begin: %w", op, err)
	}
	defer func() {
		rctx, cancel := dbconn.Rollback(ctx)
		defer cancel()
		tx.Rollback(rctx) //nolint:errcheck // no-op after commit
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return payments.DBError(op+": commit", err, "")
	}
	return nil
}

// RecordAudit appends one entry to the audit log (sign-ins and sign-outs, the command line).
// It outlives a canceled request, by payments.RecordGrace at most: the action it records already
// happened.
func (s *Service) RecordAudit(ctx context.Context, e payments.AuditEntry) error {
	ctx, cancel := payments.Outlive(ctx, payments.RecordGrace)
	defer cancel()
	return payments.AppendAudit(ctx, s.db, e, s.clock.Now())
}
