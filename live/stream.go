package live

import (
	"context"
	"time"
)

// Sink is where a stream writes (package handlers: server-sent events). Each method writes and
// flushes one message; an error ends the stream.
type Sink interface {
	// Refresh: something the page shows changed; id is the hub's position, which the browser
	// hands back when it reconnects.
	Refresh(id string) error
	// Down: the listener lost its connection; the page polls until the next Refresh.
	Down() error
	// Ping keeps an idle connection open (a comment; no query is made for it).
	Ping() error
}

// Serve runs one stream until ctx ends (the browser went away), the subscription ends (the hub
// closed: shutdown), a write fails (a stuck browser: the sink's write deadline) or its
// Lifetime is over (nil: the browser reconnects by itself). Bursts are coalesced: the first
// change of a quiet stream goes out at once, later ones within Debounce of the last refresh
// become one refresh at the end of the window, so a sweeper settling 500 sessions makes a page
// fetch itself twice, not 500 times.
func (s *Subscription) Serve(ctx context.Context, sink Sink) error {
	cfg := s.hub.cfg
	t := cfg.Timers
	beat, stop := t.Tick(cfg.Heartbeat)
	defer stop()
	end := t.After(cfg.Lifetime)

	var (
		pending bool             // a refresh is owed
		down    bool             // the browser was told the listener is down
		window  <-chan time.Time // set while a coalesced refresh waits for the window's end
		last    time.Time        // when the last refresh went out
	)
	flush := func() error {
		pending, last = false, t.Now()
		return sink.Refresh(s.hub.Position().String())
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-end:
			return nil
		case <-beat:
			if err := sink.Ping(); err != nil {
				return err
			}
		case <-window:
			window = nil
			if pending {
				if err := flush(); err != nil {
					return err
				}
			}
		case _, ok := <-s.wake:
			if !ok {
				return s.Err()
			}
			p := s.take()
			if p.Down {
				// Changes heard before the drop are moot: the page polls from now on.
				pending, window = false, nil
				if !down {
					down = true
					if err := sink.Down(); err != nil {
						return err
					}
				}
				continue
			}
			down = false
			if p.Changes == 0 && !p.Refresh {
				continue
			}
			pending = true
			if window != nil {
				continue // coalesced into the refresh at the window's end
			}
			if wait := cfg.Debounce - t.Now().Sub(last); !last.IsZero() && wait > 0 {
				window = t.After(wait)
				continue
			}
			if err := flush(); err != nil {
				return err
			}
		}
	}
}
