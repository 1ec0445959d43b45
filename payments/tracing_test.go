package payments_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"pitlane/internal/telemetry/telemetrytest"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/payments/gateway/gwtrace"
)

// tracedBench is a bench whose service and gateway make spans into an in-memory recorder.
func tracedBench(t *testing.T) (*bench, *telemetrytest.Recorder) {
	rec := telemetrytest.New(t)
	b := newBench(t, func(c *payments.Config) {
		c.TracerProvider = rec
		c.Gateway = gwtrace.Wrap(c.Gateway, rec)
	})
	return b, rec
}

// rootSpan starts the span a request would have, so that everything below shares one trace.
func rootSpan(rec *telemetrytest.Recorder) (context.Context, trace.Span) {
	return rec.Tracer("test").Start(context.Background(), "request")
}

// TestCoreOperationsAreSpans: Create is a span with claim and register below it, the gateway
// call below register and the apply of its answer beside it; Check, the cancel pair and the
// reverse likewise; each names the session and order, and no span carries the amount, the
// customer's contact or the one-time code.
func TestCoreOperationsAreSpans(t *testing.T) {
	t.Parallel()
	b, rec := tracedBench(t)
	const contact = "traced.customer@example.com"
	const amount = 123457

	ctx, root := rootSpan(rec)
	res, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "trace-1", Amount: amount, Currency: "EUR", CustomerContact: contact})
	root.End()
	if err != nil {
		t.Fatal(err)
	}
	sess := res.Session
	spans := rec.Trace(root.SpanContext().TraceID())
	create := telemetrytest.One(t, spans, "payments.create")
	claim := telemetrytest.One(t, spans, "payments.claim")
	register := telemetrytest.One(t, spans, "payments.register")
	gwRegister := telemetrytest.One(t, spans, "gateway.register")
	apply := telemetrytest.One(t, spans, "payments.apply")
	for _, c := range []struct {
		child, parent string
	}{{"payments.create", "request"}, {"payments.claim", "payments.create"}, {"payments.register", "payments.create"},
		{"gateway.register", "payments.register"}, {"payments.apply", "payments.register"}} {
		if !telemetrytest.ChildOf(telemetrytest.One(t, spans, c.child), telemetrytest.One(t, spans, c.parent)) {
			t.Errorf("%s is not a child of %s", c.child, c.parent)
		}
	}
	for name, s := range map[string]struct{ sess, order string }{
		"payments.create":   {telemetrytest.Attr(create, payments.AttrSessionID), telemetrytest.Attr(create, payments.AttrOrderID)},
		"payments.claim":    {telemetrytest.Attr(claim, payments.AttrSessionID), telemetrytest.Attr(claim, payments.AttrOrderID)},
		"payments.register": {telemetrytest.Attr(register, payments.AttrSessionID), telemetrytest.Attr(register, payments.AttrOrderID)},
		"gateway.register":  {telemetrytest.Attr(gwRegister, payments.AttrSessionID), telemetrytest.Attr(gwRegister, payments.AttrOrderID)},
		"payments.apply":    {telemetrytest.Attr(apply, payments.AttrSessionID), telemetrytest.Attr(apply, payments.AttrOrderID)},
	} {
		if s.sess != sess.ID || s.order != "trace-1" {
			t.Errorf("%s names session %q order %q, want %s trace-1", name, s.sess, s.order, sess.ID)
		}
	}
	if gwRegister.SpanKind != trace.SpanKindClient || telemetrytest.Attr(gwRegister, gwtrace.AttrOutcome) != "ok" ||
		telemetrytest.Attr(gwRegister, gwtrace.AttrGatewayPaymentID) != sess.GatewayPaymentID || telemetrytest.Attr(gwRegister, gwtrace.AttrGateway) != "fake" {
		t.Errorf("gateway.register: kind %v attributes %v", gwRegister.SpanKind, gwRegister.Attributes)
	}

	// Check: the gateway's status call below it names the gateway payment.
	ctx, root = rootSpan(rec)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewayAuthorized)
	if _, err := b.svc.Check(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	root.End()
	spans = rec.Trace(root.SpanContext().TraceID())
	check := telemetrytest.One(t, spans, "payments.check")
	status := telemetrytest.One(t, spans, "gateway.status")
	if !telemetrytest.ChildOf(status, check) || telemetrytest.Attr(status, payments.AttrOrderID) != "trace-1" ||
		telemetrytest.Attr(status, payments.AttrSessionID) != sess.ID || telemetrytest.Attr(status, gwtrace.AttrGatewayPaymentID) != sess.GatewayPaymentID {
		t.Errorf("gateway.status under payments.check: %v", status.Attributes)
	}

	// Cancel with a one-time code: request, confirm, and the reverse at the gateway.
	ctx, root = rootSpan(rec)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	var body string
	if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE payment_id = $1`, sess.ID).Scan(&body); err != nil {
		t.Fatal(err)
	}
	code := regexp.MustCompile(`\b\d{6}\b`).FindString(body)
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code); err != nil {
		t.Fatal(err)
	}
	root.End()
	spans = rec.Trace(root.SpanContext().TraceID())
	reverse := telemetrytest.One(t, spans, "payments.cancel.reverse")
	if !telemetrytest.ChildOf(reverse, telemetrytest.One(t, spans, "payments.cancel.confirm")) ||
		!telemetrytest.ChildOf(telemetrytest.One(t, spans, "gateway.reverse"), reverse) {
		t.Errorf("the reverse is not below the confirmation: %s", telemetrytest.Names(spans))
	}
	telemetrytest.One(t, spans, "payments.cancel.request")

	if leaks := telemetrytest.Mentions(rec.Spans(), contact, strconv.Itoa(amount), code, ch.ID); len(leaks) > 0 {
		t.Errorf("spans carry what they must not:\n%v", leaks)
	}
	// The negative control of that check: it does find what every span carries.
	if leaks := telemetrytest.Mentions(rec.Spans(), sess.ID); len(leaks) == 0 {
		t.Error("Mentions finds nothing even for the session id every span carries")
	}
}

// TestCoreSpansRecordFailures: a gateway call without a trustworthy answer is an error span with
// its failure kind; a refused input is the operation working, recorded by its code only.
func TestCoreSpansRecordFailures(t *testing.T) {
	t.Parallel()
	b, rec := tracedBench(t)
	b.gw.Fail(fakegw.OpRegister, fakegw.Transient, 1)
	ctx, root := rootSpan(rec)
	res, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "trace-2", Amount: 51234, Currency: "EUR"})
	if err != nil || res.Session.Status != payments.StatusUnknown {
		t.Fatalf("create with a 5xx: %v %v", res.Session.Status, err)
	}
	_, err = b.svc.Create(ctx, api, payments.CreateInput{OrderID: "trace-2", Amount: 61234, Currency: "EUR"})
	if payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("other amount while active: %v", err)
	}
	root.End()
	spans := rec.Trace(root.SpanContext().TraceID())
	gw := telemetrytest.One(t, spans, "gateway.register")
	if gw.Status.Code != codes.Error || telemetrytest.Attr(gw, gwtrace.AttrOutcome) != string(payments.FailureUnknown) {
		t.Errorf("gateway.register after a 5xx: status %v outcome %q", gw.Status, telemetrytest.Attr(gw, gwtrace.AttrOutcome))
	}
	claims := telemetrytest.Named(spans, "payments.claim")
	if len(claims) != 2 {
		t.Fatalf("%d claims", len(claims))
	}
	refused := claims[1]
	if telemetrytest.Attr(refused, payments.AttrErrorCode) != payments.ECONFLICT || refused.Status.Code == codes.Error {
		t.Errorf("refused claim: code %q status %v", telemetrytest.Attr(refused, payments.AttrErrorCode), refused.Status)
	}
	// Five digits: a three-digit amount is found in a random session id now and then.
	if leaks := telemetrytest.Mentions(spans, "61234", "51234"); len(leaks) > 0 {
		t.Errorf("spans carry the amounts (the conflict's message names them):\n%v", leaks)
	}
}

// TestSweepDriveIsASpan: the patrol's drive of one session is a span naming the session and its
// order, with the gateway's status call and the apply of its answer below it.
func TestSweepDriveIsASpan(t *testing.T) {
	t.Parallel()
	b, rec := tracedBench(t)
	res, err := b.svc.Create(context.Background(), api, payments.CreateInput{OrderID: "trace-sweep", Amount: 500, Currency: "EUR", CustomerContact: "c@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	sess := res.Session
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	b.clock.Advance(time.Minute)
	if n, err := b.svc.SweepOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("sweep = %d %v", n, err)
	}
	drive := telemetrytest.One(t, rec.Spans(), "sweep.drive")
	if telemetrytest.Attr(drive, payments.AttrSessionID) != sess.ID || telemetrytest.Attr(drive, payments.AttrOrderID) != "trace-sweep" {
		t.Errorf("sweep.drive names %v", drive.Attributes)
	}
	spans := rec.Trace(drive.SpanContext.TraceID())
	status := telemetrytest.One(t, spans, "gateway.status")
	if !telemetrytest.ChildOf(status, drive) || telemetrytest.Attr(status, payments.AttrSessionID) != sess.ID {
		t.Errorf("gateway.status is not the drive's: %s", telemetrytest.Names(spans))
	}
	if got, err := b.svc.Get(context.Background(), sess.ID); err != nil || got.Status != payments.StatusCompleted {
		t.Fatalf("after the drive: %v %v", got.Status, err)
	}
}
