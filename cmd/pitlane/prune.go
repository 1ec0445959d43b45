package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"pitlane/payments"
)

// Defaults of `pitlane prune`: the webhook inbox a month (the gateway's redelivery window is
// days: Stripe's three), the outbox a quarter. The gateway call log is the record of what was
// asked of the gateway, which disputes come back to: kept whole unless --gateway-calls says how
// long your dispute window is.
const (
	defaultPruneWebhookEvents = 30 * 24 * time.Hour
	defaultPruneOutbox        = 90 * 24 * time.Hour
)

// runPrune: `pitlane prune [--gateway-calls AGE] [--webhook-events AGE] [--outbox AGE]
// [--dry-run]`, the retention of the tables that grow with traffic (payments.Prune). It deletes
// in batches of short transactions, may run on several hosts at once (a systemd timer on each is
// fine), prints one line per table and exits 0 done, 1 a table stopped short (each line says
// what it did; the others were still pruned), 2 bad usage or settings. It needs DATABASE_URL
// only.
func runPrune(ctx context.Context, env *Env, args []string) error {
	const usage = "usage: pitlane prune [--gateway-calls AGE] [--webhook-events AGE] [--outbox AGE] [--dry-run] (AGE: 400d, 72h, or keep)"
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	ages := map[string]*pruneAge{
		"gateway-calls":  {},
		"webhook-events": {d: defaultPruneWebhookEvents},
		"outbox":         {d: defaultPruneOutbox},
	}
	for name, a := range ages {
		fs.Var(a, name, "delete "+name+" rows older than AGE (keep: none)")
	}
	dry := fs.Bool("dry-run", false, "count what would be deleted; delete nothing")
	if err := parseFlags(env, fs, usage, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return Usagef(usage)
	}
	cfg, err := env.Config()
	if err != nil {
		return err
	}
	pool, clock, err := openMigrated(ctx, cfg, "prune") // the cutoffs are the database's time
	if err != nil {
		return err
	}
	defer pool.Close()
	svc := payments.NewService(pool, payments.Config{Clock: clock, Logger: env.Logger.With("component", "prune"), ReplicaID: cfg.ReplicaID})
	counts, err := svc.Prune(ctx, payments.PruneConfig{
		GatewayCalls: ages["gateway-calls"].d, WebhookEvents: ages["webhook-events"].d, Outbox: ages["outbox"].d,
		DryRun: *dry, Actor: cliActor().Email,
	})
	printPrune(env.Stdout, counts, *dry)
	if err != nil {
		if counts == nil {
			return err // refused before it began
		}
		return errors.New("a table stopped short (above); run it again: it goes on from the oldest rows left")
	}
	return nil
}

// printPrune writes one line per table the run looked at, then the rules (a dry run's reader
// wants to know what "would delete" means).
func printPrune(w io.Writer, counts []payments.PruneCount, dry bool) {
	verb := "deleted"
	if dry {
		verb = "would delete"
	}
	done := map[string]bool{}
	for _, c := range counts {
		done[c.Table] = true
		before := c.Before.UTC().Format(time.RFC3339)
		if c.Err != nil {
			fmt.Fprintf(w, "prune %-15s stopped: %s %d rows from before %s, then: %s\n", c.Table, verb, c.Deleted, before, oneLine(c.Err.Error()))
			continue
		}
		fmt.Fprintf(w, "prune %-15s %s %d rows from before %s\n", c.Table, verb, c.Deleted, before)
	}
	for _, r := range payments.PruneRules {
		if !done[r.Table] {
			fmt.Fprintf(w, "prune %-15s kept whole\n", r.Table)
		}
	}
	if dry {
		for _, r := range payments.PruneRules {
			fmt.Fprintf(w, "  %s: %s\n", r.Table, r.Rule)
		}
	}
}

// pruneAge is an AGE flag: whole days ("400d"), a Go duration ("72h"), or "keep" (0: the table
// is not pruned). A bare number is refused: 90 of what?
type pruneAge struct{ d time.Duration }

func (a *pruneAge) String() string {
	if a == nil || a.d == 0 {
		return "keep"
	}
	return a.d.String()
}

func (a *pruneAge) Set(s string) error {
	switch {
	case s == "keep":
		a.d = 0
		return nil
	case strings.HasSuffix(s, "d"):
		n, err := strconv.Atoi(strings.TrimSuffix(s, "d"))
		if err != nil || n <= 0 || n > 100*365 {
			return fmt.Errorf("%q is not a number of days (400d)", s)
		}
		a.d = time.Duration(n) * 24 * time.Hour
	default:
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%q is not an age (400d, 72h, or keep)", s)
		}
		a.d = d
	}
	if a.d < payments.MinPruneAge {
		return fmt.Errorf("%s is under a day: no table is pruned younger", s)
	}
	return nil
}
