package payments

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Four-eyes manual resolution: a session the gateway will not settle (flagged by the patrol,
// Unknown, or contradicted by the gateway) is settled by people. One finance user proposes an
// outcome with a reason and evidence; a second finance or admin user approves it. The approved
// outcome goes through applyTransition and the ledger rules like every other path, in the
// approval's transaction.
//
// Which outcomes, from where (the transitions table decides; no edge was added for people):
//   - Completed from any active state: the money arrived (evidence: the gateway's dashboard, a
//     bank statement). completeOrder writes the one PaymentReceived entry; the order's
//     AwaitingPayment guard and the unique index keep it at one.
//   - Failed from any active state: no money was taken and none will be.
//   - Canceled only from Canceling: Canceled means "reversed at the gateway", which needs the
//     reverse operation a consumed cancel code created. A session without one that took no money
//     is Failed; one that took money is Completed and then refunded. Letting people skip the
//     reverse would make "Canceled" mean two things.
//
// After approval the gateway may still speak (a webhook, reconciliation, a Check from the
// payment page); decide() turns any contradiction into a finance case and never changes the
// settled status, so nothing changes silently. The session's open cases are resolved by the
// approval, so such a later contradiction opens a fresh case instead of being swallowed by the
// one-open-case-per-kind index.

// The same machinery decides finance refunds above REFUND_DIRECT_LIMIT (staff_refund.go): a
// proposal of kind ProposalRefund carries the amount and the refund form's intent key, and its
// approval claims the refund through the refund core in the approval's transaction.

// Proposal kinds.
const (
	ProposalSettle       = "settle"        // an outcome for a stuck session
	ProposalRefund       = "refund"        // a refund of a Completed payment above the direct limit
	ProposalRefundSettle = "refund_settle" // an outcome for a refund stuck Pending (refund_settle.go)
)

// Resolution proposal states: proposed → approved | rejected, by guarded UPDATEs only.
const (
	ResolutionProposed = "proposed"
	ResolutionApproved = "approved"
	ResolutionRejected = "rejected"
)

// Audit actions of finance's own work (beside those in staff_audit.go).
const (
	AuditResolutionPropose = "resolution.propose"
	AuditResolutionApprove = "resolution.approve"
	AuditResolutionReject  = "resolution.reject"
	AuditLedgerExport      = "ledger.export"
)

// ResolutionOutcomes are the outcomes finance may propose.
var ResolutionOutcomes = []Status{StatusCompleted, StatusFailed, StatusCanceled}

// Bounds of a proposal's texts.
const (
	MaxReasonLength   = 2000
	MaxEvidenceLength = 4000
)

// errProposerDisabled refuses the approval of a proposal whose proposer's account was disabled
// since: the second pair of eyes approves what an active colleague vouches for, and an account
// is disabled when its owner left or is no longer trusted (their proposals were approvable, and
// a refund one of them proposed went out after their account was closed).
func errProposerDisabled(r Resolution) error {
	return Errorf(ECONFLICT, "proposal #%d was made by %s, whose account was disabled on %s: reject it, and propose again yourself if its evidence stands",
		r.ID, r.ProposedBy, r.ProposerDisabledAt.UTC().Format("2006-01-02 15:04 UTC"))
}

// errSelfApproval is the refusal of approving one's own proposal.
var errSelfApproval = &Error{Code: EFORBIDDEN, Message: "you proposed this outcome: a second finance or admin user must approve it"}

// passwordLinked reports whether one of two staff accounts set the other's password, directly or
// through accounts whose passwords they set (the SQL function password_linked, migration 00490):
// whoever set a password knows it and could be acting as that account, so the two are one person
// to the second-person rules.
func passwordLinked(ctx context.Context, q querier, a, b string) (bool, error) {
	var linked bool
	if err := q.QueryRow(ctx, `SELECT password_linked($1, $2)`, a, b).Scan(&linked); err != nil {
		return false, fmt.Errorf("password link: %w", err)
	}
	return linked, nil
}

// errLinkedApproval refuses an approval by an account that the proposer's could be acting as.
func errLinkedApproval(proposer, approver string) error {
	return Errorf(EFORBIDDEN, "one of %s and %s set the other's password (or a password of someone who did), so one person could be acting as both: "+
		"another finance or admin user must approve it (or the account's owner gets a password set from the command line, for proposals made after it)", proposer, approver)
}

// Resolution is one proposal with its session's money and current status.
type Resolution struct {
	ID        int64
	Kind      string // ProposalSettle or ProposalRefund
	SessionID string
	OrderID   string
	Outcome   Status // settle: the proposed outcome
	// RefundAmount (refund): what the approval refunds; RefundID: the refund it made (refund)
	// or the refund it settles (refund_settle), RefundOutcome: how (Succeeded or Failed), and
	// RefundFrom: the refund's status it was made on (Pending, or Failed by hand: a correction).
	RefundAmount  int64
	RefundID      string
	RefundOutcome string
	RefundFrom    string
	// GatewayWordCases counts a waiting proposal's payment's open cases that carry the gateway's
	// word about it (gatewayWordCaseKinds): what the approver reads on the payment's page first.
	GatewayWordCases int
	requestKey       string
	StatusAtProposal Status
	Reason           string
	Evidence         string
	State            string
	ProposedBy       string
	ProposedAt       time.Time
	DecidedBy        string
	DecidedAt        *time.Time
	DecisionNote     string
	Amount           int64
	Currency         string
	SessionStatus    Status
	// ProposerDisabledAt is when the proposer's account was disabled (nil: it is not): such a
	// proposal can only be rejected.
	ProposerDisabledAt *time.Time
}

// Pending reports whether the proposal waits for a decision.
func (r Resolution) Pending() bool { return r.State == ResolutionProposed }

// IsRefund reports whether the proposal is a refund's.
func (r Resolution) IsRefund() bool { return r.Kind == ProposalRefund }

// What says what the proposal does, for the audit log and messages.
func (r Resolution) What() string {
	if r.Kind == ProposalRefundSettle {
		return "refund " + Short(r.RefundID) + " " + r.RefundFrom + " → " + r.RefundOutcome
	}
	if r.IsRefund() {
		return "refund " + FormatMinor(r.RefundAmount, r.Currency) + " " + r.Currency
	}
	return string(r.StatusAtProposal) + " → " + string(r.Outcome)
}

// Target is how the proposal is named in messages.
func (r Resolution) Target() string { return "#" + strconv.FormatInt(r.ID, 10) }

// ProposalInput is what finance proposes.
type ProposalInput struct {
	SessionID string
	Outcome   Status
	Reason    string
	Evidence  string
	// Seen is the payment's status the form showed, that its reason and evidence were written
	// for. A payment that moved since (a Check applied Authorized to a flagged Registered payment,
	// which stays flagged) is refused: the proposal would be filed as "Authorized → Failed" under
	// evidence written for Registered, and approved as such. "": a form rendered before forms
	// carried it (a rolling deploy), not compared.
	Seen Status
	// CasesSeen is what the form showed of the payment's cases that carry the gateway's word
	// (SettleCandidate.CasesSeen): news since (a Check found a capture of 1.00 of the 99.00 while
	// the proposer typed) is refused, as the approval refuses news since the proposal; a case
	// resolved meanwhile is no news. "": the caller read no form (a tool, a test), not
	// compared. The console sends a form without the field (one of the previous release, or one
	// whose field was removed) as one that showed none (casesSeenPrefix alone): an open case
	// refuses it and the form comes back current — taken as "not compared", the proposal
	// recorded the unshown news as seen and its approval passed (a review).
	CasesSeen string
}

// settledCaseKinds are the finance cases a settlement by four eyes answers: they ask what state
// the payment is in (the schedule ran out, the gateway contradicts it or lost it, its payment
// page could not be trusted). Cases about other money stay open.
var settledCaseKinds = []string{CaseSweepExhausted, CaseGatewayMismatch, CaseUntrustedURL}

// gatewayWordCaseKinds are those of settledCaseKinds that carry the gateway's word about the
// payment: news in one since a proposal was read or made refuses it (newsSinceProposal). The
// patrol's schedule running out (sweep_exhausted) says nothing new of the payment.
var gatewayWordCaseKinds = []string{CaseGatewayMismatch, CaseUntrustedURL}

// Settleable says why a session may be settled by hand ("" when it may not): it is active, and
// the patrol gave up on it (flagged), or we do not know whether the gateway has it (Unknown),
// or the gateway contradicted it (an open gateway_mismatch case).
func Settleable(s Session, mismatch bool) string {
	if !s.Status.Active() {
		return ""
	}
	switch {
	case s.FlaggedAt != nil:
		return "flagged: " + s.FlagReason
	case s.Status == StatusUnknown:
		return "Unknown: the gateway never confirmed the registration"
	case mismatch:
		return "the gateway's answer does not match (open gateway_mismatch case)"
	}
	return ""
}

// OutcomeRefusal says why outcome cannot be proposed for a session in cur ("" when it can).
func OutcomeRefusal(cur, outcome Status) string {
	switch {
	case outcome != StatusCompleted && outcome != StatusFailed && outcome != StatusCanceled:
		return "the outcome must be Completed, Failed or Canceled"
	case outcome == StatusCanceled && cur != StatusCanceling:
		return "only a Canceling payment (its reverse requested with the customer's code) can be marked Canceled; " +
			"mark it Failed if no money was taken, or Completed and refund it if money was taken"
	case !CanTransition(cur, outcome):
		return fmt.Sprintf("a %s payment cannot become %s", cur, outcome)
	}
	return ""
}

// pastedBreaks are the breaks word processors put in copied text, as line breaks.
var pastedBreaks = strings.NewReplacer("\v", "\n", "\f", "\n")

// requiredText trims a text people must write (a note, a reason) and refuses it empty, with
// missing as the message, or longer than max.
//
// The text must be storable as it is: UTF-8 without NUL or other control characters but line
// breaks and tabs. These reasons and notes are what the audit log keeps of a person's action,
// and the audit row is written where the action is; text PostgreSQL would refuse must be
// refused before the action, not found unstorable after it.
func requiredText(field, s, missing string, max int) (string, error) {
	// A manual line break or a page break pasted from a word processor (U+000B, U+000C) is a line
	// break here: refused as a control character, the note's author was asked to remove one
	// they could not see (an outside review, a11y).
	s = strings.TrimSpace(pastedBreaks.Replace(s))
	if s == "" {
		return "", Invalid(field, "%s", missing)
	}
	if !plainText(s) {
		return "", Invalid(field, "the %s must be plain text (no NUL or other control characters)", field)
	}
	if utf8.RuneCountInString(s) > max { // characters, as the message says: not bytes
		return "", Invalid(field, "the %s must be at most %d characters", field, max)
	}
	return s, nil
}

func (in ProposalInput) validate() (ProposalInput, error) {
	if in.Outcome != StatusCompleted && in.Outcome != StatusFailed && in.Outcome != StatusCanceled {
		return in, Invalid("outcome", "choose Completed, Failed or Canceled")
	}
	var err error
	if in.Reason, err = requiredText("reason", in.Reason, "say why this outcome is right", MaxReasonLength); err != nil {
		return in, err
	}
	in.Evidence, err = requiredText("evidence", in.Evidence, "give the evidence (gateway dashboard, bank statement, ticket)", MaxEvidenceLength)
	return in, err
}

const resolutionColumns = `rp.id, rp.kind, rp.session_id::text, rp.order_id, coalesce(rp.outcome, ''), rp.status_at_proposal,
	coalesce(rp.refund_amount, 0), coalesce(rp.refund_id::text, ''), coalesce(rp.request_key, ''), rp.reason, rp.evidence,
	rp.state, rp.proposed_by, rp.proposed_at, coalesce(rp.decided_by, ''), rp.decided_at, rp.decision_note,
	ps.amount, ps.currency, ps.status, coalesce(rp.refund_outcome, ''),
	(SELECT u.disabled_at FROM staff_users u WHERE u.email = rp.proposed_by),
	CASE WHEN rp.kind = 'refund_settle' THEN coalesce(rp.refund_from, 'Pending') ELSE '' END,
	CASE WHEN rp.state = 'proposed' THEN (SELECT count(*) FROM finance_cases fc WHERE fc.session_id = rp.session_id
		AND fc.resolved_at IS NULL AND fc.kind IN ('` + CaseGatewayMismatch + `', '` + CaseUntrustedURL + `')) ELSE 0 END`

func scanResolution(row pgx.Row) (Resolution, error) {
	var r Resolution
	var outcome, at, cur string
	err := row.Scan(&r.ID, &r.Kind, &r.SessionID, &r.OrderID, &outcome, &at, &r.RefundAmount, &r.RefundID, &r.requestKey,
		&r.Reason, &r.Evidence, &r.State, &r.ProposedBy,
		&r.ProposedAt, &r.DecidedBy, &r.DecidedAt, &r.DecisionNote, &r.Amount, &r.Currency, &cur, &r.RefundOutcome, &r.ProposerDisabledAt, &r.RefundFrom, &r.GatewayWordCases)
	r.Outcome, r.StatusAtProposal, r.SessionStatus = Status(outcome), Status(at), Status(cur)
	return r, err
}

func getResolution(ctx context.Context, q querier, id int64) (Resolution, error) {
	r, err := scanResolution(q.QueryRow(ctx, `SELECT `+resolutionColumns+`
		FROM resolution_proposals rp JOIN payment_sessions ps ON ps.id = rp.session_id WHERE rp.id = $1`, id))
	if err != nil {
		return Resolution{}, dbError("get proposal", err, "proposal %d not found", id)
	}
	return r, nil
}

// hasOpenMismatch reports whether a gateway_mismatch case is open for the session.
func hasOpenMismatch(ctx context.Context, q querier, sessionID string) (bool, error) {
	var open bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM finance_cases WHERE session_id = $1 AND kind = $2 AND resolved_at IS NULL)`,
		sessionID, CaseGatewayMismatch).Scan(&open)
	if err != nil {
		return false, fmt.Errorf("open mismatch: %w", err)
	}
	return open, nil
}

// SettleCandidate is a session as the proposal form shows it: why it may be settled by hand
// ("" when it may not) and the proposal already waiting for it.
type SettleCandidate struct {
	Session  Session
	Why      string
	Pending  *Resolution
	Outcomes []Status // the outcomes its state allows
	// Word are the payment's open cases that carry the gateway's word about it
	// (gatewayWordCaseKinds), which the form shows; CasesSeen names those very rows as read
	// (casesSeen; the form sends it back: ProposalInput.CasesSeen).
	Word      []FinanceCase
	CasesSeen string
}

// SettleCandidate reads what the proposal form needs about a session.
func (s *Service) SettleCandidate(ctx context.Context, sessionID string) (SettleCandidate, error) {
	sess, err := s.Get(ctx, sessionID)
	if err != nil {
		return SettleCandidate{}, err
	}
	mismatch, err := hasOpenMismatch(ctx, s.db, sess.ID)
	if err != nil {
		return SettleCandidate{}, err
	}
	c := SettleCandidate{Session: sess, Why: Settleable(sess, mismatch)}
	if c.Word, err = s.listCases(ctx, s.db, `fc.session_id = $1 AND fc.resolved_at IS NULL AND fc.kind = ANY($2)`, `fc.id`, 50,
		sess.ID, gatewayWordCaseKinds); err != nil {
		return SettleCandidate{}, err
	}
	c.CasesSeen = casesSeen(c.Word)
	for _, o := range ResolutionOutcomes {
		if OutcomeRefusal(sess.Status, o) == "" {
			c.Outcomes = append(c.Outcomes, o)
		}
	}
	pending, err := s.ListResolutions(ctx, ResolutionFilter{SessionID: sess.ID, State: ResolutionProposed})
	if err != nil {
		return SettleCandidate{}, err
	}
	if len(pending) > 0 {
		c.Pending = &pending[0]
	}
	return c, nil
}

// ProposeResolution records finance's proposed outcome for a flagged, Unknown or mismatched
// session, audited in the same transaction. It changes no session: the order and session locks
// only make the eligibility it checks the one a concurrent Check or approval leaves behind. A
// form that showed another status than the session's now (in.Seen) is refused: the approval
// refuses a proposal the payment moved away from, and the proposal must not be filed for a state
// its evidence was not written for either.
func (s *Service) ProposeResolution(ctx context.Context, by Staff, in ProposalInput) (Resolution, error) {
	ctx, span := s.startSpan(ctx, "payments.resolution.propose", in.SessionID, "")
	defer span.End()
	in, err := in.validate()
	if err != nil {
		return Resolution{}, err
	}
	sess, err := s.Get(ctx, in.SessionID)
	if err != nil {
		return Resolution{}, err
	}
	now := s.cfg.Clock.Now()
	var id int64
	err = s.inTx(ctx, "propose resolution", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sess.ID)
		if err != nil {
			return err
		}
		mismatch, err := hasOpenMismatch(ctx, tx, cur.ID)
		if err != nil {
			return err
		}
		if !cur.Status.Active() {
			return Errorf(ECONFLICT, "payment %s is %s already: there is nothing to settle", Short(cur.ID), cur.Status)
		}
		if in.Seen != "" && in.Seen != cur.Status {
			return &Error{Code: ECONFLICT, Field: "seen", Message: fmt.Sprintf(
				"the payment moved from %s to %s since you read it; nothing was proposed: check the evidence and propose again", in.Seen, cur.Status)}
		}
		if in.CasesSeen != "" {
			if err := newsSinceForm(ctx, tx, cur.ID, in.CasesSeen); err != nil {
				return err
			}
		}
		if Settleable(cur, mismatch) == "" {
			return Errorf(ECONFLICT, "only flagged, Unknown or mismatched payments are settled by hand; %s is %s and the patrol still looks at it",
				Short(cur.ID), cur.Status)
		}
		if why := OutcomeRefusal(cur.Status, in.Outcome); why != "" {
			return &Error{Code: ECONFLICT, Field: "outcome", Message: why}
		}
		if err := noProposalWaiting(ctx, tx, cur, by, now); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `INSERT INTO resolution_proposals (session_id, order_id, outcome, status_at_proposal, reason, evidence, proposed_by, proposed_at, cases_seen)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, `+casesSeenSQL+`) RETURNING id`,
			cur.ID, cur.OrderID, string(in.Outcome), string(cur.Status), in.Reason, in.Evidence, by.Email, now).Scan(&id); err != nil {
			return dbError("propose resolution", err, "")
		}
		return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: string(by.Role), Action: AuditResolutionPropose, Target: cur.ID,
			Detail: fmt.Sprintf("#%d %s → %s: %s", id, cur.Status, in.Outcome, in.Reason)}, now)
	})
	if err != nil {
		return Resolution{}, err
	}
	return getResolution(ctx, s.db, id)
}

// noProposalWaiting refuses a second proposal for a session while one waits (of either kind: two
// waiting proposals would race each other to approval). The caller holds the session's lock;
// the unique index resolution_proposals_one_open is the last line behind this read.
//
// A waiting proposal the payment outran — its status is no longer the one the proposal was
// made on, so no approval can pass ("moved since the proposal") — is withdrawn instead: rejected
// by by, who proposes now, saying why, audited. It blocked every later proposal of the payment
// (a refund above the direct limit once the gateway's capture completed a payment proposed
// Failed) until someone rejected it by hand. So is a refund_settle proposal whose refund the
// gateway has since answered (no longer Pending) or that went back to the patrol (no longer
// flagged): approveRefundOutcome refuses both. The refund is read, not locked: neither state
// goes back to flagged and Pending (settling a refund takes the session's lock first, and a
// waiting proposal keeps a refund from being sent back to the patrol).
func noProposalWaiting(ctx context.Context, tx pgx.Tx, cur Session, by Staff, now time.Time) error {
	var waiting int64
	var waitingBy string
	var at Status
	var refundID, refundStatus, refundFrom string
	var refundFlagged bool
	err := tx.QueryRow(ctx, `SELECT rp.id, rp.proposed_by, rp.status_at_proposal, coalesce(rp.refund_id::text, ''), coalesce(r.status, ''), r.flagged_at IS NOT NULL,
			coalesce(rp.refund_from, 'Pending')
		FROM resolution_proposals rp LEFT JOIN refunds r ON rp.kind = 'refund_settle' AND r.id = rp.refund_id
		WHERE rp.session_id = $1 AND rp.state = 'proposed'`,
		cur.ID).Scan(&waiting, &waitingBy, &at, &refundID, &refundStatus, &refundFlagged, &refundFrom)
	var note string
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("proposal: read pending: %w", err)
	case at != cur.Status:
		note = fmt.Sprintf("withdrawn: the payment moved from %s to %s since it was proposed; a new proposal replaces it", at, cur.Status)
	case refundStatus != "" && refundStatus != refundFrom:
		// A refund_settle proposal the gateway's answer outran: approveRefundOutcome refuses it
		// as surely as a settle proposal the payment's status outran.
		note = fmt.Sprintf("withdrawn: refund %s is %s since it was proposed (the gateway answered); a new proposal replaces it", Short(refundID), refundStatus)
	case refundStatus == RefundPending && !refundFlagged:
		note = fmt.Sprintf("withdrawn: refund %s went back to the patrol since it was proposed; a new proposal replaces it", Short(refundID))
	default:
		return Errorf(ECONFLICT, "proposal #%d by %s already waits for approval: approve or reject it first", waiting, waitingBy)
	}
	tag, err := tx.Exec(ctx, `UPDATE resolution_proposals SET state = 'rejected', decided_by = $2, decided_at = $3, decision_note = $4
		WHERE id = $1 AND state = 'proposed'`, waiting, by.Email, now, note)
	if err != nil {
		return dbError("proposal: withdraw outrun", err, "")
	}
	if tag.RowsAffected() == 0 {
		return nil // rejected meanwhile
	}
	return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: string(by.Role), Action: AuditResolutionReject, Target: cur.ID,
		Detail: fmt.Sprintf("#%d (proposed by %s): %s", waiting, waitingBy, note)}, now)
}

// WithdrawProposalsOfDisabled rejects every proposal still waiting whose proposer's account is
// disabled, each audited, waiting for a decision that holds one (unlike WithdrawProposalsOf, it
// holds no user row, so it cannot deadlock with the decision). The housekeeping calls it: the
// disable's own withdrawal skips a proposal a decision holds at that moment, and when that
// decision then failed (a tab closed, the payment moved) and the user stayed disabled, the
// proposal waited for good — nobody may approve it, and it held its payment: a retry refused
// ("approve or reject it first"), its refund room kept, every new proposal refused (an outside
// review, SKIP LOCKED leftovers). Returns how many it withdrew.
func (s *Service) WithdrawProposalsOfDisabled(ctx context.Context) (int, error) {
	by := Staff{Email: "system:housekeeping"}
	now := s.cfg.Clock.Now()
	n := 0
	err := s.inTx(ctx, "withdraw proposals of disabled users", func(tx pgx.Tx) error {
		var err error
		n, err = withdrawProposals(ctx, tx, by, now, `FROM staff_users u WHERE u.email = p.proposed_by AND u.disabled_at IS NOT NULL AND p.state = 'proposed'`)
		return err
	})
	return n, err
}

// WithdrawProposalsOf rejects, in tx, the proposals email made that still wait for a second
// person, as their account is disabled by by: each rejected with why and audited. A disabled
// proposer's proposal can only be rejected (errProposerDisabled), and a waiting refund proposal
// holds the payment's refund room (refund codes are refused, or skipped as 'no_room', until
// someone rejects it by hand: a review of that rule). The proposals' rows only, and those a
// decision holds right now are skipped: a rejection locks its proposal and then its user's row,
// which the disable (the caller) holds already — waiting would deadlock; that decision settles
// the proposal, and were it to fail, the approval guard still refuses it and the housekeeping
// withdraws it (WithdrawProposalsOfDisabled).
func WithdrawProposalsOf(ctx context.Context, tx pgx.Tx, by Staff, email string, now time.Time) error {
	_, err := withdrawProposals(ctx, tx, by, now,
		`WHERE p.id IN (SELECT id FROM resolution_proposals WHERE proposed_by = $4 AND state = 'proposed' FOR UPDATE SKIP LOCKED)`, email)
	return err
}

// withdrawProposals rejects the waiting proposals which (a FROM … WHERE or WHERE over
// resolution_proposals p, its own arguments from $4) picks, their proposers' accounts disabled
// by by, each audited; it returns how many.
func withdrawProposals(ctx context.Context, tx pgx.Tx, by Staff, now time.Time, which string, args ...any) (int, error) {
	const note = "withdrawn: the proposer's account was disabled; a new proposal replaces it"
	rows, err := tx.Query(ctx, `UPDATE resolution_proposals p SET state = 'rejected', decided_by = $1, decided_at = $2, decision_note = $3
		`+which+` RETURNING p.id, p.session_id::text, p.proposed_by`, append([]any{by.Email, now, note}, args...)...)
	if err != nil {
		return 0, dbError("withdraw proposals", err, "")
	}
	type withdrawn struct {
		id             int64
		session, email string
	}
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (withdrawn, error) {
		var w withdrawn
		return w, r.Scan(&w.id, &w.session, &w.email)
	})
	if err != nil {
		return 0, dbError("withdraw proposals", err, "")
	}
	for _, w := range ws {
		if err := recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: by.Role, Action: AuditResolutionReject, Target: w.session,
			Detail: fmt.Sprintf("#%d (proposed by %s): %s", w.id, w.email, note)}, now); err != nil {
			return 0, err
		}
	}
	return len(ws), nil
}

// explainDecided turns a guarded UPDATE that found no proposal in state proposed into the
// reason: unknown, decided already, or (approval) one's own.
func explainDecided(ctx context.Context, q querier, id int64, by Staff, approving bool) error {
	r, err := getResolution(ctx, q, id)
	if err != nil {
		return err
	}
	if r.State != ResolutionProposed {
		return Errorf(ECONFLICT, "proposal #%d was already %s by %s", id, r.State, r.DecidedBy)
	}
	if approving && r.ProposedBy == by.Email {
		return errSelfApproval
	}
	if approving && r.ProposerDisabledAt != nil {
		return errProposerDisabled(r)
	}
	if approving {
		if linked, err := passwordLinked(ctx, q, r.ProposedBy, by.Email); err != nil || linked {
			return cmp.Or(err, errLinkedApproval(r.ProposedBy, by.Email))
		}
		var setter bool
		if err := q.QueryRow(ctx, `SELECT $2 = ANY(proposer_setters) FROM resolution_proposals WHERE id = $1`, id, by.Email).Scan(&setter); err != nil || setter {
			return cmp.Or[error](err, Errorf(EFORBIDDEN, "when %s made this proposal, %s had set its account's password (or the password of someone who did), "+
				"so one person could have made it and be approving it: another finance or admin user must approve it", r.ProposedBy, by.Email))
		}
	}
	return fmt.Errorf("decide proposal %d: guard refused a pending proposal", id)
}

// casesSeen names the cases a form showed, from those very rows (read apart, a case opened
// between the list and its name was named and never shown: a review): "seen:" and each one's
// id and version (caseSeenSQL), comma-separated — the same "id:version" items as
// resolution_proposals.cases_seen. ProposeResolution refuses an open case not among them.
func casesSeen(cases []FinanceCase) string {
	items := make([]string, len(cases))
	for i, c := range cases {
		items[i] = strconv.FormatInt(c.ID, 10) + ":" + c.seen
	}
	return casesSeenPrefix + strings.Join(items, ",")
}

// newsSinceForm refuses a proposal when one of the payment's open cases of the gateway's word
// (gatewayWordCaseKinds) is not among those its form showed (seen: ProposalInput.CasesSeen), as
// they were: opened, or added to, since it was read. A case resolved meanwhile is no news.
func newsSinceForm(ctx context.Context, tx pgx.Tx, sessionID, seen string) error {
	news, err := unseenGatewayNews(ctx, tx, sessionID, strings.Split(strings.TrimPrefix(seen, casesSeenPrefix), ","))
	if err != nil {
		return dbError("propose resolution: cases", err, "")
	}
	if len(news) > 0 {
		return &Error{Code: ECONFLICT, Field: "seen", Message: "the gateway's word about the payment changed since you read it (a case opened or had news: shown above); nothing was proposed: check the evidence and propose again"}
	}
	return nil
}

// unseenGatewayNews is the payment's open cases of the gateway's word (gatewayWordCaseKinds)
// not among seen ("id:version" items, caseSeenSQL) as they are now: opened, or added to, since
// seen was read. The form's check (newsSinceForm) and the approval's (newsSinceProposal) ask
// the same question of different lists.
func unseenGatewayNews(ctx context.Context, tx pgx.Tx, sessionID string, seen []string) ([]int64, error) {
	var news []int64
	err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(fc.id ORDER BY fc.id), '{}') FROM finance_cases fc
		WHERE fc.session_id = $1 AND fc.resolved_at IS NULL AND fc.kind = ANY($2) AND NOT (fc.id || ':' || `+caseSeenSQL("fc")+`) = ANY($3)`,
		sessionID, gatewayWordCaseKinds, seen).Scan(&news)
	return news, err
}

// CasesSeenNone is the CasesSeen of a form that showed no case (casesSeen of none): the console
// gives it to a form that sent no CasesSeen at all.
const CasesSeenNone = casesSeenPrefix

// casesSeenPrefix marks a form's CasesSeen (a form that showed no case sends the prefix alone).
const casesSeenPrefix = "seen:"

// casesSeenSQL is the payment $1's open finance cases as read now, each "id:" and its version
// (caseSeenSQL): what a settlement proposal was filed knowing (resolution_proposals.cases_seen,
// migration 01000).
var casesSeenSQL = `ARRAY(SELECT fc.id || ':' || ` + caseSeenSQL("fc") + ` FROM finance_cases fc WHERE fc.session_id = $1 AND fc.resolved_at IS NULL)`

// newsSinceProposal refuses the approval of a settlement proposal when one of the payment's
// cases that carry the gateway's word about it (gatewayWordCaseKinds, which the settlement
// closes) was opened or had news since it was filed (under the order → session locks the news's
// writers take too): neither the proposer nor the approver was shown it, and the approval would
// settle on evidence it contradicts and close the case, its facts let go (a review: a capture of
// 1.00 found after a proposal of Completed for 99.00 was booked as 99.00 received). A case
// resolved meanwhile is no news, nor the patrol's schedule running out; one about other money
// stays open after the settlement, for finance
// (TestSettlingTheOldSessionLeavesTheCaseAboutMoneyAtTheNewGateway). Proposals without
// cases_seen (refunds and refunds' outcomes, and those filed before migration 01000) are not
// compared.
func newsSinceProposal(ctx context.Context, tx pgx.Tx, p Resolution) error {
	var seen []string
	if err := tx.QueryRow(ctx, `SELECT cases_seen FROM resolution_proposals WHERE id = $1`, p.ID).Scan(&seen); err != nil {
		return fmt.Errorf("approve resolution: cases seen: %w", err)
	}
	if seen == nil {
		return nil
	}
	news, err := unseenGatewayNews(ctx, tx, p.SessionID, seen)
	if err != nil {
		return fmt.Errorf("approve resolution: news since the proposal: %w", err)
	}
	if len(news) == 0 {
		return nil
	}
	ids := make([]string, len(news))
	for i, id := range news {
		ids[i] = fmt.Sprintf("#%d", id)
	}
	return Errorf(ECONFLICT, "payment %s has news from the gateway since the proposal (case %s, opened or added to after it was filed): the proposal was made without it; read the case, then reject the proposal and propose again. Nothing was settled",
		Short(p.SessionID), strings.Join(ids, ", "))
}

// ApproveResolution applies a proposal: a settlement's outcome through applyTransition
// (Completed with the order's one PaymentReceived entry) with the session's open cases
// resolved, or a refund claimed through the refund core — and the approval audited, in one
// transaction under the order → session → finance lock order. The approver must not be the
// proposer (checked here, by the guard of the UPDATE, and by the schema), nor linked to them by a
// password one of them set — now, or, for the proposer's setters, when the proposal was made
// (proposer_setters, migration 00620: a reset since does not make the one who could have made
// it a second person) — the guard; explainDecided names it. Of two concurrent
// approvals the second waits for the order lock and then finds the proposal approved. An
// approved refund is asked of the gateway after commit, like every refund.
func (s *Service) ApproveResolution(ctx context.Context, by Staff, id int64) (Resolution, error) {
	ctx, span := s.startSpan(ctx, "payments.resolution.approve", "", "")
	defer span.End()
	p, err := getResolution(ctx, s.db, id)
	if err != nil {
		return Resolution{}, err
	}
	ctx = s.traceSession(ctx, Session{ID: p.SessionID, OrderID: p.OrderID})
	if p.Pending() && p.ProposedBy == by.Email {
		return Resolution{}, errSelfApproval
	}
	if ownApproval(p, by) {
		return p, nil
	}
	var cur Session
	var refund *RefundResult
	approve := func(asked []string) error {
		refund = nil
		now := s.cfg.Clock.Now()
		return s.inTx(ctx, "approve resolution", func(tx pgx.Tx) error {
			cur, err = lockOrderAndSession(ctx, tx, p.OrderID, p.SessionID)
			if err != nil {
				return err
			}
			if h := s.cfg.Hooks.AfterResolutionLock; h != nil {
				h(ctx, p.SessionID)
			}
			tag, err := tx.Exec(ctx, `UPDATE resolution_proposals SET state = 'approved', decided_by = $2, decided_at = $3
			WHERE id = $1 AND state = 'proposed' AND proposed_by <> $2 AND NOT password_linked(proposed_by, $2)
			  AND NOT $2 = ANY(proposer_setters)
			  AND NOT EXISTS (SELECT 1 FROM staff_users u WHERE u.email = proposed_by AND u.disabled_at IS NOT NULL)`, id, by.Email, now)
			if err != nil {
				return dbError("approve resolution", err, "")
			}
			if tag.RowsAffected() != 1 {
				return explainDecided(ctx, tx, id, by, true)
			}
			if cur.Status != p.StatusAtProposal {
				return Errorf(ECONFLICT, "payment %s moved from %s to %s since the proposal; its evidence may be stale: reject it and propose again",
					Short(cur.ID), p.StatusAtProposal, cur.Status)
			}
			if err := newsSinceProposal(ctx, tx, p); err != nil {
				return err
			}
			detail := fmt.Sprintf("#%d %s (proposed by %s): %s", id, p.What(), p.ProposedBy, p.Reason)
			if p.Kind == ProposalRefundSettle {
				if err := s.approveRefundOutcome(ctx, tx, cur, p, by, now); err != nil {
					return err
				}
				return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: string(by.Role), Action: AuditResolutionApprove, Target: cur.ID,
					Detail: detail + "; refund " + p.RefundID}, now)
			}
			if p.IsRefund() {
				r, err := s.approveRefund(ctx, tx, cur, p, by, asked, now)
				if err != nil {
					return err
				}
				refund = &r
				return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: string(by.Role), Action: AuditResolutionApprove, Target: cur.ID,
					Detail: detail + "; refund " + r.Refund.ID}, now)
			}
			// What made the session settleable by hand must still hold: a session sent back to the
			// patrol since (its flag cleared) is being asked about again, and the gateway's word,
			// not this decision, settles it.
			mismatch, err := hasOpenMismatch(ctx, tx, cur.ID)
			if err != nil {
				return err
			}
			if Settleable(cur, mismatch) == "" {
				return Errorf(ECONFLICT, "payment %s is no longer flagged, Unknown or mismatched: the patrol looks at it again; reject the proposal",
					Short(cur.ID))
			}
			reason := fmt.Sprintf("four-eyes resolution #%d: proposed by %s, approved by %s: %s", id, p.ProposedBy, by.Email, p.Reason)
			sess, err := applyTransition(ctx, tx, cur.ID, p.Outcome, by.Actor(), reason, now, sessionPatch{})
			if err != nil {
				return err
			}
			if p.Outcome == StatusCompleted {
				if err := completeOrder(ctx, tx, sess, now); err != nil {
					return err
				}
			}
			// A cancel's reverse still Pending ends with the settlement, or nothing would ever end it
			// (the session is no longer Canceling, and the patrol leaves it): confirmed for Canceled,
			// nothing to reverse for Failed, refused for Completed (the money was taken).
			opStatus, opDetail := "Succeeded", fmt.Sprintf("confirmed by people: resolution #%d", id)
			switch p.Outcome {
			case StatusFailed:
				opDetail = fmt.Sprintf("nothing to reverse: settled by people as Failed, resolution #%d", id)
			case StatusCompleted:
				opStatus, opDetail = "Refused", fmt.Sprintf("the payment was captured: settled by people as Completed, resolution #%d", id)
			}
			if _, err := tx.Exec(ctx, `UPDATE reverse_operations SET status = $2, detail = $3, updated_at = $4
			WHERE session_id = $1 AND status = 'Pending'`, cur.ID, opStatus, opDetail, now); err != nil {
				return fmt.Errorf("approve resolution: reverse: %w", err)
			}
			if cur.Status == StatusCanceling && p.Outcome == StatusCompleted {
				// The customer confirmed a cancel with their code, and the money was taken all the
				// same: as when the gateway's answer settles it (decide: cancel_lost_race), finance
				// is asked whether to refund. Settled by people, nothing said so, and nothing
				// later would: a Completed payment the gateway holds is no contradiction (an
				// outside review).
				if err := noteCase(ctx, tx, cur.ID, cur.OrderID, CaseCancelLostRace, fmt.Sprintf(
					"the customer confirmed a cancel, and the payment was settled Completed by resolution #%d: refund if the customer still wants to cancel", id), now); err != nil {
					return err
				}
			}
			// The settlement answers the cases that asked what state the payment is in; the others
			// are about other money (a second gateway payment, a cancel that lost its race, a
			// reversal nobody asked for) and stay open for finance (an outside review: a duplicate
			// payment's case was closed by settling the first payment, the second one's money off
			// the open list). Their facts are let go: the settlement said what state the payment is
			// in, it did not deal with the gateway's contradiction, which a Check or reconciliation
			// finding it again (a Completed payment the gateway lost) must report anew
			// (factsResolved; an outside review of the facts).
			// Read before the cases it closes let their facts go.
			held, err := heldMoneyKnown(ctx, tx, cur, sess)
			if err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `UPDATE finance_cases SET resolved_at = $2, resolved_by = $3, resolution = $4, facts = '{}'
			WHERE session_id = $1 AND resolved_at IS NULL AND kind = ANY($5) RETURNING id`, cur.ID, now, by.Email,
				fmt.Sprintf("settled as %s by resolution #%d (proposed by %s)", p.Outcome, id, p.ProposedBy), settledCaseKinds)
			if err != nil {
				return fmt.Errorf("approve resolution: cases: %w", err)
			}
			closed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return fmt.Errorf("approve resolution: cases: %w", err)
			}
			for i, c := range closed {
				if i == 0 {
					detail += "; closed case"
				}
				detail += fmt.Sprintf(" #%d", c)
			}
			if len(held) > 0 {
				// Settled Failed (or Canceled) while pitlane knew the gateway holds the session's
				// money (a capture of another amount, an authorization): that money is a late payment,
				// as reconciliation would find it, and the order stays in review (no second
				// charge from its checkout) until finance deals with it (an outside review: the
				// approval let the facts go, and a Pay click charged the customer again).
				if err := noteLatePayment(ctx, tx, sess, fmt.Sprintf("settled %s by resolution #%d while the gateway holds its payment: %s",
					p.Outcome, id, strings.Join(held, ", ")), now, held); err != nil {
					return err
				}
				detail += "; late payment noted: " + strings.Join(held, ", ")
			}
			return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: string(by.Role), Action: AuditResolutionApprove, Target: cur.ID,
				Detail: detail}, now)
		})
	}
	if p.Pending() && p.Kind == ProposalRefund {
		// Every path that refunds asks the gateway first about refunds settled Failed by hand
		// (recheckRefundsFailedByHand): their amount is not free while the gateway paid them.
		// With the payment as read: one whose gateway id was never learnt is looked for by our
		// key on the payment's id, and a Session of ids alone asked about payment "" (Stripe
		// refuses that for good; a gateway that answers found nothing, and the amount went out
		// twice: an outside review).
		var sess Session
		if sess, err = s.Get(ctx, p.SessionID); err == nil {
			err = s.withRecheckedRefunds(ctx, sess, approve)
		}
	} else {
		err = approve(nil)
	}
	if ErrorCode(err) == ECONFLICT {
		if again, gerr := getResolution(ctx, s.db, id); gerr == nil && ownApproval(again, by) {
			return again, nil // the same approver's second click, waiting behind the first
		}
	}
	if err != nil {
		return Resolution{}, err
	}
	if refund != nil {
		if _, err := s.settleRefund(ctx, cur, refund.Refund, refund.Created); err != nil {
			return Resolution{}, err
		}
	}
	return getResolution(ctx, s.db, id)
}

// ownApproval says p was approved by by already: the same approval sent again — its first
// answer lost with its COMMIT's (a failover), or a second click — is answered with it, done
// once. Refused "already approved by" themselves, the approver was not told what their approval
// did (an outside review, lost commits).
func ownApproval(p Resolution, by Staff) bool {
	return p.State == ResolutionApproved && p.DecidedBy == by.Email
}

// heldMoneyKnown is what pitlane was told of sess's money at the gateway (sess as settled, was
// as it stood before), as facts heldBySession keeps: those of the session's cases of
// settledCaseKinds, open (the settlement closes them and lets their facts go: a capture of
// another amount) or resolved by finance without settling it ("asked the gateway's support"),
// and an Authorized session's own authorization (the customer's card held: the patrol flagged
// it for want of a capture). Settled Failed beside any, the order left review and its checkout
// charged the customer again until reconciliation came round (an outside review, a fourth messy
// day). A Completed settlement keeps none (nothing is late).
func heldMoneyKnown(ctx context.Context, tx pgx.Tx, was, sess Session) ([]string, error) {
	var facts []string
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT f ORDER BY f), '{}') FROM finance_cases, unnest(facts) f
		WHERE session_id = $1 AND kind = ANY($2)`, sess.ID, settledCaseKinds).Scan(&facts); err != nil {
		return nil, fmt.Errorf("approve resolution: the cases' facts: %w", err)
	}
	if was.Status == StatusAuthorized && was.GatewayPaymentID != "" {
		facts = append(facts, gatewayFact(GatewayPayment{ID: was.GatewayPaymentID, Status: GatewayAuthorized, Amount: was.Amount, Currency: was.Currency}))
	}
	var held []string
	for _, f := range facts {
		if heldBySession(f, sess) && !slices.Contains(held, f) {
			held = append(held, f)
		}
	}
	return held, nil
}

// RejectResolution closes a proposal without effect, with a note (required). The proposer may
// reject their own (a withdrawal needs no second pair of eyes). Only the proposal row changes,
// so it takes no order or session lock; a concurrent approval holding them reaches the
// proposal row after this or finds it rejected.
func (s *Service) RejectResolution(ctx context.Context, by Staff, id int64, note string) (Resolution, error) {
	ctx, span := s.startSpan(ctx, "payments.resolution.reject", "", "")
	defer span.End()
	note, err := requiredText("note", note, "say why the proposal is rejected", MaxReasonLength)
	if err != nil {
		return Resolution{}, err
	}
	now := s.cfg.Clock.Now()
	err = s.inTx(ctx, "reject resolution", func(tx pgx.Tx) error {
		var sessionID string
		err := tx.QueryRow(ctx, `UPDATE resolution_proposals SET state = 'rejected', decided_by = $2, decided_at = $3, decision_note = $4
			WHERE id = $1 AND state = 'proposed' RETURNING session_id::text`, id, by.Email, now, note).Scan(&sessionID)
		if errors.Is(err, pgx.ErrNoRows) {
			return explainDecided(ctx, tx, id, by, false)
		}
		if err != nil {
			return dbError("reject resolution", err, "")
		}
		if err := staffStands(ctx, tx); err != nil {
			return err
		}
		return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: string(by.Role), Action: AuditResolutionReject, Target: sessionID,
			Detail: fmt.Sprintf("#%d: %s", id, note)}, now)
	})
	if err != nil {
		return Resolution{}, err
	}
	return getResolution(ctx, s.db, id)
}

// ResolutionFilter narrows ListResolutions. Zero values: every proposal, newest first, 100 rows.
type ResolutionFilter struct {
	State     string
	SessionID string
	Limit     int
	// Queue: the proposals waiting for a second person (State is ignored), oldest first — the
	// one waiting longest is the one to decide first, and never the one a limit cuts off.
	Queue bool
	// Decided: approved and rejected ones (State is ignored), latest decision first — a
	// decision on an old proposal is news too.
	Decided bool
}

// ListResolutions returns proposals newest first.
func (s *Service) ListResolutions(ctx context.Context, f ResolutionFilter) ([]Resolution, error) {
	if f.Limit <= 0 || f.Limit > 500 {
		f.Limit = 100
	}
	// Only the filters given, each its own statement: "($2 IS NULL OR rp.session_id = $2)"
	// would leave a prepared statement's generic plan walking every proposal for one payment's
	// (TestPaymentPageReadsByIndexes).
	where, args, order := "true", []any{f.Limit}, "rp.proposed_at DESC, rp.id DESC"
	switch {
	case f.Queue: // resolution_proposals_queue (migration 00670)
		where, order = "rp.state = 'proposed'", "rp.proposed_at, rp.id"
	case f.Decided: // resolution_proposals_decided (migration 00670)
		where, order = "rp.state <> 'proposed'", "rp.decided_at DESC, rp.id DESC"
	case f.State != "":
		args = append(args, f.State)
		where += fmt.Sprintf(" AND rp.state = $%d", len(args))
	}
	if f.SessionID != "" {
		if !validUUID(f.SessionID) {
			return nil, nil
		}
		args = append(args, f.SessionID)
		where += fmt.Sprintf(" AND rp.session_id = $%d::uuid", len(args))
	}
	rows, err := s.db.Query(ctx, `SELECT `+resolutionColumns+`
		FROM resolution_proposals rp JOIN payment_sessions ps ON ps.id = rp.session_id
		WHERE `+where+` ORDER BY `+order+` LIMIT $1`, args...)
	if err != nil {
		return nil, fmt.Errorf("list proposals: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Resolution, error) { return scanResolution(r) })
	if err != nil {
		return nil, fmt.Errorf("list proposals: %w", err)
	}
	return out, nil
}

// WaitingResolutions counts the proposals waiting for a second person (the queue's length,
// when the page shows only its oldest; an index-only count of resolution_proposals_queue).
func (s *Service) WaitingResolutions(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRow(ctx, `SELECT count(*) FROM resolution_proposals WHERE state = 'proposed'`).Scan(&n); err != nil {
		return 0, dbError("count proposals", err, "")
	}
	return n, nil
}

// Short is the head of an id, as messages to people name payments.
func Short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
