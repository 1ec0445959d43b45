package handlers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
)

// opsBusyDay fills the tables the Operations page draws the way a busy day looks: a sample
// every minute of the last 24 hours with a daily wave of traffic and an outage around 03:00 (a
// backlog that builds and drains), gateway calls over the last hour with a burst of timeouts,
// and three replicas — one sweeping, one backing off, one silent. Straight into the tables:
// the page reads them, and a day through the core would take minutes.
func (b *consoleBench) opsBusyDay(t testing.TB) {
	t.Helper()
	now := b.clock.Now()
	for _, sql := range []string{
		`INSERT INTO ops_samples (at, taken_at, taken_by, registering, registered, unknown, authorized, canceling, flagged,
			due, oldest_due_at, leased, settled_since, completed, failed, canceled)
		SELECT m, m + interval '3 seconds', 'replica-a',
			(2 + 2 * w)::int, (40 + 30 * w)::int, (CASE WHEN o THEN 25 ELSE 1 END), (6 + 4 * w)::int, 1, 3,
			(CASE WHEN o THEN 30 + (extract(minute FROM m)::int % 20) * 6 ELSE (extract(minute FROM m)::int % 4) END),
			m - (CASE WHEN o THEN interval '4 minutes' ELSE interval '2 seconds' END),
			(CASE WHEN o THEN 2 ELSE 8 + (extract(minute FROM m)::int % 5) END),
			m - interval '1 minute', (3 + 3 * w)::int, (CASE WHEN o THEN 0 ELSE 1 END), (extract(minute FROM m)::int % 17 = 0)::int
		FROM generate_series(date_trunc('minute', $1::timestamptz) - interval '1439 minutes', date_trunc('minute', $1::timestamptz), interval '1 minute') m,
			LATERAL (SELECT 0.5 + 0.5 * sin(extract(epoch FROM m) / 86400 * 2 * pi()) AS w,
				m >= date_trunc('hour', $1::timestamptz) - interval '6 hours' AND m < date_trunc('hour', $1::timestamptz) - interval '5 hours 20 minutes' AS o) x
		WHERE m < date_trunc('hour', $1::timestamptz) - interval '9 hours' OR m >= date_trunc('hour', $1::timestamptz) - interval '8 hours 30 minutes'`,
		`INSERT INTO gateway_calls (operation, outcome, latency_ms, created_at)
		SELECT 'status', CASE WHEN i % 97 = 0 THEN 'definitive' WHEN burst AND i % 3 = 0 THEN 'unknown' WHEN i % 151 = 0 THEN 'not_sent' ELSE 'ok' END,
			CASE WHEN burst AND i % 3 = 0 THEN 10000 ELSE 20 + (i * 37) % 180 END,
			$1::timestamptz - interval '59 minutes 50 seconds' + i * interval '1.7 seconds'
		FROM generate_series(0, 2100) i,
			LATERAL (SELECT i BETWEEN 1200 AND 1400 AS burst) x`,
		`INSERT INTO sweeper_heartbeats (replica_id, version, concurrency, started_at, beat_at, last_sweep_at, in_flight,
			backoff_until, backoff_reason, last_round_driven, last_round_calls, last_round_failed, driven_total)
		VALUES ('replica-b', 'v1.4.2+3f2a9c1d0e7b', 16, $1::timestamptz - interval '2 days', $1::timestamptz - interval '1 second',
				$1::timestamptz - interval '1 second', 3, $1::timestamptz + interval '40 seconds', 'the gateway failed 14 of 20 calls', 20, 20, 14, 48211),
			('replica-c', 'v1.4.1+9be01c77a2d4', 16, $1::timestamptz - interval '5 days', $1::timestamptz - interval '7 minutes',
				$1::timestamptz - interval '7 minutes', 0, NULL, '', 0, 0, 0, 91544)`,
	} {
		b.exec(t, sql, now)
	}
	// replica-a is this bench's own patrol: a real heartbeat, and leases the page counts.
	for i, o := range []string{"o-ops-1", "o-ops-2", "o-ops-3", "o-ops-4", "o-ops-5"} {
		s := b.payment(t, o, int64(1000+i))
		b.exec(t, `UPDATE payment_sessions SET lease_owner = 'replica-a', lease_until = $2, lease_token = gen_random_uuid() WHERE id = $1`,
			s.ID, now.Add(time.Minute))
	}
	if _, err := b.svc.PatrolRound(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (b *consoleBench) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
}

// TestBrowserOpsPage: the Operations page in Chromium at a desk's width and a 360 px phone's:
// every chart drawn and sized to its card, nothing refused by the Content-Security-Policy (no
// inline style or script), axe-core finds no violation (WCAG 2.x A/AA and best practices:
// the charts' names, contrast, tables), nothing scrolls sideways on the phone, and each chart's
// numbers open as a table. Screenshots: ops-desktop.png, ops-phone.png.
func TestBrowserOpsPage(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	b.opsBusyDay(t)
	srv := b.server(t, b.e)

	ctx := newBrowser(t)
	csp := watchCSP(t, ctx)
	setViewport(t, ctx, viewport{"desktop", 1280, 900, false})
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	charts := []string{"ops-replicas", "ops-sessions", "ops-settled", "ops-gateway-calls", "ops-gateway-latency", "ops-backlog"}
	for _, vp := range []viewport{{"desktop", 1280, 900, false}, {"phone", 360, 740, true}} {
		setViewport(t, ctx, vp)
		within(t, ctx, 20*time.Second,
			chromedp.Navigate(srv.URL+"/ops"),
			chromedp.WaitVisible(chromedp.CSS(`[data-testid="ops-backlog-svg"]`)),
		)
		// Each chart fills its card: as wide as the card's content, and in proportion.
		for _, id := range charts {
			wh, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`(() => {
				const s = document.querySelector('[data-testid="`+id+`-svg"]'), r = s.getBoundingClientRect();
				return [r.width, r.height, s.parentElement.clientWidth];
			})()`))
			if err != nil || len(wh) != 3 {
				t.Fatalf("%s at %s: size %v %v", id, vp.name, wh, err)
			}
			if wh[0] < 280 || wh[0] > 700 || wh[1] < 60 || wh[0] > wh[2] {
				t.Errorf("%s at %s: drawn %v × %v in a card %v wide", id, vp.name, wh[0], wh[1], wh[2])
			}
		}
		bars, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('[data-testid="ops-live"] rect[data-testid="bar"]').length`))
		if err != nil || bars < 100 {
			t.Fatalf("%d bars drawn at %s (%v)", bars, vp.name, err)
		}
		over, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, window.innerWidth]`))
		if err != nil || len(over) != 2 || over[0] > over[1] {
			t.Errorf("%s: the page is %v px wide in its window (sideways scrolling) %v", vp.name, over, err)
		}
		injectAxe(t, ctx)
		checkA11y(t, ctx, "ops at "+vp.name)
		screenshot(t, ctx, "ops-"+vp.name+".png")
	}

	// The numbers of a chart: a table under "The numbers", opened without any script.
	within(t, ctx, 10*time.Second,
		liveClick(chromedp.CSS(`[data-testid="chart-gateway"] summary`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="gateway-table"]`)),
	)
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('[data-testid="gateway-row"]').length`))
	if err != nil || rows != 60 {
		t.Fatalf("%d minutes in the gateway table, want 60 (%v)", rows, err)
	}
	if v := csp(); len(v) > 0 {
		t.Fatalf("the browser refused content under the Content-Security-Policy:\n%s", strings.Join(v, "\n"))
	}
}
