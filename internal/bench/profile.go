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
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		defer conn.Close(context.WithoutCancel(ctx))
		rows, err := conn.Query(context.WithoutCancel(ctx), `SELECT calls, round(total_exec_time)::bigint, round(mean_exec_time::numeric, 3)::text,
			regexp_replace(query, '\s+', ' ', 'g') FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 40`)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: pg_stat_statements: %v\n", err)
			return
		}
		defer rows.Close()
		var b strings.Builder
		fmt.Fprintf(&b, "%10s %10s %10s  %s\n", "calls", "total ms", "mean ms", "query")
		for rows.Next() {
			var calls, total int64
			var mean, q string
			if err := rows.Scan(&calls, &total, &mean, &q); err != nil {
				break
			}
			fmt.Fprintf(&b, "%10d %10d %10s  %.200s\n", calls, total, mean, q)
		}
		if err := os.WriteFile(filepath.Join(dir, "statements.txt"), []byte(b.String()), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		}
	}, nil
}
