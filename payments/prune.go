package payments

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Retention of the three tables that grow with traffic rather than with payments
// (docs/operations.md, "Retention"): the gateway's call log, the webhook inbox and the customer
// messages' outbox. `pitlane prune` runs it; nothing else deletes from them. The ledger, the
// sessions, their events, the refunds and the audit log are never touched.
//
// Each table is walked in the order of its primary key, a batch of rows at a time (each batch
// a transaction of its own, with the core's bounded lock wait), deleting the rows of the batch
// that are older than the table's cutoff and are no longer wanted; the walk stops after the
// first batch that reaches a row younger than the cutoff. Rows are appended in time order, so
// everything after it is younger too, and a run reads only the old end of each table plus the
// old rows it keeps on purpose (a few: see PruneRules), never the whole table.

// AuditPrune is the audit action of a run of `pitlane prune` that deleted rows (one entry per
// table, its count and cutoff in the detail).
const AuditPrune = "retention.prune"

// MinPruneAge is the least age a table may be pruned at: a shorter one is a typo (90 meant as
// days), and a day of each table is what its pages and alerts read.
const MinPruneAge = 24 * time.Hour

// DefaultPruneBatch is how many rows of a table one batch walks.
const DefaultPruneBatch = 5000

// PruneConfig says which tables to prune and from what age; a zero age keeps that table whole.
type PruneConfig struct {
	GatewayCalls  time.Duration // gateway_calls: calls of sessions nobody needs to look at again
	WebhookEvents time.Duration // webhook_events: processed events (a redelivery after is a new hint)
	Outbox        time.Duration // outbox: messages whose delivery is over, or never to be tried
	Batch         int           // rows walked per batch; zero means DefaultPruneBatch
	DryRun        bool          // count what would go, delete nothing, audit nothing
	Actor         string        // the audit log's actor ("cli:<os user>")
}

// PruneCount is what a run did to one table.
type PruneCount struct {
	Table   string
	Before  time.Time // the cutoff: rows older than this were considered
	Deleted int       // deleted, or (DryRun) would be
	Err     error     // why the walk stopped short (Deleted is what it did before)
}

// PruneRules says, per table, which old rows go; docs/operations.md repeats it for operators.
var PruneRules = []struct{ Table, Rule string }{
	{"gateway_calls", "calls of no session, or of a session that is Completed, Failed or Canceled, not flagged, with no open finance case and no Pending refund"},
	{"webhook_events", "events processed (applied, of no payment of ours, or ignored) and last received before the cutoff; never one waiting to be applied"},
	{"outbox", "messages delivered or skipped, out of tries, or never handed to a notifier (none configured); never one whose delivery failed and is not over"},
}

// pruneTable is one table's walk: the time column its rows are appended in, and what else (over
// alias t, the cutoff $3) an old row must be to go.
type pruneTable struct {
	name, timeCol, goes string
	age                 func(PruneConfig) time.Duration
}

var pruneTables = []pruneTable{
	{name: "gateway_calls", timeCol: "created_at", age: func(c PruneConfig) time.Duration { return c.GatewayCalls },
		goes: `(t.session_id IS NULL OR NOT EXISTS (
			SELECT 1 FROM payment_sessions ps WHERE ps.id = t.session_id AND (
				ps.status NOT IN ('Completed', 'Failed', 'Canceled') OR ps.flagged_at IS NOT NULL
				OR EXISTS (SELECT 1 FROM finance_cases fc WHERE fc.session_id = ps.id AND fc.resolved_at IS NULL)
				OR EXISTS (SELECT 1 FROM refunds r WHERE r.session_id = ps.id AND r.status = 'Pending'))))`},
	{name: "webhook_events", timeCol: "received_at", age: func(c PruneConfig) time.Duration { return c.WebhookEvents },
		goes: `t.processed_at IS NOT NULL AND t.last_received_at < $3`},
	{name: "outbox", timeCol: "created_at", age: func(c PruneConfig) time.Duration { return c.Outbox },
		goes: `(coalesce(t.delivered_at, t.skipped_at) < $3
			OR (t.delivered_at IS NULL AND t.skipped_at IS NULL AND t.attempts = 0 AND t.lease_until IS NULL)
			OR (t.delivered_at IS NULL AND t.skipped_at IS NULL AND t.attempts >= ` + strconv.Itoa(outboxAttempts) + `))`}, // out of tries: over, kept for ever before (an outside review)
}

// Prune deletes (or, DryRun, counts) the old rows of the tables cfg names, in batches, and
// audits each table it deleted from. A table that fails (a lock wait past lock_timeout, the
// database gone) keeps its error in its count and the others are still pruned: one table's
// lasting problem must not keep the others growing. Several hosts may prune at once: a batch
// waits for the rows another run's batch holds, then skips those it deleted. The error returned
// joins the tables' errors.
func (s *Service) Prune(ctx context.Context, cfg PruneConfig) ([]PruneCount, error) {
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultPruneBatch
	}
	for _, pt := range pruneTables {
		if age := pt.age(cfg); age != 0 && age < MinPruneAge {
			return nil, fmt.Errorf("prune %s: age %s is under %s", pt.name, age, MinPruneAge)
		}
	}
	now := s.cfg.Clock.Now()
	var out []PruneCount
	var errs []error
	for _, pt := range pruneTables {
		age := pt.age(cfg)
		if age == 0 {
			continue
		}
		c := PruneCount{Table: pt.name, Before: now.Add(-age)}
		c.Deleted, c.Err = s.pruneTable(ctx, pt, c.Before, cfg)
		if c.Deleted > 0 && !cfg.DryRun {
			// After the batches, in a statement of its own: what was deleted is recorded even
			// when a later batch failed (a crash between loses the entry, never a row).
			if err := s.RecordAudit(ctx, AuditEntry{Actor: cfg.Actor, Action: AuditPrune, Target: pt.name,
				Detail: fmt.Sprintf("deleted %d rows from before %s", c.Deleted, c.Before.UTC().Format(time.RFC3339))}); err != nil && c.Err == nil {
				c.Err = err
			}
		}
		if c.Err != nil {
			errs = append(errs, c.Err)
		}
		out = append(out, c)
	}
	return out, errors.Join(errs...)
}

// pruneBatchSQL is one batch of a table's walk: $1 the last key walked, $2 the batch size, $3
// the cutoff; it answers how many rows it deleted (dry: would delete), the last key walked, how
// many rows it walked and whether one of them was younger than the cutoff. The batch's rows are
// named by an array of the keys of its old rows, not joined: a join's generic plan (a prepared
// statement's, from its sixth run on a connection) does not know the batch is small and hashed
// the whole table for it (an outside review); "= ANY(array)" is the primary key's index whatever
// the plan. The age is the batch's test, not the table's: on the table, the generic plan ANDed
// the keys with a range scan of the time index over every old row, once per batch.
func pruneBatchSQL(pt pruneTable, dry bool) string {
	goes := `t.id = ANY(ARRAY(SELECT id FROM batch WHERE at < $3)) AND ` + pt.goes
	act := `DELETE FROM ` + pt.name + ` t WHERE ` + goes + ` RETURNING t.id`
	if dry {
		act = `SELECT t.id FROM ` + pt.name + ` t WHERE ` + goes
	}
	return `WITH batch AS (
			SELECT id, ` + pt.timeCol + ` AS at FROM ` + pt.name + ` WHERE id > $1 ORDER BY id LIMIT $2),
		gone AS (` + act + `)
		SELECT (SELECT count(*) FROM gone)::int, coalesce(max(id), $1), count(*)::int, coalesce(bool_or(at >= $3), false)
		FROM batch`
}

// pruneTable walks one table from its oldest row.
func (s *Service) pruneTable(ctx context.Context, pt pruneTable, before time.Time, cfg PruneConfig) (int, error) {
	sql := pruneBatchSQL(pt, cfg.DryRun)
	var last int64
	total := 0
	for {
		var n, walked int
		var reachedYoung bool
		err := s.inTx(ctx, "prune "+pt.name, func(tx pgx.Tx) error {
			// A batch is milliseconds of work; the planner's cost estimate of the keep rules'
			// look-ups can pass JIT's threshold, and compiling took 20 to 40 times the work.
			if _, err := tx.Exec(ctx, `SET LOCAL jit = off`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, sql, last, cfg.Batch, before).Scan(&n, &last, &walked, &reachedYoung)
		})
		if err != nil {
			return total, fmt.Errorf("prune %s: %w", pt.name, err)
		}
		total += n
		if walked < cfg.Batch || reachedYoung {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}
