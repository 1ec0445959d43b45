package access_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
)

// throttleAddress fills addr's bucket with failures of made-up emails: from then on, an attempt
// from addr that is not a trusted device's is refused before its password is looked at.
func throttleAddress(t *testing.T, acc *access.Service, addr string) {
	t.Helper()
	for i := range acc.Limits.AddressBurst {
		if _, err := acc.SignIn(context.Background(), attempt(fmt.Sprintf("made-up-%d@example.com", i), "guess guess guess", addr)); payments.ErrorCode(err) != payments.EWRONG {
			t.Fatalf("throttling %s, attempt %d: %v", addr, i, err)
		}
	}
	if _, err := acc.SignIn(context.Background(), attempt("made-up@example.com", "guess guess guess", addr)); payments.ErrorCode(err) != payments.ELOCKED {
		t.Fatalf("%s is not throttled: %v", addr, err)
	}
}

// signInWithDevice is one attempt carrying a browser's device token.
func signInWithDevice(acc *access.Service, email, password, addr, device string) error {
	a := attempt(email, password, addr)
	a.Device = device
	_, err := acc.SignIn(context.Background(), a)
	return err
}

// TestParallelGuessesFromATrustedDevice: whoever holds a device cookie of an account (stolen,
// or an old browser of the owner's) sends n (16) wrong passwords at once, from an address the
// throttle has already refused. Every attempt is parked on the device's row (a transaction
// holds it) and all are released together. Each takes one unit of the device's allowance
// before its password is looked at, in one guarded UPDATE, so exactly AccountFailures get past
// the device path (and are judged: EWRONG); the others fall back to the throttle and are
// refused (ELOCKED, 429), without bcrypt.
//
// Negative control: with the device's trust read before bcrypt and its failure counted after
// (the code before), all n are trusted and judged: n × EWRONG, no 429, while the throttle
// allows AccountFailures per account and AddressBurst per address.
func TestParallelGuessesFromATrustedDevice(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.user(t, "ana@example.com", access.RoleSupport)
	ctx := context.Background()
	const n = 16 // serialised on the device's row, each within lock_timeout of the first (5 s), under -race and a loaded machine too
	acc := access.New(testdb.PoolOf(t, b.pool, n+4), b.clock)
	access.SetSignInRoom(acc, n) // all n at once (a replica lets a quarter of its pool in: signInRoom)
	allowance := acc.Limits.AccountFailures

	device := deviceOf(t, acc, "ana@example.com")
	throttleAddress(t, acc, "203.0.113.9")

	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if tag, err := holder.Exec(ctx, `SELECT 1 FROM staff_devices WHERE email = 'ana@example.com' FOR UPDATE`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("holding the device: %v %v", tag, err)
	}
	errs := make(chan error, n)
	for range n {
		go func() { errs <- signInWithDevice(acc, "ana@example.com", "guess guess guess", "203.0.113.9", device) }()
	}
	waitLockWaiters(t, b, n)
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for range n {
		err := <-errs
		got[payments.ErrorCode(err)]++
		if payments.ErrorCode(err) == payments.ELOCKED && (payments.RetryAfter(err) <= 0 || !strings.Contains(payments.ErrorMessage(err), "from your network")) {
			t.Errorf("refusal %v (Retry-After %v), want the address's", err, payments.RetryAfter(err))
		}
	}
	// A wait for the device's row past lock_timeout (under -race beside the whole suite: CI saw one
	// of sixteen) is refused too, 503 and not judged: what is proven is that exactly the
	// allowance is judged and counted, and nothing else gets past.
	if got[payments.EWRONG] != allowance || got[payments.ELOCKED]+got[payments.EUNAVAIL] != n-allowance || got[payments.ELOCKED] == 0 {
		t.Fatalf("outcomes %v, want %d judged (the device's allowance) and %d refused", got, allowance, n-allowance)
	}
	if f := b.count(t, `SELECT failures FROM staff_devices WHERE email = 'ana@example.com'`); f != allowance {
		t.Errorf("the device counts %d failures, want %d", f, allowance)
	}
	if a := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = 'ana@example.com'`, payments.AuditLoginFailed); a != allowance {
		t.Errorf("%d failures audited, want %d (the refused ones were never judged)", a, allowance)
	}
	// Spent: the device is one more attempt from a throttled address, even with the password.
	if err := signInWithDevice(acc, "ana@example.com", testPassword, "203.0.113.9", device); payments.ErrorCode(err) != payments.ELOCKED {
		t.Fatalf("the spent device: %v, want throttled", err)
	}
}

// TestTrustedDeviceSuccessGivesItsAllowanceBack: a trusted device's right password clears its
// failures (its owner's typos do not add up across sign-ins); the unit the attempt took is not
// kept either.
func TestTrustedDeviceSuccessGivesItsAllowanceBack(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.user(t, "ana@example.com", access.RoleSupport)
	device := deviceOf(t, b.acc, "ana@example.com")
	throttleAddress(t, b.acc, "203.0.113.9")
	for round := range 2 {
		for i := range b.acc.Limits.AccountFailures - 1 {
			if err := signInWithDevice(b.acc, "ana@example.com", "guess guess guess", "203.0.113.9", device); payments.ErrorCode(err) != payments.EWRONG {
				t.Fatalf("round %d, guess %d: %v", round, i, err)
			}
		}
		if err := signInWithDevice(b.acc, "ana@example.com", testPassword, "203.0.113.9", device); err != nil {
			t.Fatalf("round %d, the right password: %v", round, err)
		}
		if f := b.count(t, `SELECT failures FROM staff_devices WHERE email = 'ana@example.com'`); f != 0 {
			t.Fatalf("round %d: %d failures left after a sign-in", round, f)
		}
	}
}

// TestDeviceTrustEndsWithTheAccountsChanges: a device token is as good as the password it was
// earned with and the sessions it came with. A new password (set by an admin or by the user),
// "sign out everywhere else" and disabling the user each delete the user's devices, in the
// change's transaction: a token that went past a throttled address before the change is one
// more throttled attempt after it. Another user's devices stay, and a change refused (the last
// admin) deletes nothing.
//
// Negative control: without the deletions (the code before), the old token still signs in with
// the new password from the throttled address (the disabled user's gets EWRONG, judged, not 429).
func TestDeviceTrustEndsWithTheAccountsChanges(t *testing.T) {
	t.Parallel()
	root := payments.Staff{Email: "root@example.com", Role: string(access.RoleAdmin)}
	ana := payments.Staff{Email: "ana@example.com", Role: string(access.RoleSupport)}
	const newPassword = "a brand new password"
	for _, tc := range []struct {
		name     string
		change   func(ctx context.Context, acc *access.Service) error
		password string // ana's password after the change
	}{
		{"an admin sets her password", func(ctx context.Context, acc *access.Service) error {
			_, err := acc.SetPassword(ctx, root, "ana@example.com", newPassword)
			return err
		}, newPassword},
		{"she changes her own password", func(ctx context.Context, acc *access.Service) error {
			u, err := acc.User(ctx, "ana@example.com")
			if err == nil {
				_, err = acc.ChangeOwnPassword(ctx, attempt("ana@example.com", testPassword, "192.0.2.50"), u.SessionEpoch, newPassword)
			}
			return err
		}, newPassword},
		{"she signs out everywhere else", func(ctx context.Context, acc *access.Service) error {
			u, err := acc.User(ctx, "ana@example.com")
			if err == nil {
				_, err = acc.EndSessions(ctx, ana, "ana@example.com", u.SessionEpoch)
			}
			return err
		}, testPassword},
		{"she is disabled", func(ctx context.Context, acc *access.Service) error {
			_, err := acc.DisableUser(ctx, root, "ana@example.com")
			return err
		}, testPassword},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			ctx := context.Background()
			b.user(t, "root@example.com", access.RoleAdmin)
			b.user(t, "ana@example.com", access.RoleSupport)
			b.user(t, "bo@example.com", access.RoleSupport)
			devices := map[string]string{}
			for _, email := range []string{"root@example.com", "ana@example.com", "bo@example.com"} {
				devices[email] = deviceOf(t, b.acc, email)
			}
			throttleAddress(t, b.acc, "203.0.113.9")
			if err := signInWithDevice(b.acc, "ana@example.com", testPassword, "203.0.113.9", devices["ana@example.com"]); err != nil {
				t.Fatalf("before the change, ana's device: %v", err)
			}
			// A change refused deletes nothing: the last admin stays, with her device.
			if _, err := b.acc.DisableUser(ctx, ana, "root@example.com"); payments.ErrorCode(err) != payments.ECONFLICT {
				t.Fatalf("disabling the last admin: %v", err)
			}
			if n := b.count(t, `SELECT count(*) FROM staff_devices WHERE email = 'root@example.com'`); n != 1 {
				t.Fatalf("a refused change left root %d devices, want 1", n)
			}

			if err := tc.change(ctx, b.acc); err != nil {
				t.Fatal(err)
			}
			if n := b.count(t, `SELECT count(*) FROM staff_devices WHERE email = 'ana@example.com'`); n != 0 {
				t.Errorf("%d devices of ana's left, want none", n)
			}
			if err := signInWithDevice(b.acc, "ana@example.com", tc.password, "203.0.113.9", devices["ana@example.com"]); payments.ErrorCode(err) != payments.ELOCKED {
				t.Fatalf("after the change, ana's old device: %v, want throttled like any attempt", err)
			}
			if err := signInWithDevice(b.acc, "bo@example.com", testPassword, "203.0.113.9", devices["bo@example.com"]); err != nil {
				t.Fatalf("bo's device after ana's change: %v", err)
			}
		})
	}
}

// TestPasswordChangeMeetsATrustedSignIn: a new password is set while the owner's trusted device
// signs in with the old one. The change is parked on the account's throttle row (a third
// transaction holds it), holding the device rows it has already deleted; the sign-in's device
// claim waits for those. Released, the change commits, and the sign-in finds its device gone
// and the password changed: an untrusted attempt with a wrong password (EWRONG). The change
// deletes the device rows before the throttle row (SignIn's lock order: device, address,
// global, account), so neither ever waits for the other.
//
// Negative control: the throttle row deleted before the devices, the sign-in's claim goes
// through, its success holds the device's row and waits for the throttle row the change holds,
// and the change waits for the device's row: PostgreSQL's deadlock detector fails one of them.
func TestPasswordChangeMeetsATrustedSignIn(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.user(t, "ana@example.com", access.RoleSupport)
	ctx := context.Background()
	device := deviceOf(t, b.acc, "ana@example.com")
	if _, err := b.acc.SignIn(ctx, attempt("ana@example.com", "guess guess guess", "192.0.2.8")); payments.ErrorCode(err) != payments.EWRONG {
		t.Fatalf("the failure that makes the throttle row: %v", err)
	}
	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if tag, err := holder.Exec(ctx, `SELECT 1 FROM staff_login_throttle WHERE email = 'ana@example.com' FOR UPDATE`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("holding the throttle row: %v %v", tag, err)
	}
	changed := make(chan error, 1)
	go func() {
		_, err := b.acc.SetPassword(ctx, cli, "ana@example.com", "a brand new password")
		changed <- err
	}()
	waitLockWaiters(t, b, 1)
	signedIn := make(chan error, 1)
	go func() { signedIn <- signInWithDevice(b.acc, "ana@example.com", testPassword, "203.0.113.9", device) }()
	waitLockWaiters(t, b, 2)
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-changed; err != nil {
		t.Fatalf("the new password: %v", err)
	}
	if err := <-signedIn; payments.ErrorCode(err) != payments.EWRONG {
		t.Fatalf("the device's sign-in with the old password: %v, want the wrong-password answer", err)
	}
	if n := b.count(t, `SELECT count(*) FROM staff_devices WHERE email = 'ana@example.com'`); n != 0 {
		t.Errorf("%d devices of ana's left, want none", n)
	}
}

// deviceOf signs email in with the right password from a fresh address and returns the device
// token its browser keeps (RememberDevice).
func deviceOf(t *testing.T, acc *access.Service, email string) string {
	t.Helper()
	ctx := context.Background()
	u, err := acc.SignIn(ctx, attempt(email, testPassword, "192.0.2.7"))
	if err != nil {
		t.Fatal(err)
	}
	device, err := acc.RememberDevice(ctx, u, "")
	if err != nil || len(device) != 64 {
		t.Fatalf("device token %q %v", device, err)
	}
	return device
}

// A sign-in with the old password that read the account just before a password change
// committed: its browser must not get a device after the change forgot the account's devices
// (a device cookie earned with the old password would guess past the throttle). RememberDevice
// writes only while the account still has the session epoch the sign-in read (an outside
// review: it inserted one after the change).
func TestNoDeviceForASignInOverTakenByAPasswordChange(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.user(t, "ana@example.com", access.RoleSupport)
	ctx := context.Background()
	sent := deviceOf(t, b.acc, "ana@example.com")
	u, err := b.acc.SignIn(ctx, attempt("ana@example.com", testPassword, "192.0.2.7")) // read before the change
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.acc.SetPassword(ctx, cli, "ana@example.com", "a brand new password"); err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"", sent} { // a new device, or the one the browser sent
		if device, err := b.acc.RememberDevice(ctx, u, token); err != nil || device != "" {
			t.Fatalf("device %q %v after the password change, want none", device, err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM staff_devices WHERE email = 'ana@example.com'`); n != 0 {
		t.Fatalf("%d devices of ana's after the change, want 0", n)
	}
}
