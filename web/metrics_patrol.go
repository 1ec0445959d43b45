package web

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"pitlane/payments"
)

// patrolCollector exports the patrols' heartbeats (payments.Heartbeats, one row per replica,
// written by each replica's patrol every round) at scrape time, so per-replica health and the
// "replica not sweeping" alert can be drawn from any replica's /metrics:
//
//	time() - pitlane_patrol_last_sweep_timestamp_seconds > 10 * SWEEP_INTERVAL  and  pitlane_patrol_backing_off == 0
//
// The replica label comes from REPLICA_ID (operators' configuration, one value per replica;
// rows of replicas gone for a day are reaped), never from client input. This replica's own
// patrol state (back-off, drives in flight) is exported without a label, from memory, so it is
// there even when the database is not.
type patrolCollector struct {
	svc     *payments.Service
	timeout time.Duration
	log     *slog.Logger

	beat, sweep, inFlight, backingOff, backoffUntil, failed, calls, driven, info, offset *prometheus.Desc
	selfBackingOff, selfInFlight                                                         *prometheus.Desc
}

func newPatrolCollector(svc *payments.Service, log *slog.Logger) *patrolCollector {
	r := []string{"replica"}
	return &patrolCollector{
		svc:          svc,
		timeout:      2 * time.Second,
		log:          log,
		beat:         prometheus.NewDesc("pitlane_patrol_heartbeat_timestamp_seconds", "When the replica's patrol last wrote its heartbeat.", r, nil),
		sweep:        prometheus.NewDesc("pitlane_patrol_last_sweep_timestamp_seconds", "When the replica's patrol last looked for due work (it stops moving while the patrol backs off or is stuck).", r, nil),
		inFlight:     prometheus.NewDesc("pitlane_patrol_in_flight", "Leases the replica's patrol was driving at its last heartbeat.", r, nil),
		backingOff:   prometheus.NewDesc("pitlane_patrol_backing_off", "1 while the replica's patrol backs off because the gateway failed most of a round.", r, nil),
		backoffUntil: prometheus.NewDesc("pitlane_patrol_backoff_until_timestamp_seconds", "When the replica's current back-off ends (absent when none).", r, nil),
		calls:        prometheus.NewDesc("pitlane_patrol_last_round_gateway_calls", "Gateway calls the replica's last round made.", r, nil),
		failed:       prometheus.NewDesc("pitlane_patrol_last_round_gateway_failed", "Of those, calls without a trustworthy answer (5xx, timeouts, refused connections).", r, nil),
		driven:       prometheus.NewDesc("pitlane_patrol_driven_total", "Leases the replica's patrol drove since it started.", r, nil),
		info:         prometheus.NewDesc("pitlane_patrol_info", "The replica's patrol: its build and width (value 1).", []string{"replica", "version", "concurrency"}, nil),
		offset: prometheus.NewDesc("pitlane_patrol_clock_offset_seconds",
			"The replica's clock as pitlane reads it (the database's, read on its host) minus the database's at its last heartbeat: what the correction missed; leases and deadlines are compared across replicas.", r, nil),
		selfBackingOff: prometheus.NewDesc("pitlane_patrol_self_backing_off",
			"1 while THIS replica's patrol backs off (from memory).", nil, nil),
		selfInFlight: prometheus.NewDesc("pitlane_patrol_self_in_flight",
			"Leases THIS replica's patrol drives right now (from memory).", nil, nil),
	}
}

func (c *patrolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.beat, c.sweep, c.inFlight, c.backingOff, c.backoffUntil, c.calls, c.failed,
		c.driven, c.info, c.offset, c.selfBackingOff, c.selfInFlight} {
		ch <- d
	}
}

func (c *patrolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.svc.PatrolStatus()
	ch <- prometheus.MustNewConstMetric(c.selfBackingOff, prometheus.GaugeValue, b2f(st.BackingOff))
	ch <- prometheus.MustNewConstMetric(c.selfInFlight, prometheus.GaugeValue, float64(st.InFlight))

	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	hbs, err := c.svc.Heartbeats(ctx)
	if err != nil {
		c.log.Warn("metrics: patrol heartbeats unavailable", "err", err)
		return
	}
	now := c.svc.Now()
	for _, h := range hbs {
		r := h.ReplicaID
		ch <- prometheus.MustNewConstMetric(c.beat, prometheus.GaugeValue, unix(h.BeatAt), r)
		if h.LastSweepAt != nil {
			ch <- prometheus.MustNewConstMetric(c.sweep, prometheus.GaugeValue, unix(*h.LastSweepAt), r)
		}
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(h.InFlight), r)
		ch <- prometheus.MustNewConstMetric(c.backingOff, prometheus.GaugeValue, b2f(h.BackingOff(now)), r)
		if h.BackingOff(now) {
			ch <- prometheus.MustNewConstMetric(c.backoffUntil, prometheus.GaugeValue, unix(*h.BackoffUntil), r)
		}
		ch <- prometheus.MustNewConstMetric(c.calls, prometheus.GaugeValue, float64(h.LastCalls), r)
		ch <- prometheus.MustNewConstMetric(c.failed, prometheus.GaugeValue, float64(h.LastFailed), r)
		ch <- prometheus.MustNewConstMetric(c.driven, prometheus.CounterValue, float64(h.DrivenTotal), r)
		ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1, r, h.Version, strconv.Itoa(h.Concurrency))
		if h.ClockOffset != nil {
			ch <- prometheus.MustNewConstMetric(c.offset, prometheus.GaugeValue, h.ClockOffset.Seconds(), r)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
