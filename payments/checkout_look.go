package payments

import (
	"context"
	"time"
)

// PageLookEvery is how often, at most, anonymous pages make the gateway be asked about one
// session (contract: "Anonymous surfaces").
const PageLookEvery = 5 * time.Second

// PageLook is what CheckFromPage found.
type PageLook struct {
	// Session is the session after the look: the gateway's answer applied when this call asked,
	// else as the database has it.
	Session Session
	// Asked: this call took the turn and asked the gateway.
	Asked bool
	// Next is when a page may next make the gateway be asked about the session: PageLookEvery
	// after the last look (this one's, when Asked). A page that shows the database's answer and
	// waits for the gateway's looks again then, not earlier (its look would find no turn).
	Next time.Time
}

// CheckFromPage is Check for anonymous pages — the customer's checkout and return pages, which
// anyone can load as often as they like. The gateway is asked about a session at most once per
// PageLookEvery, across every replica; in between, the page's answer is the session as the
// database has it (the last answer applied, by this look, the sweeper or a webhook). The look
// says whether this call took the turn and asked, and when the next turn is.
//
// The turn is one guarded UPDATE of last_gateway_look_at in PostgreSQL, so two replicas cannot
// both take it. It skips a row that is locked right now (SKIP LOCKED): that session is being
// applied at this moment, which is as good as a look, and a page load never waits on a lock.
// The same statement reads the last look as it was before it (the statement's snapshot), for
// Next when the turn was not this call's; a row skipped as locked may be looked at again at once.
func (s *Service) CheckFromPage(ctx context.Context, actor Actor, id string) (PageLook, error) {
	if !validUUID(id) {
		return PageLook{}, Errorf(ENOTFOUND, "payment %q not found", id)
	}
	now := s.cfg.Clock.Now()
	var (
		turn bool
		last *time.Time
	)
	err := s.db.QueryRow(ctx, `
		WITH turn AS (
			SELECT id FROM payment_sessions
			WHERE id = $1 AND (last_gateway_look_at IS NULL OR last_gateway_look_at <= $2)
			FOR UPDATE SKIP LOCKED
		), took AS (
			UPDATE payment_sessions ps SET last_gateway_look_at = $3 FROM turn WHERE ps.id = turn.id
			RETURNING true
		)
		SELECT EXISTS (SELECT FROM took), (SELECT last_gateway_look_at FROM payment_sessions WHERE id = $1)`,
		id, now.Add(-PageLookEvery), now).Scan(&turn, &last)
	if err != nil {
		return PageLook{}, dbError("page look: take the turn", err, "")
	}
	if !turn {
		look := PageLook{Next: now} // never looked at, or skipped as locked: a next load may take the turn
		if last != nil && last.Add(PageLookEvery).After(now) {
			look.Next = last.Add(PageLookEvery)
		}
		look.Session, err = s.Get(ctx, id) // not this load's turn: the database's answer
		return look, err
	}
	sess, err := s.Check(ctx, actor, id)
	return PageLook{Session: sess, Asked: true, Next: now.Add(PageLookEvery)}, err
}
