package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"

	"github.com/jackc/pgx/v5"
)

// startProfile writes a Go CPU profile of the whole run to dir/cpu.pprof and, when the run ends,
// the cluster's most expensive statements (pg_stat_statements) to dir/statements.txt.
func startProfile(ctx context.Context, dir, adminURL string) (stop func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `ALTER SYSTEM SET pg_stat_statements.track_planning = on`); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		defer conn.Close(context.WithoutCancel(ctx))
		rows, err := conn.Query(context.WithoutCancel(ctx), `SELECT coalesce(d.datname, s.dbid::text), s.calls, s.plans, round(s.total_exec_time)::bigint, round(s.total_plan_time)::bigint,
			round(s.mean_exec_time::numeric, 3)::text,
			round(s.rows::numeric / greatest(s.calls, 1), 1)::text, round((s.shared_blks_hit + s.shared_blks_read)::numeric / greatest(s.calls, 1), 1)::text,
			regexp_replace(s.query, '\s+', ' ', 'g')
			FROM pg_stat_statements s LEFT JOIN pg_database d ON d.oid = s.dbid
			ORDER BY d.datname, s.total_exec_time + s.total_plan_time DESC`)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: pg_stat_statements: %v\n", err)
			return
		}
		defer rows.Close()
		var b strings.Builder
		fmt.Fprintf(&b, "%-10s %10s %10s %10s %10s %10s %9s %9s  %s\n", "database", "calls", "plans", "exec ms", "plan ms", "mean ms", "rows/call", "blks/call", "query")
		for rows.Next() {
			var calls, plans, exec, plan int64
			var db, mean, perRow, perBlk, q string
			if err := rows.Scan(&db, &calls, &plans, &exec, &plan, &mean, &perRow, &perBlk, &q); err != nil {
				break
			}
			fmt.Fprintf(&b, "%-10s %10d %10d %10d %10d %10s %9s %9s  %.2000s\n", db, calls, plans, exec, plan, mean, perRow, perBlk, q)
		}
		if err := os.WriteFile(filepath.Join(dir, "statements.txt"), []byte(b.String()), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		}
	}, nil
}
