package views

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"pitlane/payments"
	"pitlane/views/chart"
)

// OpsView is the Operations page: the pictures of the sessions, the gateway, the patrol's
// backlog and the replicas (payments.OpsCharts).
type OpsView struct {
	Page Page
	C    payments.OpsCharts
}

// OpsLive names the part of the Operations page that is all its charts: one fragment, so a
// live update can re-render it alone (render.Fragments).
const OpsLive = "ops-live"

// Colours of the series: the Okabe–Ito palette, which people with the common colour-vision
// deficiencies tell apart; every chart also has a legend and a table of its numbers.
var (
	stateColors = map[payments.Status]string{
		payments.StatusRegistering: "#e69f00", payments.StatusRegistered: "#56b4e9", payments.StatusUnknown: "#d55e00",
		payments.StatusAuthorized: "#009e73", payments.StatusCanceling: "#cc79a7",
		payments.StatusCompleted: "#009e73", payments.StatusFailed: "#d55e00", payments.StatusCanceled: "#8a8f99",
	}
	outcomeColors = map[payments.GatewayOutcome]string{
		payments.GatewayOK: "#0072b2", "definitive": "#e69f00", "unknown": "#d55e00", "not_sent": "#8a8f99",
	}
	outcomeNames = map[payments.GatewayOutcome]string{
		payments.GatewayOK: "answered", "definitive": "refused", "unknown": "no answer", "not_sent": "not sent",
	}
)

const (
	colorP50 = "#0072b2"
	colorP95 = "#d55e00"
	dashP95  = "4 2"
)

// OutcomeName is how the page names a gateway call's outcome.
func OutcomeName(o payments.GatewayOutcome) string {
	if n, ok := outcomeNames[o]; ok {
		return n
	}
	return string(o)
}

// hhmm prints a bucket's start (UTC, as the whole console).
func hhmm(t time.Time) string { return t.UTC().Format("15:04") }

// slotsOf names the slots starting at starts and labels on the x axis those on a multiple of
// every (UTC: 00:00, 04:00, …; 11:20, 11:30, …).
func slotsOf(starts []time.Time, every time.Duration) ([]string, func(int) bool) {
	names := make([]string, len(starts))
	for i, t := range starts {
		names[i] = hhmm(t)
	}
	return names, func(i int) bool { return starts[i].Truncate(every).Equal(starts[i]) }
}

// count prints a count with thin spaces between thousands (1 204).
func count(n int) string {
	s := strconv.Itoa(n)
	if len(s) <= 4 {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteRune(' ')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// ms prints a latency.
func ms(v float64) string { return chart.Label(v) + " ms" }

func msPtr(v *float64) string {
	if v == nil {
		return "—"
	}
	return ms(*v)
}

// wait prints how long something has waited, as Relative does ("40s", "3m", "2h05m").
func wait(d time.Duration) string {
	if d <= 0 {
		return "—"
	}
	var t time.Time
	return strings.TrimSuffix(Relative(t, t.Add(-d)), " ago")
}

// sessionsChart: the active sessions by state at the end of each half hour.
func sessionsChart(oc payments.OpsCharts) chart.Chart {
	slots, tickAt := stateSlots(oc)
	stacked := stateSeries(oc, payments.ActiveStatuses, func(b payments.StateBucket) bool { return b.Sampled },
		func(b payments.StateBucket) map[payments.Status]int { return b.Active })
	desc := "No samples yet: the patrol writes one every minute."
	if l := oc.Latest; l != nil {
		total := 0
		parts := make([]string, 0, len(payments.ActiveStatuses))
		for _, st := range payments.ActiveStatuses {
			total += l.Active[st]
			parts = append(parts, fmt.Sprintf("%s %s", st, count(l.Active[st])))
		}
		desc = fmt.Sprintf("Active sessions by state at the end of each half hour of the last 24 hours (UTC). At %s: %s active (%s).",
			hhmm(l.At), count(total), strings.Join(parts, ", "))
	}
	return chart.Build(chart.Spec{ID: "ops-sessions", Title: "Active sessions by state, last 24 hours", Desc: desc,
		Slots: slots, TickAt: tickAt, Stacked: stacked, YUnit: "sessions", Whole: true})
}

// stateSeries is a series per status of the half hours' counts that pick chooses; a half hour
// that has none (sampled false) is a gap.
func stateSeries(oc payments.OpsCharts, statuses []payments.Status, sampled func(payments.StateBucket) bool,
	pick func(payments.StateBucket) map[payments.Status]int) []chart.Series {
	out := make([]chart.Series, len(statuses))
	for k, st := range statuses {
		v := make([]float64, len(oc.States))
		for i, b := range oc.States {
			v[i] = math.NaN()
			if sampled(b) {
				v[i] = float64(pick(b)[st])
			}
		}
		out[k] = chart.Series{Name: string(st), Color: stateColors[st], Values: v}
	}
	return out
}

// stateSlots: the half hours of the day, labelled every 4 hours.
func stateSlots(oc payments.OpsCharts) ([]string, func(int) bool) {
	starts := make([]time.Time, len(oc.States))
	for i, b := range oc.States {
		starts[i] = b.Start
	}
	return slotsOf(starts, 4*time.Hour)
}

// settledChart: the sessions settled in each half hour, by outcome.
func settledChart(oc payments.OpsCharts) chart.Chart {
	slots, tickAt := stateSlots(oc)
	// A half hour's settled counts come from the samples that end in it, which may be one no
	// sample was taken in (the end of a gap: StateBuckets), so it is drawn by SettledSampled.
	stacked := stateSeries(oc, payments.SettledStatuses, func(b payments.StateBucket) bool { return b.SettledSampled },
		func(b payments.StateBucket) map[payments.Status]int { return b.Settled })
	totals := map[payments.Status]int{}
	for _, b := range oc.States {
		for st, n := range b.Settled {
			totals[st] += n
		}
	}
	desc := fmt.Sprintf("Sessions settled in each half hour of the last 24 hours (UTC): %s Completed, %s Failed, %s Canceled in all.",
		count(totals[payments.StatusCompleted]), count(totals[payments.StatusFailed]), count(totals[payments.StatusCanceled]))
	return chart.Build(chart.Spec{ID: "ops-settled", Title: "Sessions settled per half hour, last 24 hours", Desc: desc,
		Slots: slots, TickAt: tickAt, Stacked: stacked, YUnit: "sessions", Whole: true})
}

// gatewayCharts: calls per minute stacked by outcome, and the latency percentiles per minute.
func gatewayCharts(oc payments.OpsCharts) (calls, latency chart.Chart) {
	starts := make([]time.Time, len(oc.Gateway))
	for i, m := range oc.Gateway {
		starts[i] = m.Start
	}
	slots, tickAt := slotsOf(starts, 10*time.Minute)
	totals := map[payments.GatewayOutcome]int{}
	all := 0
	var stacked []chart.Series
	for _, o := range payments.GatewayOutcomes {
		v := make([]float64, len(oc.Gateway))
		for i, m := range oc.Gateway {
			v[i] = float64(m.Calls[o])
			totals[o] += m.Calls[o]
			all += m.Calls[o]
		}
		stacked = append(stacked, chart.Series{Name: OutcomeName(o), Color: outcomeColors[o], Values: v})
	}
	p50, p95 := make([]float64, len(oc.Gateway)), make([]float64, len(oc.Gateway))
	last := -1
	for i, m := range oc.Gateway {
		p50[i], p95[i] = math.NaN(), math.NaN()
		if m.P50 != nil && m.P95 != nil {
			p50[i], p95[i] = *m.P50, *m.P95
			last = i
		}
	}
	parts := make([]string, 0, len(payments.GatewayOutcomes))
	for _, o := range payments.GatewayOutcomes {
		parts = append(parts, fmt.Sprintf("%s %s", count(totals[o]), OutcomeName(o)))
	}
	callsDesc := fmt.Sprintf("Gateway calls per minute over the last 60 minutes (UTC), stacked by outcome: %s calls (%s).",
		count(all), strings.Join(parts, ", "))
	latDesc := "No call reached the gateway in the last 60 minutes."
	if last >= 0 {
		m := oc.Gateway[last]
		latDesc = fmt.Sprintf("Median (p50) and 95th percentile (p95) latency of the calls that reached the gateway, per minute. At %s: p50 %s, p95 %s.",
			hhmm(m.Start), ms(*m.P50), ms(*m.P95))
	}
	calls = chart.Build(chart.Spec{ID: "ops-gateway-calls", Title: "Gateway calls per minute by outcome, last 60 minutes", Desc: callsDesc,
		Slots: slots, TickAt: tickAt, Stacked: stacked, YUnit: "calls / min", Whole: true})
	latency = chart.Build(chart.Spec{ID: "ops-gateway-latency", Title: "Gateway latency per minute, p50 and p95", Desc: latDesc,
		Slots: slots, TickAt: tickAt, YUnit: "ms", Height: 150, Format: ms,
		Lines: []chart.Series{{Name: "p50", Color: colorP50, Values: p50}, {Name: "p95", Color: colorP95, Dash: dashP95, Values: p95}}})
	return calls, latency
}

// backlogChart: the most due sessions and the most leased in each quarter hour.
func backlogChart(oc payments.OpsCharts) chart.Chart {
	starts := make([]time.Time, len(oc.Backlog))
	for i, b := range oc.Backlog {
		starts[i] = b.Start
	}
	slots, tickAt := slotsOf(starts, 4*time.Hour)
	due, leased, flagged := make([]float64, len(oc.Backlog)), make([]float64, len(oc.Backlog)), make([]float64, len(oc.Backlog))
	peak, peakAt := 0, ""
	for i, b := range oc.Backlog {
		due[i], leased[i], flagged[i] = math.NaN(), math.NaN(), math.NaN()
		if b.Sampled {
			due[i], leased[i], flagged[i] = float64(b.Due), float64(b.Leased), float64(b.Flagged)
			if b.Due > peak {
				peak, peakAt = b.Due, hhmm(b.Start)
			}
		}
	}
	desc := "No samples yet: the patrol writes one every minute."
	if l := oc.Latest; l != nil {
		waiting := "none waiting"
		if l.OldestDueAt != nil {
			waiting = "the oldest waiting " + wait(l.TakenAt.Sub(*l.OldestDueAt))
		}
		desc = fmt.Sprintf("The patrol's backlog over the last 24 hours (UTC): the most sessions due for a look that no patrol held, and the most under a lease, in each quarter hour; flagged sessions wait for finance. At %s: %s due (%s), %s leased, %s flagged.",
			hhmm(l.At), count(l.Due), waiting, count(l.Leased), count(l.Flagged))
		if peak > 0 {
			desc += fmt.Sprintf(" Most due: %s at %s.", count(peak), peakAt)
		}
	}
	return chart.Build(chart.Spec{ID: "ops-backlog", Title: "The sweeper's backlog, last 24 hours", Desc: desc,
		Slots: slots, TickAt: tickAt, YUnit: "sessions", Whole: true,
		Lines: []chart.Series{
			{Name: "due", Color: "#d55e00", Values: due},
			{Name: "leased", Color: "#0072b2", Dash: "4 2", Values: leased},
			{Name: "flagged", Color: "#cc79a7", Dash: "1 2", Values: flagged},
		}})
}

// replicaRow is one replica in the health chart.
type replicaRow struct {
	Y          float64 // the row's text baseline
	Name       string  // the replica id, shortened to fit
	Detail     string  // version, last sweep
	State      string  // sweeping, backing off, silent, starting
	StateColor string
	Meter      chart.Meter
	MeterText  string // "3 of 16 sessions leased"
}

// replicaChart is the geometry of the replica health chart.
type replicaChart struct {
	ID, Title, Desc string
	Width, Height   float64
	Rows            []replicaRow
}

const (
	replicaChartWidth = 360
	replicaRowHeight  = 44
	replicaNameMax    = 28 // characters of the replica id in the picture (the table has it whole)
)

// Health colours: text and gauge.
const (
	healthOK      = "#137a3a"
	healthBackoff = "#8a5300"
	healthSilent  = "#b42318"
)

// ReplicaState is how a replica's patrol is doing, in a word, and its colour.
func ReplicaState(r payments.ReplicaHealth) (string, string) {
	switch {
	case r.Silent:
		return "silent", healthSilent
	case r.BackingOff:
		return "backing off", healthBackoff
	case r.NotSweeping: // it beats, but its drives hang: PitlaneReplicaNotSweeping fires
		return "not sweeping", healthSilent
	case r.LastSweepAt == nil:
		return "starting", healthOK
	default:
		return "sweeping", healthOK
	}
}

func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// ago says how long ago t was ("3s ago"); a t not before now (a heartbeat of this very
// instant, or a replica's clock a little ahead) is "just now", never "in 0s".
func ago(now, t time.Time) string {
	if !t.Before(now.Add(-time.Second)) {
		return "just now"
	}
	return Relative(now, t)
}

// lastSweep says when the replica last looked for due work.
func lastSweep(now time.Time, r payments.ReplicaHealth) string {
	if r.LastSweepAt == nil {
		return "no sweep yet"
	}
	return "swept " + ago(now, *r.LastSweepAt)
}

// replicasChart lays out one row per replica: its name and state, and a gauge of the sessions
// leased to it against its width (SWEEP_CONCURRENCY).
func replicasChart(oc payments.OpsCharts) replicaChart {
	c := replicaChart{ID: "ops-replicas", Title: "Replicas: the patrol of each", Width: replicaChartWidth,
		Height: float64(max(len(oc.Replicas), 1)*replicaRowHeight + 4)}
	var words []string
	for i, r := range oc.Replicas {
		state, color := ReplicaState(r)
		y := float64(i*replicaRowHeight) + 12
		row := replicaRow{Y: y, Name: shorten(r.ReplicaID, replicaNameMax),
			Detail: fmt.Sprintf("%s · %s", shorten(r.Version, 24), lastSweep(oc.At, r)),
			State:  state, StateColor: color,
			Meter:     chart.NewMeter(float64(r.Leased), float64(r.Concurrency), 0, y+5, replicaChartWidth, 10),
			MeterText: fmt.Sprintf("%s of %s sessions leased", count(r.Leased), count(r.Concurrency)),
		}
		c.Rows = append(c.Rows, row)
		w := fmt.Sprintf("%s %s, %s of %s sessions leased, %s, version %s", r.ReplicaID, state, count(r.Leased), count(r.Concurrency),
			lastSweep(oc.At, r), r.Version)
		if r.BackingOff && r.BackoffUntil != nil {
			w += fmt.Sprintf(", backing off until %s (%s)", When(*r.BackoffUntil), r.Reason)
		}
		if r.Silent {
			w += ", last heartbeat " + ago(oc.At, r.BeatAt)
		}
		words = append(words, w)
	}
	c.Desc = "No replica has written a heartbeat yet: each replica's patrol writes one every round."
	if len(words) > 0 {
		c.Desc = fmt.Sprintf("%d replica(s), from the heartbeat each patrol writes every round: %s.", len(words), strings.Join(words, "; "))
	}
	return c
}

// webhookBehind: events waiting longer than this make the events webhook "behind".
const webhookBehind = time.Minute

// WebhookState is how the events webhook is doing, in a word, and its badge's class.
func WebhookState(w payments.EventsWebhookState, now time.Time) (string, string) {
	switch {
	case !w.Started && !w.On:
		return "off", "off"
	case !w.Started:
		return "starting", "ok"
	case w.Failures > 0:
		return "failing", "warn"
	case w.OldestWaiting != nil && w.OldestWaiting.Before(now.Add(-webhookBehind)):
		return "behind", "warn"
	default:
		return "delivering", "ok"
	}
}

// webhookWaiting says what waits for the shop ("none", "12 events, the oldest from 3s ago").
func webhookWaiting(w payments.EventsWebhookState, now time.Time) string {
	switch {
	case w.Waiting == 0:
		return "none"
	case w.Waiting > payments.EventsWebhookWaitingShown:
		return "over " + count(payments.EventsWebhookWaitingShown) + " events, the oldest from " + ago(now, *w.OldestWaiting)
	case w.Waiting == 1:
		return "1 event, from " + ago(now, *w.OldestWaiting)
	default:
		return count(w.Waiting) + " events, the oldest from " + ago(now, *w.OldestWaiting)
	}
}

// webhookRefused: the last failed POST was refused for what it carried (400, 409, 413, 415,
// 422), not left unanswered, put off (a timeout, a 5xx, 429) or refused whatever it carries (401
// and 403: a secret the shop does not know; 404, 405, 410: the URL): only then may the one event a
// POST of one carries be what the shop cannot take. During an outage, or with a wrong secret,
// the card told the operator to skip good events one after another (reviews of the page halving).
func webhookRefused(w payments.EventsWebhookState) bool {
	code, ok := strings.CutPrefix(w.LastError, "the shop's endpoint answered ")
	switch code {
	case "400", "409", "413", "415", "422":
		return ok
	}
	return false
}

// webhookFailing says how the events webhook fails ("3 failed POSTs in a row; the next at …: why").
func webhookFailing(w payments.EventsWebhookState) string {
	out := strconv.Itoa(w.Failures) + " failed POSTs in a row"
	if w.Failures == 1 {
		out = "1 failed POST"
	}
	if w.NextAttemptAt != nil {
		out += "; the next at " + When(*w.NextAttemptAt)
	}
	if w.LastError != "" {
		out += ": " + w.LastError
	}
	return out
}
