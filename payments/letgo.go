package payments

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Letting go in the background. A request that took a hold — an idempotency key, a checkout
// click's intent, Check now's claims — and whose last write (or the transaction taking it) the
// database refused or answered with its answer lost, has already answered its caller: the hold
// is let go of here, by the request's token, so that the same request sent again is not refused
// "in progress" until the hold goes stale though nothing ran (an outside review, dbfail).

// mayHaveRun reports whether a statement that failed with err may have been carried out by the
// server: not when no connection was made, nothing was sent (pgconn.SafeToRetry), or the server
// answered it with an error of its own (an ERROR; not a connection's end). A FATAL or a PANIC
// ends the connection whatever its code — a PANIC on the commit record's fsync, a pooler's FATAL
// with a code of its own — and may follow a COMMIT the server carried out: read by its code
// alone, such a COMMIT was "rolled back" with its row committed, and the call's log row written
// a second time (a review).
func mayHaveRun(err error) bool {
	var ce *pgconn.ConnectError
	var pe *pgconn.PgError
	switch {
	case err == nil, errors.As(err, &ce), pgconn.SafeToRetry(err):
		return false
	case errors.As(err, &pe):
		return DatabaseUnavailable(err) || pe.SeverityUnlocalized == "FATAL" || pe.SeverityUnlocalized == "PANIC" ||
			pe.SeverityUnlocalized == "" && (pe.Severity == "FATAL" || pe.Severity == "PANIC")
	}
	return true
}

// maxLetGo bounds the holds a replica lets go of in the background at once (letGoLater): under
// a long outage each failed request would add one more for its stale bound. Past it a hold goes
// stale as before.
const maxLetGo = 256

// heldLetGo is letGoLater's done for a hold of the core: logged when it was not let go of, and
// told to Hooks.AfterHoldLetGo.
func (s *Service) heldLetGo(what string) func(error) {
	return func(err error) {
		if err != nil {
			s.log.Warn("a hold was not let go of; it is free once stale", "hold", what, "err", err)
		}
		if h := s.cfg.Hooks.AfterHoldLetGo; h != nil {
			h(what, err)
		}
	}
}

// letGoLater runs op — the last write of a request that has answered, letting go of a hold it
// took (an idempotency key, a checkout click's intent, Check now's claims), which the database
// refused or whose answer it lost — in the background until op says it is done: at once, then
// after 250 ms doubling to 5 s, for at most stale (after which the hold is any request's to take
// anyway). done, if not nil, is told how it ended (nil: written). Lost with the process (the
// hold then goes stale, as after a crash), and not started past maxLetGo at once. Before, a hold
// whose last write failed was kept until it went stale, and the same request was refused "in
// progress" though nothing ran (an outside review, dbfail).
func (s *Service) letGoLater(what string, stale time.Duration, op func(context.Context) (done bool, err error), done func(error)) {
	select {
	case s.lettingGo <- struct{}{}:
	default:
		s.log.Warn("too many holds being let go of; this one is free once stale", "hold", what)
		return
	}
	go func() {
		defer func() { <-s.lettingGo }()
		ctx, cancel := context.WithTimeout(context.Background(), stale)
		defer cancel()
		wait := 250 * time.Millisecond
		var err error
		for {
			var finished bool
			if finished, err = op(ctx); finished {
				err = nil
				break
			}
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
			}
			if ctx.Err() != nil {
				break
			}
			wait = min(2*wait, 5*time.Second)
		}
		if done != nil {
			done(err)
		}
	}()
}

// writeLater is letGoLater for a hold let go of by one statement (execBounded, guarded by the
// request's token): done once the statement ran, whatever it found.
func (s *Service) writeLater(what string, stale time.Duration, op, sql string, args ...any) {
	s.letGoLater(what, stale, func(ctx context.Context) (bool, error) {
		_, err := s.execBounded(ctx, op, sql, args...)
		return err == nil, err
	}, s.heldLetGo(what))
}
