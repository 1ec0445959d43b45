package access_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
)

// TestRefusedSignInsDoNotStallThePool: a flood of refused sign-ins takes every connection of the
// pool. Two attempts on a pool of two connections are parked on the row the refusal is about (a
// third transaction holds it, outside the pool) and released together: one takes the row lock
// and is refused, the other waits for that lock on the pool's last connection. The refusal's
// answer (how long to wait) is read through the refusing transaction, so it needs no second
// connection: both are refused at once, with the exact Retry-After.
//
// Negative control: with the refusal's wait read through the pool (the code before), the lock
// holder waits for a connection, the other waits for its lock, and nothing moves until
// lock_timeout fails the waiter (EUNAVAIL): in production, every connection of the replica stuck
// behind the same row, again and again.
func TestRefusedSignInsDoNotStallThePool(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// setUp throttles what the refusals are about and returns the row to hold and the
		// refusal's exact Retry-After.
		setUp func(t *testing.T, b *bench, acc *access.Service) (lockRow string, args []any, retryAfter time.Duration, says string)
	}{
		{"address bucket full", func(t *testing.T, b *bench, acc *access.Service) (string, []any, time.Duration, string) {
			lim := access.DefaultLimits
			for i := range lim.AddressBurst {
				if _, err := acc.SignIn(context.Background(), attempt(fmt.Sprintf("made-up-%d@example.com", i), "guess guess guess", "203.0.113.9")); payments.ErrorCode(err) != payments.EWRONG {
					t.Fatalf("filling the bucket, attempt %d: %v", i, err)
				}
			}
			// One unit drains in AddressWindow/AddressBurst, all the clock has moved.
			return `SELECT 1 FROM login_buckets WHERE scope = 'address' AND key = $1 FOR UPDATE`, []any{"203.0.113.9"},
				lim.AddressWindow / time.Duration(lim.AddressBurst), "from your network"
		}},
		{"account locked", func(t *testing.T, b *bench, acc *access.Service) (string, []any, time.Duration, string) {
			lim := access.DefaultLimits
			for i := range lim.AccountFailures {
				acc.SignIn(context.Background(), attempt("ana@example.com", "guess guess guess", fmt.Sprintf("198.51.100.%d", i+1))) //nolint:errcheck
			}
			// A minute later, the lock the fifth failure set has a minute less to run: what the
			// answer says is read from the row, not made up from the window.
			b.clock.Advance(time.Minute)
			return `SELECT 1 FROM staff_login_throttle WHERE email = $1 FOR UPDATE`, []any{"ana@example.com"},
				lim.AccountWindow - time.Minute, "too many failed sign-ins; try again after"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			b.user(t, "ana@example.com", access.RoleSupport)
			acc := access.New(testdb.PoolOf(t, b.pool, 2), b.clock)
			access.SetSignInRoom(acc, 2) // the pool's every connection (it has room for one: signInRoom)
			ctx := context.Background()
			lockRow, args, retryAfter, says := tc.setUp(t, b, acc)

			holder, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(ctx) //nolint:errcheck
			if tag, err := holder.Exec(ctx, lockRow, args...); err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("holding the row: %v %v", tag, err)
			}
			errs := make(chan error, 2)
			for range 2 {
				go func() {
					_, err := acc.SignIn(ctx, attempt("ana@example.com", testPassword, "203.0.113.9"))
					errs <- err
				}()
			}
			waitLockWaiters(t, b, 2) // each on one of the pool's two connections
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				err := <-errs
				if payments.ErrorCode(err) != payments.ELOCKED || !strings.Contains(payments.ErrorMessage(err), says) {
					t.Fatalf("a refused sign-in on a full pool: %v (%s), want refused: %q", err, payments.ErrorCode(err), says)
				}
				if got := payments.RetryAfter(err); got.Round(time.Second) != retryAfter {
					t.Errorf("Retry-After %v, want %v", got, retryAfter)
				}
			}
		})
	}
}

// TestSignInOnOneConnection: every path of SignIn, RememberDevice and ChangeOwnPassword answers
// on a pool of one connection. A statement sent through the pool while a transaction of the
// same call is open would wait for that transaction's connection, which it never gives back:
// the guard against a second connection taken while the throttle's row locks are held. The
// deadline only ends the wait of a broken path; what is checked is that it was never reached.
//
// Negative control: with the refusals' waits read through the pool (the code before), the first
// refused attempt waits for a connection until the deadline.
func TestSignInOnOneConnection(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.user(t, "ana@example.com", access.RoleSupport)
	acc := access.New(testdb.PoolOf(t, b.pool, 1), b.clock)
	acc.Limits.GlobalBurst = 12
	lim := acc.Limits

	step := func(what string, f func(ctx context.Context) error, want string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := f(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%s: still waiting for a connection at the deadline (%v): a statement went through the pool inside a transaction", what, err)
		}
		if payments.ErrorCode(err) != want {
			t.Fatalf("%s: %v (%q), want %q", what, err, payments.ErrorCode(err), want)
		}
	}
	signIn := func(email, password, addr, device string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			a := attempt(email, password, addr)
			a.Device = device
			_, err := acc.SignIn(ctx, a)
			return err
		}
	}

	var device string
	step("sign in", signIn("ana@example.com", testPassword, "192.0.2.1", ""), "")
	step("remember the device", func(ctx context.Context) (err error) {
		ana, err := acc.User(ctx, "ana@example.com")
		if err != nil {
			return err
		}
		device, err = acc.RememberDevice(ctx, ana, "")
		return err
	}, "")
	step("the device signs in", signIn("ana@example.com", testPassword, "192.0.2.1", device), "")
	step("the device's wrong password", signIn("ana@example.com", "guess guess guess", "192.0.2.1", device), payments.EWRONG)
	step("change the own password", func(ctx context.Context) error {
		ana, err := acc.User(ctx, "ana@example.com")
		if err == nil {
			_, err = acc.ChangeOwnPassword(ctx, attempt("ana@example.com", testPassword, "192.0.2.1"), ana.SessionEpoch, testPassword+" 2")
		}
		return err
	}, "")
	for i := range lim.AccountFailures - 1 {
		step(fmt.Sprintf("wrong password %d", i+1), signIn("ana@example.com", "guess guess guess", "192.0.2.2", ""), payments.EWRONG)
	}
	step("the failure that locks", signIn("ana@example.com", "guess guess guess", "192.0.2.2", ""), payments.ELOCKED)
	step("the account locked", signIn("ana@example.com", testPassword+" 2", "192.0.2.3", ""), payments.ELOCKED)
	step("an unknown email", signIn("nobody@example.com", "guess guess guess", "192.0.2.4", ""), payments.EWRONG)
	acc.Limits.AddressBurst = 1
	step("the address bucket full", signIn("nobody@example.com", "guess guess guess", "192.0.2.4", ""), payments.ELOCKED)
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := acc.SignIn(ctx, attempt(fmt.Sprintf("x%d@example.com", i), "guess guess guess", fmt.Sprintf("198.51.100.%d", i+1)))
		if ctx.Err() != nil {
			t.Fatalf("filling the global bucket: still waiting at the deadline (%v)", err)
		}
		cancel()
		if payments.ErrorCode(err) == payments.ELOCKED {
			if !strings.Contains(payments.ErrorMessage(err), "right now") {
				t.Fatalf("the global bucket full: %v", err)
			}
			break
		}
		if i > lim.GlobalBurst {
			t.Fatal("the global bucket never ran full")
		}
	}
}

// A replica on pgxpool's default pool (4 connections: room for one sign-in, signInRoom) at the
// production bcrypt cost. A dozen anonymous guesses in flight — each within its address's burst
// and far under the global bucket — held the one room across their bcrypt (which uses no
// connection), and a staff member whose browser is a trusted device (which by design passes
// whatever the address and global buckets say) was refused 429 (a review of the room). Only the
// throttle's transaction takes room. Negative control (run by hand): the room held to the end
// of SignIn, refused after 3 s.
func TestATrustedDeviceSignsInBesideGuessesInBcrypt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.user(t, "ana@example.com", access.RoleSupport)
	acc := access.New(testdb.PoolOf(t, b.pool, 4), b.clock) // room: max(1, 4/4) = 1
	acc.PasswordCost = 12                                   // production's DefaultPasswordCost (the dummy hash of unknown emails)
	device := deviceOf(t, acc, "ana@example.com")

	stop := make(chan struct{})
	answers := make(chan string, 1024)
	done := make(chan struct{})
	const attackers = 12
	for i := range attackers {
		go func() {
			defer func() { done <- struct{}{} }()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := acc.SignIn(context.Background(), attempt(fmt.Sprintf("nobody%d-%d@example.com", i, n), "guess guess guess", fmt.Sprintf("198.51.100.%d", i+1)))
				answers <- payments.ErrorCode(err)
			}
		}()
	}
	<-answers // the first guess was judged: the others are queued behind the slot
	start := time.Now()
	err := signInWithDevice(acc, "ana@example.com", testPassword, "192.0.2.7", device)
	t.Logf("trusted device sign-in after %v: %v", time.Since(start), err)
	close(stop)
	for range attackers {
		<-done
	}
	close(answers)
	got := map[string]int{}
	for c := range answers {
		got[c]++
	}
	t.Logf("attackers' answers: %v", got)
	if err != nil {
		t.Fatalf("a trusted device's right password under %d guesses in flight: %v, want signed in", attackers, err)
	}
}
