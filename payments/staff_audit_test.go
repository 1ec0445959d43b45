package payments_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// staffAudits counts the audit entries of action on target written by who, with their role.
func (b *bench) staffAudits(t *testing.T, action, target string, who payments.Staff) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = $2 AND actor = $3 AND role = $4`,
		action, target, who.Email, who.Role)
}

// A staff member's money-moving action — a cancel confirmed with the customer's code, a refund
// confirmed with one, a finance refund — is audited by the core in the transaction that does it,
// once; a replay of the same form or code writes nothing more here (the console records it), and
// an API client's action writes no staff entry. Before, the console wrote these entries after
// the core's commit: a crash in between left money moved by a person with no audit entry.
func TestStaffMoneyActionsAreAuditedInTheirTransaction(t *testing.T) {
	t.Parallel()
	b := newBench(t, eurLimit)
	ctx := context.Background()

	// A cancel confirmed by support, and the same code again.
	s := b.registered(t, "o-audit-cancel", 700)
	ch, err := b.svc.RequestCancel(ctx, supportStaff.Actor(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, s.ID)
	for range 2 {
		if _, err := b.svc.ConfirmCancel(ctx, supportStaff.Actor(), s.ID, ch.ID, code); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.staffAudits(t, payments.AuditCancelConfirm, s.ID, supportStaff); n != 1 {
		t.Fatalf("cancel confirmed by support: %d audit entries, want 1", n)
	}

	// A refund confirmed with the customer's code, and the code again.
	paid := b.completed(t, "o-audit-refund", 1000)
	rc, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(paid.ID, 300, uuid.NewString()))
	if err != nil {
		t.Fatal(err)
	}
	code = b.lastCode(t, paid.ID)
	for range 2 {
		if _, err := b.svc.ConfirmRefund(ctx, supportStaff, paid.ID, rc.ID, code); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.staffAudits(t, payments.AuditRefundConfirm, paid.ID, supportStaff); n != 1 {
		t.Fatalf("refund confirmed by support: %d audit entries, want 1", n)
	}

	// A finance refund within the limit, and the same form again.
	form := staffRefund(paid.ID, 200, uuid.NewString())
	for range 2 {
		if _, err := b.svc.RefundByFinance(ctx, finance1, form); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.staffAudits(t, payments.AuditRefund, paid.ID, finance1); n != 1 {
		t.Fatalf("finance refund: %d audit entries, want 1", n)
	}

	// An API client's cancel: the timeline records it; no staff audit entry.
	api2 := b.registered(t, "o-audit-api", 500)
	ch, err = b.svc.RequestCancel(ctx, api, api2.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ConfirmCancel(ctx, api, api2.ID, ch.ID, b.lastCode(t, api2.ID)); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE target = $1`, api2.ID); n != 0 {
		t.Fatalf("an API cancel wrote %d audit entries", n)
	}
}

// The entry and the action are one transaction: when the audit entry cannot be written, nothing
// is refunded — no refund row, no call to the gateway.
func TestStaffRefundWithoutItsAuditEntryDoesNotHappen(t *testing.T) {
	t.Parallel()
	b := newBench(t, eurLimit)
	ctx := context.Background()
	paid := b.completed(t, "o-audit-broken", 1000)
	if _, err := b.pool.Exec(ctx, `ALTER TABLE audit_log ADD CONSTRAINT audit_refused CHECK (action <> 'payment.refund') NOT VALID`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(paid.ID, 200, uuid.NewString())); err == nil {
		t.Fatal("the refund went through without its audit entry")
	}
	if n, calls := b.count(t, `SELECT count(*) FROM refunds WHERE session_id = $1`, paid.ID), b.gw.Calls(fakegw.OpRefund); n != 0 || calls != 0 {
		t.Fatalf("%d refunds, %d gateway refund calls without an audit entry; want none", n, calls)
	}
}

// An audit entry outlives its request — a client gone, a request cut at its bound: the action
// it records happened — but by payments.RecordGrace at most: written through a pool whose only
// connection is taken (a database that does not answer), it is given up within the grace and
// the request can answer. Before, under context.WithoutCancel alone, it waited for as long as
// the database did, and so did the request's answer: a console page cut at its bound by a
// silent database hung in the audit of its refusal.
func TestAuditOutlivesItsRequestByItsGraceAtMost(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	one := testdb.PoolOf(t, b.pool, 1)
	svc := b.service(one, "replica-one")
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	entry := payments.AuditEntry{Actor: supportStaff.Email, Role: string(supportStaff.Role), Action: payments.AuditPaymentCheck, Target: "s-grace"}
	if err := svc.RecordAudit(gone, entry); err != nil {
		t.Fatalf("the entry of a request gone: %v", err)
	}

	held, err := one.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	done := make(chan error, 1)
	go func() { done <- svc.RecordAudit(gone, entry) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("an entry written through a pool with no connection to give")
		}
	case <-time.After(time.Minute):
		held.Release()
		<-done
		t.Fatal("the entry waited a minute for the database, past its grace")
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE target = 's-grace'`); n != 1 {
		t.Fatalf("%d entries, want the first one", n)
	}
}
