package payments_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"pitlane/payments"
)

// A key's last write, once its effect ran (Complete) or failed (Abandon), waits for a lock no
// longer than the service's lock_timeout, and ends at StaleAfter whatever the database does. A
// transaction holding the key's row (a request whose client died mid-way) held Run, its answer
// made, for as long as it held the row: the writes were autocommit statements (no lock_timeout)
// on a context detached from the request with no bound.
func TestIdempotencyLastWriteIsBounded(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cl := newClient(t, b, "shop")
	ctx := context.Background()
	for i, tc := range []struct {
		name                    string
		lockTimeout, staleAfter time.Duration
		fail                    bool
	}{
		{"complete, its lock wait", 200 * time.Millisecond, 10 * time.Minute, false},
		{"abandon, its lock wait", 200 * time.Millisecond, 10 * time.Minute, true},
		{"complete, the stale bound", 10 * time.Minute, 300 * time.Millisecond, false},
		{"abandon, the stale bound", 10 * time.Minute, 300 * time.Millisecond, true},
	} {
		svc := payments.NewService(b.pool, payments.Config{Gateway: b.gw, Clock: b.clock, ReplicaID: "replica-record",
			CodeSecret: []byte("test-secret"), LockTimeout: tc.lockTimeout})
		x := payments.NewIdempotency(svc, payments.IdempotencyConfig{StaleAfter: tc.staleAfter})
		r := idemReq(cl.ID, fmt.Sprintf("k-record-%d", i), `{"amount":1}`)
		var holder pgx.Tx
		effect := func(ctx context.Context, _ payments.Slot) (string, int, error) {
			// Another transaction takes the key's row and never ends.
			var err error
			if holder, err = b.pool.Begin(ctx); err != nil {
				return "", 0, err
			}
			if _, err := holder.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE client_id = $1 AND kind = $2 AND key = $3 FOR UPDATE`,
				r.ClientID, string(r.Kind), r.Key); err != nil {
				return "", 0, err
			}
			if tc.fail {
				return "", 0, errors.New("the effect's connection broke") // internal: the key is abandoned
			}
			return uuid.NewString(), 201, nil
		}
		done := make(chan error, 1)
		go func() {
			_, err := x.Run(ctx, r, effect)
			done <- err
		}()
		select {
		case err := <-done:
			if (err != nil) != tc.fail {
				t.Fatalf("%s: Run = %v", tc.name, err)
			}
		case <-time.After(time.Minute):
			_ = holder.Rollback(ctx)
			<-done
			t.Fatalf("%s: Run still writing its key after a minute behind the held row", tc.name)
		}
		if err := holder.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
