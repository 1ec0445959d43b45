package payments

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// PageLookEvery is how often, at most, anonymous pages make the gateway be asked about one
// session (contract: "Anonymous surfaces").
const PageLookEvery = 5 * time.Second

// CheckFromPage is Check for anonymous pages — the customer's checkout and return pages, which
// anyone can load as often as they like. The gateway is asked about a session at most once per
// PageLookEvery, across every replica; in between, the page's answer is the session as the
// database has it (the last answer applied, by this look, the sweeper or a webhook). asked says
// whether this call took the turn and asked.
//
// The turn is one guarded UPDATE of last_gateway_look_at in PostgreSQL, so two replicas cannot
// both take it. It skips a row that is locked right now (SKIP LOCKED): that session is being
// applied at this moment, which is as good as a look, and a page load never waits on a lock.
func (s *Service) CheckFromPage(ctx context.Context, actor Actor, id string) (sess Session, asked bool, err error) {
	if !validUUID(id) {
		return Session{}, false, Errorf(ENOTFOUND, "payment %q not found", id)
	}
	now := s.cfg.Clock.Now()
	var turn bool
	err = s.db.QueryRow(ctx, `
		WITH turn AS (
			SELECT id FROM payment_sessions
			WHERE id = $1 AND (last_gateway_look_at IS NULL OR last_gateway_look_at <= $2)
			FOR UPDATE SKIP LOCKED
		)
		UPDATE payment_sessions ps SET last_gateway_look_at = $3 FROM turn WHERE ps.id = turn.id
		RETURNING true`, id, now.Add(-PageLookEvery), now).Scan(&turn)
	if errors.Is(err, pgx.ErrNoRows) {
		sess, err = s.Get(ctx, id) // not this load's turn: the database's answer
		return sess, false, err
	}
	if err != nil {
		return Session{}, false, dbError("page look: take the turn", err, "")
	}
	sess, err = s.Check(ctx, actor, id)
	return sess, true, err
}
