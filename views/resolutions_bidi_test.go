package views

import (
	"bytes"
	"context"
	"html"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
)

// Staff-typed text inside our own sentence on the proposals page — the evidence after
// "Evidence:", the decision note after "by <who>, <when>:" — is isolated like the reason (a
// review of 6a909fd: "…12:00:00 UTC : رفض 200"). Negative control (run by hand): without the
// <bdi>, both fail.
func TestProposalTextIsIsolated(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	const evidence, note = "تذكرة 4471", "رفض 200"
	r := payments.Resolution{ID: 7, SessionID: "6be92723-81b5-422d-9941-3f6d8d84a636", OrderID: "o-1", Amount: 1000, Currency: "EUR",
		Reason: "x", Evidence: evidence, State: payments.ResolutionRejected, ProposedBy: "a@example.com", ProposedAt: now,
		DecidedBy: "b@example.com", DecidedAt: &now, DecisionNote: note}
	var buf bytes.Buffer
	if err := resolutionTable([]payments.Resolution{r}, "t", "l", nil).Render(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	body := buf.String()
	for _, s := range []string{evidence, note} {
		if !strings.Contains(body, "<bdi>"+html.EscapeString(s)+"</bdi>") {
			i := strings.Index(body, html.EscapeString(s))
			t.Errorf("%q not isolated: %q", s, body[max(i-120, 0):min(i+60, len(body))])
		}
	}
}

// A resolved finance case shows "resolved by <who>, <when>: <note>": the note, typed by staff,
// is isolated like a proposal's decision note (a review of 2c693e0). Negative control (run by
// hand): without the <bdi>, it fails.
func TestACaseResolutionIsIsolated(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	const note = "رفض 200"
	c := payments.FinanceCase{ID: 3, SessionID: "6be92723-81b5-422d-9941-3f6d8d84a636", OrderID: "o-1", Kind: payments.CaseGatewayMismatch,
		Detail: "x", CreatedAt: now, ResolvedAt: &now, ResolvedBy: "b@example.com", Resolution: note}
	var buf bytes.Buffer
	if err := caseTable([]payments.FinanceCase{c}, false, nil).Render(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	body := buf.String()
	if !strings.Contains(body, "<bdi>"+html.EscapeString(note)+"</bdi>") {
		i := strings.Index(body, html.EscapeString(note))
		t.Errorf("case resolution %q not isolated: %q", note, body[max(i-120, 0):min(i+60, len(body))])
	}
}
