package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"pitlane/payments"
)

// ExitLeaseHeld is `pitlane reconcile`'s exit status when another replica is reconciling right
// now: EX_TEMPFAIL of sysexits.h, "try again later", which a script or a systemd timer can tell
// from a failure (1) and from bad usage or settings (2).
const ExitLeaseHeld = 75

// runReconcile: `pitlane reconcile [--since 24h]`, the reconciliation on demand. It compares
// every session of the configured gateway updated within --since with what the gateway holds,
// under the patrol's one-runner lease (payments.ReconcileSince), prints each finding and each
// finance case it opened, and exits:
//
//	0   the window was compared to the end (differences found are not a failure: they are cases)
//	1   the run could not finish (gateway down, database error); what it did is printed
//	2   bad usage or settings (one line)
//	75  another replica is reconciling right now; nothing was compared; try again
//
// It needs what serve needs to talk to the gateway (DATABASE_URL, GATEWAY, GATEWAY_URL,
// GATEWAY_API_KEY), not the webhook secret.
func runReconcile(ctx context.Context, env *Env, args []string) error {
	const usage = "usage: pitlane reconcile [--since 24h]"
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	since := fs.Duration("since", 24*time.Hour, "compare the sessions updated within this long (a Go duration: 90m, 24h, 168h)")
	if err := parseFlags(env, fs, usage, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return Usagef(usage)
	}
	if *since <= 0 {
		return Usagef("reconcile: --since must be positive, got %s (%s)", *since, usage)
	}
	cfg, err := env.Config()
	if err != nil {
		return err
	}
	if err := cfg.RequireDatabase("reconcile"); err != nil {
		return err
	}
	gw, _, err := buildGateway(cfg, env.Logger, "reconcile")
	if err != nil {
		return err
	}
	if c, ok := gw.(interface{ CloseIdleConnections() }); ok {
		defer c.CloseIdleConnections()
	}
	pool, err := openPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	owner := reconcileOwner(cfg.ReplicaID, fmt.Sprintf("%d-%s", os.Getpid(), rand.Text()[:8]))
	// The patrol's one-runner lease is compared with the servers' times: the database's.
	clock, err := databaseClock(ctx, pool)
	if err == nil {
		err = requireMigrated(ctx, pool)
	}
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	svc := payments.NewService(pool, payments.Config{Clock: clock, Gateway: gw,
		Logger: env.Logger.With("component", "reconcile"), ReplicaID: owner,
		GatewayURL: cfg.GatewayURL, ConfirmationHosts: cfg.ConfirmationHosts, // the same pages trusted as in serve
		// serve's graces: a registration in flight is left to its Create for as long as there.
		GatewayTimeout: cfg.GatewayTimeout})

	rep, err := svc.ReconcileSince(ctx, *since, payments.ReconcileConfig{})
	if err != nil && !rep.Leader {
		return fmt.Errorf("reconcile: %w", err)
	}
	if !rep.Leader {
		holder := rep.LeaderID
		if holder == "" {
			holder = "another replica" // it gave the lease back meanwhile
		}
		return &ExitError{Code: ExitLeaseHeld, Err: fmt.Errorf(
			"%s is reconciling right now (it holds the one-runner lease); nothing was compared; try again in a minute", holder)}
	}
	printReconcile(env.Stdout, gw.Name(), *since, rep)
	switch {
	case err != nil:
		return fmt.Errorf("reconcile: stopped: %w", err)
	case rep.LostLeadership:
		return fmt.Errorf("reconcile: stopped: another replica took the lease over (this run had stalled past its %s TTL)", svc.ReconcileLeaderTTL())
	case !rep.PassDone:
		return fmt.Errorf("reconcile: stopped after %d failures in a row (is the gateway down?); run it again", payments.DefaultReconcileConfig.MaxFailures)
	case rep.Errors > 0:
		return fmt.Errorf("reconcile: %d sessions could not be compared; run it again", rep.Errors)
	}
	return nil
}

// reconcileOwner names this run in the lease: the replica id (REPLICA_ID, which an operator may
// well share with the serve running on the same host from one environment file) plus the
// process id and a random part (run: "<pid>-<random>"), so that the run never counts as the
// lease's current holder, nor as another run's: two cron hosts sharing REPLICA_ID from one file,
// each in a container whose process is pid 1, were one owner, both ran at once and the first to
// end gave the other's lease back (an outside review, reconcile3).
func reconcileOwner(replicaID, run string) string {
	suffix := "/reconcile-" + run
	const maxOwner = 128                        // maintenance_leaders.owner
	for len(replicaID) > maxOwner-len(suffix) { // cut on a character's boundary: PostgreSQL refuses half of one
		_, size := utf8.DecodeLastRuneInString(replicaID)
		replicaID = replicaID[:len(replicaID)-size]
	}
	return replicaID + suffix
}

// printReconcile writes the report: one line per finding, one per case opened, then the totals.
// Columns are separated by two spaces so that `grep`/`awk` read it as easily as people do.
func printReconcile(w io.Writer, gateway string, since time.Duration, rep payments.ReconcileReport) {
	fmt.Fprintf(w, "reconcile %s: sessions updated since %s (the last %s)\n", gateway, rep.Since.UTC().Format(time.RFC3339), since)
	for _, f := range rep.Findings {
		fmt.Fprintf(w, "found   %-26s  session %s  order %s  %s\n", f.Kind, f.SessionID, f.OrderID, oneLine(f.Detail))
	}
	for _, c := range rep.CasesOpened {
		fmt.Fprintf(w, "opened  case %d  %s  session %s  order %s\n", c.ID, c.Kind, c.SessionID, c.OrderID)
	}
	plural := func(n int, one, many string) string {
		if n == 1 {
			return fmt.Sprintf("%d %s", n, one)
		}
		return fmt.Sprintf("%d %s", n, many)
	}
	fmt.Fprintf(w, "checked %d sessions: %s; %d cases opened\n", rep.Checked, strings.Join([]string{
		plural(rep.LatePayments, "late payment", "late payments"),
		plural(rep.Duplicates, "duplicate gateway payment", "duplicate gateway payments"),
		plural(rep.Mismatches, "mismatch", "mismatches"),
		fmt.Sprintf("%d driven", rep.Driven),
		plural(rep.Errors, "error", "errors"),
	}, ", "), len(rep.CasesOpened))
	// The refunds of the compared Completed payments settled Succeeded within the read-back
	// window that the gateway answered about; a contradiction is also a gateway_mismatch above.
	fmt.Fprintf(w, "read back %s settled within %s: %d contradicted by the gateway\n",
		plural(rep.RefundsReadBack, "refund", "refunds"), readBackWindow(payments.DefaultReconcileConfig.RefundReadBack), rep.RefundContradictions)
}

// readBackWindow writes a read-back window in days when it is whole days ("30 days"), as a Go
// duration otherwise.
func readBackWindow(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	}
	return d.String()
}
