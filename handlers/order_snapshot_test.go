package handlers_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/payments"
)

type orderReadMarker struct{}

// parkAfterOrderRow parks a marked request right after its read of the orders row returns.
type parkAfterOrderRow struct {
	parked, release chan struct{}
	once            atomic.Bool
}

func (p *parkAfterOrderRow) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if ctx.Value(orderReadMarker{}) != nil && strings.Contains(d.SQL, "FROM orders WHERE order_id") {
		return context.WithValue(ctx, p, true)
	}
	return ctx
}

func (p *parkAfterOrderRow) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(p) != nil && p.once.CompareAndSwap(false, true) {
		p.parked <- struct{}{}
		<-p.release
	}
}

// GET /api/v1/orders/{id} answered the order's status and its payments from two statements (two
// snapshots), so a Check completing the payment between them was answered as
// {"status":"AwaitingPayment","payments":[{"status":"Completed"}]} — a state pitlane never had
// (a Completed session and its order's Paid are one commit), and a shop reading the status to
// ship and the payments to start another got contradicting answers. A second replica's GET is
// parked right after its read of the order row (a query tracer) while a Check commits. Outside
// review (hostile API client); fails with the two reads outside one REPEATABLE READ transaction.
func TestOrderStatusAgreesWithItsPayments(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := wantPayment(t, b.do(post(createPath("o-skew"), `{"amount":700,"currency":"EUR"}`)), http.StatusCreated)
	b.gw.SetStatus(*p.GatewayPaymentID, payments.GatewaySucceeded)

	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	tr := &parkAfterOrderRow{parked: make(chan struct{}, 1), release: make(chan struct{})}
	parked, release := tr.parked, tr.release
	cfg.ConnConfig.Tracer = tr
	pool2, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool2.Close)
	_, e2 := b.server(t, pool2, "replica-b")

	done := make(chan *httptest.ResponseRecorder, 1)
	r := b.request(get("/api/v1/orders/o-skew"))
	r = r.WithContext(context.WithValue(r.Context(), orderReadMarker{}, true))
	go func() {
		rec := httptest.NewRecorder()
		e2.ServeHTTP(rec, r)
		done <- rec
	}()
	mustWait(t, parked, "the GET after its read of the order")
	if s := wantPayment(t, b.do(post("/api/v1/payments/"+p.ID+"/check", "")), http.StatusOK); s.Status != "Completed" {
		t.Fatalf("check: %+v", s)
	}
	close(release)
	rec := mustWait(t, done, "the GET")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET order: %d %s", rec.Code, rec.Body)
	}
	o := decode[struct {
		Status   string    `json:"status"`
		Payments []payment `json:"payments"`
	}](t, rec)
	if len(o.Payments) != 1 {
		t.Fatalf("order %s", rec.Body)
	}
	if paid, completed := o.Status == "Paid", o.Payments[0].Status == "Completed"; paid != completed {
		t.Fatalf("GET /api/v1/orders/o-skew answered order status %q with its only payment %q — never a state of the database: %s",
			o.Status, o.Payments[0].Status, rec.Body)
	}
}
