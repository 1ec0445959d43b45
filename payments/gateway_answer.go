package payments

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// What a gateway's answer must satisfy before any of it is applied (design.md, "Idempotency":
// a gateway's answer is applied only when its amount and currency equal the session's).
//
// Every path that applies a gateway payment — Check, a register answer, the sweeper, a webhook
// hint, reconciliation, a cancel's reverse — ends in applyGatewayPayment, which calls
// answerMismatch under the order → session locks before decide. A mismatch is never applied:
// not as success, not as anything. The session stays in its state, is flagged (the sweeper stops
// driving it; the console lists it for finance) and one gateway_mismatch case opens. The gateway
// said "succeeded" for 1.00 on a 99.00 session: booking 99.00 would be wrong, booking 1.00 would
// make a 99.00 order Paid; only a person can tell which of us is mistaken.

// answerMismatch says why gp cannot be applied to the session cur ("" when it can): its amount or
// currency differs from the session's. Currencies compare as the contract writes them (three
// upper-case letters); adapters normalise (Stripe's are lower-case).
func answerMismatch(cur Session, gp GatewayPayment) string {
	if gp.Amount == cur.Amount && gp.Currency == cur.Currency {
		return ""
	}
	return fmt.Sprintf("the gateway's payment %s (%s) is for %d %s, the session is for %d %s; nothing applied",
		orNone(gp.ID), gp.Status, gp.Amount, orNone(gp.Currency), cur.Amount, cur.Currency)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// flagForFinance flags a session for finance and opens a case of kind, in the caller's
// transaction (which holds the order → session locks). A terminal session is not flagged (nothing
// drives it any more); the case is the finding. The flag keeps the first reason; the sweeper
// skips flagged sessions.
func flagForFinance(ctx context.Context, tx pgx.Tx, cur Session, kind, reason string, now time.Time, facts ...string) (Session, error) {
	reason = storable(reason) // shown on the payment's page (newsOf)
	out := cur
	if !cur.Status.Terminal() {
		var err error
		out, err = scanSession(tx.QueryRow(ctx, `UPDATE payment_sessions SET flagged_at = coalesce(flagged_at, $2),
			flag_reason = coalesce(flag_reason, $3), next_check_at = NULL WHERE id = $1 RETURNING `+sessionColumns, cur.ID, now, reason))
		if err != nil {
			return cur, dbError("flag for finance", err, "")
		}
	}
	return out, noteCase(ctx, tx, cur.ID, cur.OrderID, kind, reason, now, facts...) // a second contradiction is added (applyLocked)
}

// refundAnswerMismatch says why a gateway's refund answer cannot be applied to refund r of the
// session's payment ("" when it can): it names another gateway payment or none (the contract's
// refund object always names its payment), another refund than the one it was read by, another
// currency (when it names one), or another amount. A refund answer is the gateway's word about money leaving; like a payment
// answer it is applied only when it is about what we asked (an outside review: an answer naming
// no payment was booked as our refund while the gateway had made none).
func refundAnswerMismatch(sess Session, r Refund, gr GatewayRefund) string {
	switch {
	case gr.PaymentID != sess.GatewayPaymentID:
		return fmt.Sprintf("the gateway's refund %s is of payment %s, not the session's %s; nothing applied", orNone(gr.ID), orNone(gr.PaymentID), sess.GatewayPaymentID)
	case r.GatewayRefundID != "" && gr.ID != r.GatewayRefundID:
		return fmt.Sprintf("the gateway answered about refund %s when asked about %s (refund %s); nothing applied", orNone(gr.ID), r.GatewayRefundID, r.ID)
	case gr.Currency != "" && gr.Currency != r.Currency:
		return fmt.Sprintf("the gateway's refund %s is in %s, refund %s asked for %s; nothing applied", orNone(gr.ID), gr.Currency, r.ID, r.Currency)
	case gr.Amount != r.Amount:
		return fmt.Sprintf("the gateway's refund %s is for %d, refund %s asked for %d %s; nothing applied", orNone(gr.ID), gr.Amount, r.ID, r.Amount, r.Currency)
	}
	return ""
}

// refundAnswerAbout is refundAnswerMismatch, and then whether the answer names a gateway refund
// another of our refunds at the same gateway holds (this payment's or another's): such an answer
// is about that refund (a key store answering one key with another key's refund), not r —
// booked, one refund at the gateway was two RefundIssued entries; taken as a refund settled
// Failed by hand's word, it freed its amount or set finance to book it (reviews of gateway
// answers). q reads under the caller's locks when it is their transaction (refunds_gateway_refund,
// migration 01030).
func refundAnswerAbout(ctx context.Context, q querier, sess Session, r Refund, gr GatewayRefund) (string, error) {
	if m := refundAnswerMismatch(sess, r, gr); m != "" || gr.ID == "" {
		return m, nil
	}
	other, err := gatewayRefundHolder(ctx, q, sess, r.ID, gr.ID)
	if err != nil || other == "" {
		return "", err
	}
	return fmt.Sprintf("the gateway answered about refund %s with its refund %s, which is refund %s here; nothing applied", r.ID, gr.ID, other), nil
}

// gatewayRefundHolder names the refund other than refundID that holds gateway refund
// gatewayRefundID at sess's gateway ("" when none). A writer of the id takes lockGatewayRefund
// first, so two writers cannot both find none.
func gatewayRefundHolder(ctx context.Context, q querier, sess Session, refundID, gatewayRefundID string) (string, error) {
	var other string
	if err := q.QueryRow(ctx, `SELECT coalesce(min(o.id::text), '') FROM refunds o JOIN payment_sessions ps ON ps.id = o.session_id
		WHERE o.gateway_refund_id = $2 AND o.id <> $3 AND ps.gateway = (SELECT gateway FROM payment_sessions WHERE id = $1)`,
		sess.ID, gatewayRefundID, refundID).Scan(&other); err != nil {
		return "", dbError("refund: whose gateway refund", err, "")
	}
	return other, nil
}

// lockGatewayRefund serialises, across payments, the transactions that read whether a gateway
// refund is another refund's and then write it onto (or book) one (LockGatewayRefund): taken
// after the order → session locks.
func lockGatewayRefund(ctx context.Context, tx pgx.Tx, sess Session, gatewayRefundID string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(LockGatewayRefund), sess.Gateway+":"+gatewayRefundID); err != nil {
		return dbError("refund: the gateway refund's lock", err, "")
	}
	return nil
}

// The gateway's confirmation_url is where a customer is sent (a redirect, a link) to pay. It is
// the gateway's word, not ours: a compromised or broken gateway answer could name a
// javascript: URL (script on our page) or a look-alike site over plain http. So it is checked
// when the answer is applied, and a URL that fails is never stored (and so never rendered or
// redirected to); the session is flagged and an untrusted_confirmation_url case opens. Pages
// check again before using a stored one (TrustedConfirmationURL), for rows from before the rule.

// confirmationURLProblem says why raw may not be sent to customers ("" when it may): only an
// absolute https URL (on one of ConfirmationHosts when they are configured), or one on the
// configured gateway's own origin (GatewayURL: dev's simulator serves its payment pages over
// http), without user info.
func (s *Service) confirmationURLProblem(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil || u.Host == "" || u.User != nil:
	case s.onGatewayOrigin(u):
		return ""
	case u.Scheme == "https" && s.confirmationHostAllowed(u.Hostname()):
		return ""
	case u.Scheme == "https":
		return fmt.Sprintf("the gateway's confirmation_url %q is on %s, which is not one of GATEWAY_CONFIRMATION_HOSTS; not stored", truncate(raw, 200), u.Hostname())
	}
	return fmt.Sprintf("the gateway's confirmation_url %q is neither https nor on the configured gateway's origin; not stored", truncate(raw, 200))
}

// confirmationHostAllowed reports whether host may serve confirmation pages: any host when no
// ConfirmationHosts are configured; else one listed, or a subdomain of a "*." entry.
func (s *Service) confirmationHostAllowed(host string) bool {
	if len(s.cfg.ConfirmationHosts) == 0 {
		return true
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, h := range s.cfg.ConfirmationHosts {
		if parent, wild := strings.CutPrefix(h, "*."); wild {
			if strings.HasSuffix(host, "."+parent) {
				return true
			}
		} else if host == h {
			return true
		}
	}
	return false
}

// TrustedConfirmationURL reports whether raw may be shown to a customer or redirected to.
func (s *Service) TrustedConfirmationURL(raw string) bool {
	return raw != "" && s.confirmationURLProblem(raw) == ""
}

// PayableConfirmationURL is sess's stored payment page while a customer may still be sent to it,
// "" otherwise: only while the payment may still be paid — not Failed or Canceled, nor Canceling
// (the customer asked to cancel it and the reverse is on its way: a capture winning the race is
// a charge after consent to cancel) — while it is trusted now (the core checks it when it
// stores it; this catches a row stored before GATEWAY_CONFIRMATION_HOSTS was narrowed), and
// while no payment of its order is in review (PaymentInReview: the gateway may hold the
// customer's money for the order already; the checkout sends nobody to the bank then, and the
// API and the console handed out the page regardless, an outside review). The API's
// confirmation_url and the console's "Payment page" (the link support reads to a customer) both
// show this one.
func (s *Service) PayableConfirmationURL(ctx context.Context, sess Session) (string, error) {
	switch {
	case !s.TrustedConfirmationURL(sess.ConfirmationURL),
		sess.Status == StatusFailed, sess.Status == StatusCanceled, sess.Status == StatusCanceling:
		return "", nil
	}
	switch inReview, err := s.PaymentInReview(ctx, sess.OrderID); {
	case err != nil:
		return "", err
	case inReview:
		return "", nil
	}
	return sess.ConfirmationURL, nil
}

// onGatewayOrigin reports whether u has the scheme, host and port of Config.GatewayURL. Loopback
// names are one host (the simulator may be configured as 127.0.0.1 and answer as localhost).
func (s *Service) onGatewayOrigin(u *url.URL) bool {
	if s.cfg.GatewayURL == "" {
		return false
	}
	g, err := url.Parse(s.cfg.GatewayURL)
	if err != nil || g.Host == "" || !strings.EqualFold(g.Scheme, u.Scheme) || port(g) != port(u) {
		return false
	}
	return strings.EqualFold(g.Hostname(), u.Hostname()) || (loopback(g.Hostname()) && loopback(u.Hostname()))
}

func port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if strings.EqualFold(u.Scheme, "https") {
		return "443"
	}
	return "80"
}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// readableAnswers is the service's gateway with every answer read before the core does: ids no
// longer than MaxGatewayIDLen and text a column stores (no NUL, UTF-8), or the answer is
// unreadable — an unknown failure, asked again or looked up, as a garbled answer is. Such an
// answer was the core's to store and could not be: with Stripe (whose adapter, unlike refgw's,
// read no NUL), a registration answered with a NUL in its id made Create answer the shop 400
// "the request holds characters that cannot be stored" for a payment the gateway held; an id
// longer than a btree entry (about 2,700 bytes, any adapter) failed the attach with a 500, and
// every patrol look after it the same way (an outside review, hostile text). One check for
// every adapter, in the core.
type readableAnswers struct{ Gateway }

// Readable is gw checking its answers. NewService reads its gateway so; a caller that measures or
// traces the gateway wraps the adapter itself first, so an unreadable answer is counted as the
// unknown failure the core acts on (the service's own check then finds nothing, cheaply). Once:
// a service built on another's gateway keeps it.
func Readable(gw Gateway) Gateway {
	if _, ok := gw.(readableAnswers); ok || gw == nil {
		return gw
	}
	return readableAnswers{gw}
}

func (g readableAnswers) Register(ctx context.Context, req RegisterRequest) (GatewayPayment, error) {
	gp, err := g.Gateway.Register(ctx, req)
	return paymentAnswer("register", gp, err)
}

func (g readableAnswers) Status(ctx context.Context, id string) (GatewayPayment, error) {
	gp, err := g.Gateway.Status(ctx, id)
	return paymentAnswer("status", gp, err)
}

func (g readableAnswers) Reverse(ctx context.Context, id, key string) (GatewayPayment, error) {
	gp, err := g.Gateway.Reverse(ctx, id, key)
	return paymentAnswer("reverse", gp, err)
}

func (g readableAnswers) FindByReference(ctx context.Context, ref string) ([]GatewayPayment, error) {
	list, err := g.Gateway.FindByReference(ctx, ref)
	for _, gp := range list {
		if _, err := paymentAnswer("find", gp, err); err != nil {
			return nil, err
		}
	}
	return list, err
}

func (g readableAnswers) Refund(ctx context.Context, id, key string, amount int64, currency string) (GatewayRefund, error) {
	gr, err := g.Gateway.Refund(ctx, id, key, amount, currency)
	return refundAnswer("refund", gr, err)
}

func (g readableAnswers) RefundStatus(ctx context.Context, id string) (GatewayRefund, error) {
	gr, err := g.Gateway.RefundStatus(ctx, id)
	return refundAnswer("refund_status", gr, err)
}

func (g readableAnswers) FindRefund(ctx context.Context, id, key string) (GatewayRefund, bool, error) {
	gr, found, err := g.Gateway.FindRefund(ctx, id, key)
	if found {
		gr, err = refundAnswer("find_refund", gr, err)
	}
	return gr, found && err == nil, err
}

// paymentAnswer is an adapter's payment answer, or none and the error of an unreadable one (its
// values are not handed on: nothing may store or trace them).
func paymentAnswer(op string, gp GatewayPayment, err error) (GatewayPayment, error) {
	if err != nil {
		return gp, err
	}
	// Not the reference among the shown: ours are session ids, and another shop's on a shared
	// gateway account may hold an emoji's zero-width joiner; refused, its event asked the gateway
	// for ever (a review). It reaches a page only in a case's detail, which shows such characters
	// as their code points (newsOf).
	shown := []string{gp.ID, string(gp.Status), gp.Currency, gp.ConfirmationURL, gp.DeclineCode}
	if err := unreadable(op, []string{gp.ID, gp.Reference}, shown, gp.ID, string(gp.Status), gp.Currency, gp.Reference, gp.ConfirmationURL, gp.DeclineCode); err != nil {
		return GatewayPayment{}, err
	}
	return gp, nil
}

// refundAnswer is paymentAnswer for a refund answer.
func refundAnswer(op string, gr GatewayRefund, err error) (GatewayRefund, error) {
	if err != nil {
		return gr, err
	}
	if err := unreadable(op, []string{gr.ID, gr.PaymentID}, []string{gr.ID, gr.PaymentID, gr.Status}, gr.ID, gr.PaymentID, gr.Status); err != nil {
		return GatewayRefund{}, err
	}
	return gr, nil
}

// unreadable is the error of an answer whose ids are too long, whose texts a column cannot
// store, or whose shown text a page cannot show as it is (ShownAsIs), nil when there is none.
func unreadable(op string, ids, shown []string, texts ...string) error {
	why := ""
	for _, id := range ids {
		if len(id) > MaxGatewayIDLen {
			why = fmt.Sprintf("an id of %d bytes (at most %d)", len(id), MaxGatewayIDLen)
		}
	}
	for _, s := range texts {
		if why == "" && (strings.ContainsRune(s, 0) || !utf8.ValidString(s)) {
			why = fmt.Sprintf("text a column cannot store (%q)", truncate(s, 64))
		}
	}
	for _, s := range shown {
		if i := strings.IndexFunc(s, func(r rune) bool { return !ShownAsIs(r) }); why == "" && i >= 0 {
			// An id or status that shows as another (a right-to-left override turns the rest of
			// a case's line around on the page): no gateway's word is written so (an outside
			// review, console).
			why = fmt.Sprintf("a character that does not show as itself (%+q at byte %d)", []rune(s[i:])[0], i)
		}
	}
	if why == "" {
		return nil
	}
	return &GatewayError{Kind: FailureUnknown, Op: op, Code: "unreadable_answer", Err: errors.New("the answer carries " + why)}
}
