// Package gwmetrics counts and times the calls a payments.Gateway makes, for Prometheus. It is a
// decorator: the core and the adapters stay free of metrics, and every gateway (reference
// gateway, Stripe, the fake in tests) is measured the same way, by the FailureKind the core
// itself acts on.
package gwmetrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"pitlane/payments"
)

// Gateway wraps another Gateway and reports each call.
type Gateway struct {
	next     payments.Gateway
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

var _ payments.Gateway = (*Gateway)(nil)

// Wrap returns gw reporting to reg:
//
//	pitlane_gateway_calls_total{gateway,op,outcome}    outcome: ok | definitive | unknown | not_sent
//	pitlane_gateway_call_duration_seconds{gateway,op}
func Wrap(gw payments.Gateway, reg prometheus.Registerer) (*Gateway, error) {
	g := &Gateway{
		next: gw,
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pitlane_gateway_calls_total",
			Help: "Calls this process made to the payment gateway, by operation and outcome (ok, or the failure kind: definitive, unknown, not_sent).",
		}, []string{"gateway", "op", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pitlane_gateway_call_duration_seconds",
			Help:    "How long calls to the payment gateway took, by operation.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"gateway", "op"}),
	}
	for _, c := range []prometheus.Collector{g.calls, g.duration} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			// A second gateway in the same process (tests) shares the instruments.
			switch existing := are.ExistingCollector.(type) {
			case *prometheus.CounterVec:
				g.calls = existing
			case *prometheus.HistogramVec:
				g.duration = existing
			}
		}
	}
	return g, nil
}

// Unwrap returns the wrapped gateway.
func (g *Gateway) Unwrap() payments.Gateway { return g.next }

func (g *Gateway) observe(op string, started time.Time, err error) {
	outcome := "ok"
	if err != nil {
		outcome = string(payments.FailureOf(err))
	}
	name := g.next.Name()
	g.calls.WithLabelValues(name, op, outcome).Inc()
	g.duration.WithLabelValues(name, op).Observe(time.Since(started).Seconds())
}

// Name implements payments.Gateway: the wrapped gateway's name, which session rows record.
func (g *Gateway) Name() string { return g.next.Name() }

func (g *Gateway) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	started := time.Now()
	p, err := g.next.Register(ctx, req)
	g.observe("register", started, err)
	return p, err
}

func (g *Gateway) Status(ctx context.Context, id string) (payments.GatewayPayment, error) {
	started := time.Now()
	p, err := g.next.Status(ctx, id)
	g.observe("status", started, err)
	return p, err
}

func (g *Gateway) FindByReference(ctx context.Context, ref string) ([]payments.GatewayPayment, error) {
	started := time.Now()
	ps, err := g.next.FindByReference(ctx, ref)
	g.observe("find", started, err)
	return ps, err
}

func (g *Gateway) Reverse(ctx context.Context, id, key string) (payments.GatewayPayment, error) {
	started := time.Now()
	p, err := g.next.Reverse(ctx, id, key)
	g.observe("reverse", started, err)
	return p, err
}

func (g *Gateway) Refund(ctx context.Context, id, key string, amount int64, currency string) (payments.GatewayRefund, error) {
	started := time.Now()
	r, err := g.next.Refund(ctx, id, key, amount, currency)
	g.observe("refund", started, err)
	return r, err
}

func (g *Gateway) RefundStatus(ctx context.Context, id string) (payments.GatewayRefund, error) {
	started := time.Now()
	r, err := g.next.RefundStatus(ctx, id)
	g.observe("refund_status", started, err)
	return r, err
}

func (g *Gateway) FindRefund(ctx context.Context, paymentID, key string) (payments.GatewayRefund, bool, error) {
	started := time.Now()
	r, found, err := g.next.FindRefund(ctx, paymentID, key)
	g.observe("find_refund", started, err)
	return r, found, err
}

// KeyRetention implements payments.Gateway: the wrapped gateway's.
func (g *Gateway) KeyRetention() time.Duration { return g.next.KeyRetention() }
