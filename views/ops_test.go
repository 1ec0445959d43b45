package views

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/a-h/templ"

	"pitlane/payments"
)

var opsNow = time.Date(2026, 11, 30, 12, 10, 5, 0, time.UTC)

func render(t *testing.T, c templ.Component) *goquery.Document {
	t.Helper()
	var buf bytes.Buffer
	if err := c.Render(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	doc, err := goquery.NewDocumentFromReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func ptr[T any](v T) *T { return &v }

// opsFixture is a day with three sampled half hours, two minutes of gateway calls and two
// replicas, one of them silent.
func opsFixture() payments.OpsCharts {
	stateFrom := opsNow.Truncate(payments.OpsStateBucket).Add(-payments.OpsHistory + payments.OpsStateBucket)
	sample := func(at time.Time, registered, unknown, completed, failed, due, leased int) payments.OpsSample {
		oldest := at.Add(-40 * time.Second)
		return payments.OpsSample{At: at, TakenAt: at.Add(5 * time.Second),
			Active:  map[payments.Status]int{payments.StatusRegistered: registered, payments.StatusUnknown: unknown},
			Settled: map[payments.Status]int{payments.StatusCompleted: completed, payments.StatusFailed: failed},
			Due:     due, Leased: leased, Flagged: 1, OldestDueAt: &oldest}
	}
	samples := []payments.OpsSample{
		// bucket 0 (a minute in: a sample's settled counts are what settled before it, and at
		// stateFrom that is before the day): two bars (Registered), one settled (Completed)
		sample(stateFrom.Add(time.Minute), 4, 0, 10, 0, 2, 1),
		sample(opsNow.Add(-40*time.Minute), 7, 2, 3, 1, 0, 3), // bucket 46
		sample(opsNow.Add(-time.Minute), 5, 1, 0, 0, 9, 2),    // bucket 47
	}
	backlogFrom := opsNow.Truncate(payments.OpsBacklogBucket).Add(-payments.OpsHistory + payments.OpsBacklogBucket)
	gwFrom := opsNow.Truncate(time.Minute).Add(-59 * time.Minute)
	gw := make([]payments.GatewayMinute, 60)
	for i := range gw {
		gw[i] = payments.GatewayMinute{Start: gwFrom.Add(time.Duration(i) * time.Minute), Calls: map[payments.GatewayOutcome]int{}}
	}
	gw[20].Calls = map[payments.GatewayOutcome]int{payments.GatewayOK: 40, "unknown": 3, "not_sent": 0}
	gw[20].Total, gw[20].P50, gw[20].P95 = 43, ptr(35.0), ptr(480.0)
	gw[59].Calls = map[payments.GatewayOutcome]int{payments.GatewayOK: 12, "definitive": 1, "not_sent": 2}
	gw[59].Total, gw[59].P50, gw[59].P95 = 15, ptr(20.0), ptr(95.5)
	swept := opsNow.Add(-3 * time.Second)
	return payments.OpsCharts{
		At:      opsNow,
		States:  payments.StateBuckets(samples, stateFrom, payments.OpsStateBucket, 48),
		Backlog: payments.BacklogBuckets(samples, backlogFrom, payments.OpsBacklogBucket, 96),
		Gateway: gw,
		Latest:  &samples[2],
		Replicas: []payments.ReplicaHealth{
			{Heartbeat: payments.Heartbeat{ReplicaID: "replica-a", Version: "v1.4.0+abc", Concurrency: 16, BeatAt: swept, LastSweepAt: &swept, InFlight: 4},
				Leased: 4},
			{Heartbeat: payments.Heartbeat{ReplicaID: "replica-b-with-a-rather-long-host-name-1234", Version: "v1.3.9", Concurrency: 8,
				BeatAt: opsNow.Add(-5 * time.Minute)}, Silent: true},
		},
	}
}

// chartOf checks the accessible frame of a chart: an SVG with role img, labelled by its own
// title and description (present, not empty), and no style attribute anywhere.
func chartOf(t *testing.T, doc *goquery.Document, id string) *goquery.Selection {
	t.Helper()
	svg := doc.Find(fmt.Sprintf(`svg[data-testid=%q]`, id+"-svg"))
	if svg.Length() != 1 {
		t.Fatalf("%s: %d SVGs", id, svg.Length())
	}
	if role, _ := svg.Attr("role"); role != "img" {
		t.Fatalf("%s: role %q", id, role)
	}
	labelled, _ := svg.Attr("aria-labelledby")
	for _, ref := range strings.Fields(labelled) {
		if txt := strings.TrimSpace(svg.Find("#" + ref).Text()); txt == "" {
			t.Fatalf("%s: aria-labelledby names %q, which is missing or empty", id, ref)
		}
	}
	if len(strings.Fields(labelled)) != 2 {
		t.Fatalf("%s: aria-labelledby %q, want its title and description", id, labelled)
	}
	if n := doc.Find("[style]").Length(); n > 0 {
		t.Fatalf("%d elements carry a style attribute (the CSP refuses them)", n)
	}
	return svg
}

func texts(s *goquery.Selection) []string {
	var out []string
	s.Each(func(_ int, e *goquery.Selection) { out = append(out, strings.TrimSpace(e.Text())) })
	return out
}

func TestSessionsChartRendersBarsAndNumbers(t *testing.T) {
	t.Parallel()
	oc := opsFixture()
	doc := render(t, SessionsChart(oc))
	svg := chartOf(t, doc, "ops-sessions")
	// Non-zero (bucket, state) values: bucket 0 Registered; 46 Registered, Unknown; 47 the same.
	if n := svg.Find(`rect[data-testid="bar"]`).Length(); n != 5 {
		t.Fatalf("%d bars, want 5", n)
	}
	if got := texts(svg.Find(`rect[data-testid="bar"] title`)); got[0] != "Registered, 12:30: 4" {
		t.Fatalf("first bar's title %q", got[0])
	}
	// A label every 4 hours on the hour (the day starts at yesterday 12:30).
	if got := strings.Join(texts(svg.Find(`[data-testid="x-tick"]`)), " "); got != "16:00 20:00 00:00 04:00 08:00 12:00" {
		t.Fatalf("x labels %q", got)
	}
	if got := texts(svg.Find(`[data-testid="y-tick"]`)); got[0] != "0" || got[len(got)-1] != "10" {
		t.Fatalf("y labels %v: want 0 … 10 (the tallest stack is 9)", got)
	}
	if got := texts(svg.Find(`[data-testid="y-unit"]`)); got[0] != "sessions" {
		t.Fatalf("y unit %v", got)
	}
	if got := strings.Join(texts(doc.Find(`[data-testid="legend-key"]`)), ","); got != "Registering,Registered,Unknown,Authorized,Canceling" {
		t.Fatalf("legend %q", got)
	}
	if desc := svg.Find("desc").Text(); !strings.Contains(desc, "At 12:09: 6 active (Registering 0, Registered 5, Unknown 1") {
		t.Fatalf("description %q", desc)
	}
	rows := doc.Find(`[data-testid="sessions-table"] [data-testid="sessions-row"]`)
	if rows.Length() != 3 || strings.Join(texts(rows.Eq(1).Find("th, td")), " ") != "11:30 0 7 2 0 0" {
		t.Fatalf("table: %d rows, second %q", rows.Length(), texts(rows.Eq(1).Find("th, td")))
	}
}

func TestSettledChart(t *testing.T) {
	t.Parallel()
	doc := render(t, SettledChart(opsFixture()))
	svg := chartOf(t, doc, "ops-settled")
	if n := svg.Find(`rect[data-testid="bar"]`).Length(); n != 3 { // 10 Completed; 3 Completed + 1 Failed
		t.Fatalf("%d bars, want 3", n)
	}
	if desc := svg.Find("desc").Text(); !strings.Contains(desc, "13 Completed, 1 Failed, 0 Canceled in all") {
		t.Fatalf("description %q", desc)
	}
}

// TestSettledChartDrawsTheHalfHourAGapEndsIn: no patrol sampled from 11:20 to 12:00; the sample
// of 12:00 counts what settled over the gap, and StateBuckets files it in the 11:30 half hour
// (the instant before 12:00), where no sample was taken. The chart and its table show it there:
// gated on Sampled (a sample taken in the half hour, as the active sessions are) they hid it.
// Negative control: settledChart and the table gated on b.Sampled — no bar, no row.
func TestSettledChartDrawsTheHalfHourAGapEndsIn(t *testing.T) {
	t.Parallel()
	oc := opsFixture()
	stateFrom := opsNow.Truncate(payments.OpsStateBucket).Add(-payments.OpsHistory + payments.OpsStateBucket)
	gapEnd := opsNow.Truncate(payments.OpsStateBucket) // 12:00
	samples := []payments.OpsSample{
		{At: gapEnd.Add(-40 * time.Minute), Active: map[payments.Status]int{payments.StatusRegistered: 1}, Settled: map[payments.Status]int{}},
		{At: gapEnd, Active: map[payments.Status]int{payments.StatusRegistered: 1},
			Settled: map[payments.Status]int{payments.StatusFailed: 6}},
	}
	oc.States = payments.StateBuckets(samples, stateFrom, payments.OpsStateBucket, 48)
	doc := render(t, SettledChart(oc))
	svg := chartOf(t, doc, "ops-settled")
	if bars := texts(svg.Find(`rect[data-testid="bar"] title`)); len(bars) != 1 || !strings.Contains(bars[0], "11:30") {
		t.Fatalf("settled bars %q, want the 6 Failed in the 11:30 half hour", bars)
	}
	rows := doc.Find(`[data-testid="settled-table"] [data-testid="settled-row"]`)
	if got := texts(rows.Eq(1).Find("th, td")); rows.Length() != 2 || strings.Join(got, " ") != "11:30 0 6 0" {
		t.Fatalf("table: %d rows, second %q", rows.Length(), got)
	}
}

func TestGatewayChartBarsAndLatencyLines(t *testing.T) {
	t.Parallel()
	doc := render(t, GatewayChart(opsFixture()))
	calls := chartOf(t, doc, "ops-gateway-calls")
	if n := calls.Find(`rect[data-testid="bar"]`).Length(); n != 5 { // 40 ok, 3 unknown; 12 ok, 1 refused, 2 not sent
		t.Fatalf("%d bars, want 5", n)
	}
	if got := strings.Join(texts(calls.Find(`[data-testid="x-tick"]`)), " "); got != "11:20 11:30 11:40 11:50 12:00 12:10" {
		t.Fatalf("x labels %q", got)
	}
	lat := chartOf(t, doc, "ops-gateway-latency")
	if n := lat.Find(`[data-testid="line"]`).Length(); n != 2 {
		t.Fatalf("%d latency lines, want p50 and p95", n)
	}
	if n := lat.Find(`circle[data-testid="point"]`).Length(); n != 4 {
		t.Fatalf("%d latency points, want 2 minutes × 2", n)
	}
	if d, _ := lat.Find("path").Eq(1).Attr("stroke-dasharray"); d != dashP95 {
		t.Fatalf("p95 is not dashed: %q", d)
	}
	if got := texts(lat.Find(`circle[data-testid="point"] title`)); got[3] != "p95, 12:10: 95.5 ms" {
		t.Fatalf("points %v", got)
	}
	if desc := lat.Find("desc").Text(); !strings.Contains(desc, "At 12:10: p50 20 ms, p95 95.5 ms") {
		t.Fatalf("latency description %q", desc)
	}
	if desc := calls.Find("desc").Text(); !strings.Contains(desc, "58 calls (52 answered, 1 refused, 3 no answer, 2 not sent)") {
		t.Fatalf("calls description %q", desc)
	}
	rows := doc.Find(`[data-testid="gateway-row"]`)
	if rows.Length() != 2 || strings.Join(texts(rows.Eq(0).Find("th, td")), " ") != "11:31 40 0 3 0 35 ms 480 ms" {
		t.Fatalf("table: %d rows, first %q", rows.Length(), texts(rows.Eq(0).Find("th, td")))
	}
}

func TestBacklogChartLines(t *testing.T) {
	t.Parallel()
	doc := render(t, BacklogChart(opsFixture()))
	svg := chartOf(t, doc, "ops-backlog")
	if n := svg.Find(`[data-testid="line"]`).Length(); n != 3 {
		t.Fatalf("%d lines, want due, leased, flagged", n)
	}
	if n := svg.Find(`circle[data-testid="point"]`).Length(); n != 9 {
		t.Fatalf("%d points, want 3 sampled quarter hours × 3 lines", n)
	}
	// 96 quarter hours, a label every 4 hours: six labels.
	if n := svg.Find(`[data-testid="x-tick"]`).Length(); n != 6 {
		t.Fatalf("%d x labels", n)
	}
	if desc := svg.Find("desc").Text(); !strings.Contains(desc, "At 12:09: 9 due (the oldest waiting 45s), 2 leased, 1 flagged. Most due: 9 at 12:00.") {
		t.Fatalf("description %q", desc)
	}
	if rows := doc.Find(`[data-testid="backlog-row"]`); rows.Length() != 3 {
		t.Fatalf("%d table rows", rows.Length())
	}
}

func TestReplicasChart(t *testing.T) {
	t.Parallel()
	doc := render(t, ReplicasChart(opsFixture()))
	svg := chartOf(t, doc, "ops-replicas")
	if got := strings.Join(texts(svg.Find(`[data-testid="replica-state"]`)), ","); got != "sweeping,silent" {
		t.Fatalf("states %q", got)
	}
	names := texts(svg.Find(`[data-testid="replica-name"]`))
	if names[0] != "replica-a" || names[1] != "replica-b-with-a-rather-lon…" {
		t.Fatalf("names %q", names)
	}
	// 4 of 16 on a 360-unit track.
	if w, _ := svg.Find(`[data-testid="replica-leased"]`).First().Attr("width"); w != "90" {
		t.Fatalf("leased gauge width %s, want 90", w)
	}
	if d := texts(svg.Find(`[data-testid="replica-detail"]`))[0]; d != "4 of 16 sessions leased · v1.4.0+abc · swept 3s ago" {
		t.Fatalf("detail %q", d)
	}
	rows := doc.Find(`[data-testid="replica-row"]`)
	if rows.Length() != 2 || texts(rows.Eq(1).Find(`[data-testid="replica-row-state"]`))[0] != "silent" {
		t.Fatalf("table rows %d", rows.Length())
	}
	if desc := svg.Find("desc").Text(); !strings.Contains(desc, "replica-b-with-a-rather-long-host-name-1234 silent") || !strings.Contains(desc, "last heartbeat 5m ago") {
		t.Fatalf("description %q", desc)
	}
}

// TestOpsPageEmpty: a fresh database — no sample, no call, no replica — draws every chart's
// frame and says there is nothing yet, with no bar or point.
func TestOpsPageEmpty(t *testing.T) {
	t.Parallel()
	oc := opsFixture()
	oc.States = payments.StateBuckets(nil, oc.States[0].Start, payments.OpsStateBucket, 48)
	oc.Backlog = payments.BacklogBuckets(nil, oc.Backlog[0].Start, payments.OpsBacklogBucket, 96)
	for i := range oc.Gateway {
		oc.Gateway[i] = payments.GatewayMinute{Start: oc.Gateway[i].Start, Calls: map[payments.GatewayOutcome]int{}}
	}
	oc.Latest, oc.Replicas = nil, nil
	doc := render(t, Ops(OpsView{Page: Page{Title: "Operations", Nav: "ops"}, C: oc}))
	for _, id := range []string{"ops-sessions", "ops-settled", "ops-gateway-calls", "ops-gateway-latency", "ops-backlog", "ops-replicas"} {
		chartOf(t, doc, id)
	}
	if n := doc.Find(`[data-testid="bar"], [data-testid="point"]`).Length(); n != 0 {
		t.Fatalf("%d bars or points on an empty page", n)
	}
	// The gateway's zero counts are figures (a quiet minute), not a missing sample.
	if n := doc.Find(`[data-testid="chart-empty"]`).Length(); n != 5 {
		t.Fatalf("%d empty notes, want 5 (sessions, settled, latency, backlog, replicas)", n)
	}
	// Every id on the page is unique (titles and descriptions are referenced by id).
	seen := map[string]bool{}
	doc.Find("[id]").Each(func(_ int, e *goquery.Selection) {
		id, _ := e.Attr("id")
		if seen[id] {
			t.Errorf("id %q twice", id)
		}
		seen[id] = true
	})
}

// TestEventsWebhookCard: the events webhook's state in a word and its figures — off, starting,
// delivering, behind, failing (with why and when next) — and what waits, capped.
func TestEventsWebhookCard(t *testing.T) {
	t.Parallel()
	started := opsNow.Add(-time.Hour)
	delivered := opsNow.Add(-30 * time.Second)
	for _, tc := range []struct {
		name  string
		w     payments.EventsWebhookState
		state string
		want  map[string]string // testid → text it contains
	}{
		{"off", payments.EventsWebhookState{}, "off",
			map[string]string{"webhook-note": "EVENTS_WEBHOOK_URL is not set on this replica"}},
		{"starting", payments.EventsWebhookState{On: true}, "starting",
			map[string]string{"webhook-note": "Begins at the feed's end"}},
		{"delivering", payments.EventsWebhookState{On: true, Started: true, StartedAt: started, DeliveredAt: &delivered, DeliveredEvents: 204,
			Waiting: 3, OldestWaiting: ptr(opsNow.Add(-2 * time.Second)), LeaseOwner: "replica-a"}, "delivering",
			map[string]string{"webhook-delivered": "204 events since 2026-11-30 11:10:05 UTC, the last 30s ago",
				"webhook-waiting": "3 events, the oldest from 2s ago", "webhook-lease": "replica-a"}},
		{"behind", payments.EventsWebhookState{On: true, Started: true, StartedAt: started,
			Waiting: payments.EventsWebhookWaitingShown + 1, OldestWaiting: ptr(opsNow.Add(-5 * time.Minute))}, "behind",
			map[string]string{"webhook-delivered": "none yet", "webhook-waiting": "over 1000 events, the oldest from 5m ago"}},
		{"failing elsewhere", payments.EventsWebhookState{Started: true, StartedAt: started, DeliveredAt: &delivered, DeliveredEvents: 1,
			Waiting: 1, OldestWaiting: ptr(opsNow.Add(-10 * time.Second)), Failures: 3, NextAttemptAt: ptr(opsNow.Add(4 * time.Second)),
			LastError: "the shop's endpoint answered 503"}, "failing",
			map[string]string{"webhook-failing": "3 failed POSTs in a row; the next at 2026-11-30 12:10:09 UTC: the shop's endpoint answered 503",
				"webhook-waiting": "1 event, from 10s ago", "webhook-note": "does not push"}},
		{"failing on a page", payments.EventsWebhookState{On: true, Started: true, StartedAt: started, Waiting: 40, OldestWaiting: ptr(opsNow.Add(-time.Minute)),
			Failures: 2, LastError: "the shop's endpoint answered 413", FirstWaiting: "812-77", FirstWaitingOrder: "o-big"}, "failing",
			map[string]string{"webhook-next-page": "The next POST carries at most 25 events (halved after each failure), from event 812-77 (order o-big)."}},
		{"failing on one event", payments.EventsWebhookState{On: true, Started: true, StartedAt: started, Waiting: 40, OldestWaiting: ptr(opsNow.Add(-time.Hour)),
			Failures: 9, LastError: "the shop's endpoint answered 422", FirstWaiting: "812-77", FirstWaitingOrder: "\u05d0-order"}, "failing",
			map[string]string{"webhook-next-page": "The next POST carries event 812-77 (order \u05d0-order) alone, and the shop refuses it: if it keeps refusing it, skip it by setting events_webhook.cursor to that id"}},
		// A plain outage is no reason to skip the event (a review: the card said to).
		{"failing on one event, the shop down", payments.EventsWebhookState{On: true, Started: true, StartedAt: started, Waiting: 40, OldestWaiting: ptr(opsNow.Add(-time.Hour)),
			Failures: 9, LastError: "Post: context deadline exceeded", FirstWaiting: "812-77", FirstWaitingOrder: "o-1"}, "failing",
			map[string]string{"webhook-next-page": "alone, until one succeeds: the shop's endpoint does not answer"}},
		{"failing on one event, the shop refusing the secret", payments.EventsWebhookState{On: true, Started: true, StartedAt: started, Waiting: 40, OldestWaiting: ptr(opsNow.Add(-time.Hour)),
			Failures: 9, LastError: "the shop's endpoint answered 401", FirstWaiting: "812-77", FirstWaitingOrder: "o-1"}, "failing",
			map[string]string{"webhook-next-page": "refuses every POST whatever it carries"}},
		{"failing on one event, the shop busy", payments.EventsWebhookState{On: true, Started: true, StartedAt: started, Waiting: 40, OldestWaiting: ptr(opsNow.Add(-time.Hour)),
			Failures: 9, LastError: "the shop's endpoint answered 429", FirstWaiting: "812-77", FirstWaitingOrder: "o-1"}, "failing",
			map[string]string{"webhook-next-page": "alone, until one succeeds"}},
	} {
		oc := opsFixture()
		oc.Webhook = tc.w
		doc := render(t, EventsWebhookCard(oc))
		if got := strings.TrimSpace(doc.Find(`[data-testid="webhook-state"]`).Text()); got != tc.state {
			t.Errorf("%s: state %q, want %q", tc.name, got, tc.state)
		}
		for id, want := range tc.want {
			if got := strings.Join(strings.Fields(doc.Find(fmt.Sprintf(`[data-testid=%q]`, id)).Text()), " "); !strings.Contains(got, want) {
				t.Errorf("%s: %s = %q, want it to say %q", tc.name, id, got, want)
			}
		}
		if n := doc.Find(`[data-testid="webhook-failing"]`).Length(); (n == 1) != (tc.w.Failures > 0) {
			t.Errorf("%s: %d failing lines", tc.name, n)
		}
		if strings.HasPrefix(tc.name, "failing on one event, the shop ") && strings.Contains(doc.Find(`[data-testid="webhook-next-page"]`).Text(), "skip") {
			t.Errorf("%s: the card says to skip an event the shop did not refuse", tc.name)
		}
		// The order is the shop's text: isolated from the sentence around it (right-to-left
		// letters would reorder the event id beside it).
		if tc.w.FirstWaitingOrder != "" && doc.Find(`[data-testid="webhook-next-page"] bdi`).Text() != tc.w.FirstWaitingOrder {
			t.Errorf("%s: the waiting event's order is not isolated", tc.name)
		}
	}
}
