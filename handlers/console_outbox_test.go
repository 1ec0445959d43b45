package handlers_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/web"
)

type okNotifier struct{ got chan payments.Message }

func (n okNotifier) Notify(_ context.Context, m payments.Message) error {
	n.got <- m
	return nil
}

// Once a code is delivered (NOTIFY_WEBHOOK_URL answered), the admin's outbox page shows its
// message with the code redacted: the customer has it, nobody else needs it. Fails on the main
// before this change, where the page kept showing the code.
func TestOutboxPageShowsDeliveredCodesRedacted(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	n := okNotifier{got: make(chan payments.Message, 1)}
	svc := payments.NewService(b.pool, payments.Config{Gateway: b.gw, Clock: b.clock, ReplicaID: "replica-n",
		CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second, Notifier: n})
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: b.pool, ReplicaID: "replica-n", Payments: svc, Access: b.access,
		SecretKey: []byte("console-test-secret-console-test-secret")})
	b.user(t, "adm@example.com", access.RoleAdmin)
	adm := newAgent(t, e)
	adm.login("adm@example.com")

	s := b.payment(t, "o-redact", 1999)
	if _, err := svc.RequestCancel(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s.ID); err != nil {
		t.Fatal(err)
	}
	sent := <-n.got
	code := outboxCodeRe.FindStringSubmatch(sent.Text)
	if code == nil {
		t.Fatalf("the customer's message %q has no code", sent.Text)
	}
	doc := page(t, adm.get("/outbox"), http.StatusOK)
	body := text(doc, "outbox-body")
	if strings.Contains(body, code[1]) || !strings.Contains(body, "••••••") {
		t.Fatalf("outbox body = %q, want the delivered code redacted", body)
	}
}
