package handlers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"pitlane/live"
	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/auth"
)

// Live serves the console's live streams (server-sent events): each tells one page to fetch its
// live fragment again when something it shows changed (package live hears PostgreSQL's
// notifications and fans them out). static/live.js opens the stream of a page's live region
// and, while the stream is down, polls instead. The routes sit behind the same sign-in and role
// checks as the pages they feed; what a stream carries is only "refresh" and a position.
type Live struct {
	hub   *live.Hub
	svc   *payments.Service
	log   *slog.Logger
	still func(echo.Context) error

	mu   sync.Mutex
	open map[string]int // streams open on this replica per signed-in user
}

// MaxStreamsPerUser bounds the live streams one user holds open on one replica: a page has one,
// so this is tabs. Each open stream is a connection, a goroutine and a user read per event; a
// script opening thousands could starve the pool the payment core uses (an outside review).
// Past it: 429 with Retry-After, and live.js polls instead. A resource limit of this process,
// not coordination: each replica counts its own.
const MaxStreamsPerUser = 16

// hold counts a stream of user, or says the user has too many open here.
func (h *Live) hold(user string) (release func(), ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.open == nil {
		h.open = map[string]int{}
	}
	if h.open[user] >= MaxStreamsPerUser {
		return nil, false
	}
	h.open[user]++
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.open[user]--; h.open[user] <= 0 {
			delete(h.open, user)
		}
	}, true
}

// NewLive builds the stream handlers over the replica's hub (nil: the streams answer 503 and
// pages poll); svc finds a payment page's order when its stream opens. still (auth.Manager.Still) is asked before every event that tells something (a
// refresh, the listener down; not a heartbeat): a user disabled, signed out by a new password or
// moved to a role without the page since the stream opened learns nothing more, and the stream
// ends (nil: never asked).
func NewLive(hub *live.Hub, svc *payments.Service, log *slog.Logger, still func(echo.Context) error) *Live {
	if log == nil {
		log = slog.Default()
	}
	return &Live{hub: hub, svc: svc, log: log, still: still}
}

// Mark puts the hub's position into the request before the page reads what it shows, so the
// page's live region can tell its stream where it stands: a change between the read and the
// stream's start is then a refresh at once rather than lost.
func (h *Live) Mark(next echo.HandlerFunc) echo.HandlerFunc {
	if h.hub == nil {
		return next
	}
	return func(c echo.Context) error {
		r := c.Request()
		c.SetRequest(r.WithContext(views.WithLive(r.Context(), h.hub.Position().String())))
		return next(c)
	}
}

// Stream: GET /live/<page>, the stream of one page (dashboard, payments list, locks, a finance
// page).
func (h *Live) Stream(page live.Page) echo.HandlerFunc {
	return func(c echo.Context) error {
		return h.serve(c, func() (live.Topic, error) { return live.Topic{Page: page}, nil })
	}
}

// Payment: GET /live/payments/:id, the stream of one payment's page. The page also shows its
// order's state and the order's other sessions, so the stream hears those too: the order is
// read once as the stream opens (a session's order never changes), and a declined session's
// open page refreshes when the customer pays the order with a new one (an outside review). The
// look-up comes after the user's stream count (serve): past it, a script reconnecting in a loop
// costs no database read.
func (h *Live) Payment(c echo.Context) error {
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return notFound("payment")
	}
	return h.serve(c, func() (live.Topic, error) {
		s, err := h.svc.Get(c.Request().Context(), id.String())
		if err != nil {
			return live.Topic{}, err
		}
		return live.Topic{Page: live.PagePayment, Session: s.ID, Order: s.OrderID}, nil
	})
}

// LiveHeader marks the requests static/live.js makes to refresh a page's live region.
const LiveHeader = views.LiveHeader

// liveRefresh reports whether the request refreshes a live region (rather than, say, htmx
// following an action's redirect to the same page).
func liveRefresh(c echo.Context) bool {
	c.Response().Header().Add("Vary", LiveHeader)
	return htmx(c) && c.Request().Header.Get(LiveHeader) == "1"
}

// writeWait bounds each write of a stream: a browser that does not take a few bytes within it is
// stuck, and its stream ends (the subscription with it) instead of holding a goroutine.
const writeWait = 10 * time.Second

// stillBound bounds a stream's sign-in check before an event (auth.Manager.Still): the live
// routes have no request bound, and on a database that did not answer the stream waited in it
// with no event and no heartbeat, past its lifetime, holding a goroutine and a pool connection
// (a review of a silent host). Cut, the stream ends; the browser reconnects and polls.
const stillBound = 10 * time.Second

// retryMillis is how soon a browser reconnects after a stream ended (lifetime, shutdown).
const retryMillis = "2000"

// serve holds one of the user's streams, finds what the stream is about (topic) and streams it.
func (h *Live) serve(c echo.Context, topic func() (live.Topic, error)) error {
	if h.hub == nil {
		return &payments.Error{Code: payments.EUNAVAIL, Message: "live updates are off on this replica"}
	}
	release, ok := h.hold(auth.Staff(c).Email)
	if !ok {
		return &payments.Error{Code: payments.ELOCKED, RetryAfter: time.Minute,
			Message: fmt.Sprintf("more than %d live pages open on this server: this one updates by polling", MaxStreamsPerUser)}
	}
	defer release()
	t, err := topic()
	if err != nil {
		return err
	}
	// A reconnecting EventSource sends the last id it saw; a new one, the page's position.
	since := c.Request().Header.Get("Last-Event-ID")
	if since == "" {
		since = c.QueryParam("since")
	}
	sub, err := h.hub.Subscribe(t, since)
	if errors.Is(err, live.ErrClosed) {
		return &payments.Error{Code: payments.EUNAVAIL, Message: "this replica is shutting down"}
	} else if err != nil {
		return err
	}
	defer sub.Close()

	w := c.Response()
	hdr := w.Header()
	hdr.Set(echo.HeaderContentType, "text/event-stream")
	hdr.Set(echo.HeaderCacheControl, "no-store")
	hdr.Set("X-Accel-Buffering", "no") // nginx and friends: pass each event on at once
	w.WriteHeader(http.StatusOK)
	sink := &sseSink{w: w, rc: http.NewResponseController(w)}
	if h.still != nil {
		sink.still = func() error {
			req := c.Request()
			ctx, cancel := context.WithTimeout(req.Context(), stillBound)
			defer cancel()
			c.SetRequest(req.WithContext(ctx))
			defer c.SetRequest(req)
			return h.still(c)
		}
	}
	if err := sink.write("retry: " + retryMillis + "\n\n"); err != nil {
		return nil
	}
	// The response is under way: how the stream ended (the browser left, shutdown, a stuck
	// client, its lifetime) is no error of the request's.
	if err := sub.Serve(c.Request().Context(), sink); err != nil && !errors.Is(err, live.ErrClosed) && c.Request().Context().Err() == nil {
		h.log.Debug("live stream ended", "topic", t, "err", err)
	}
	return nil
}

// sseSink writes server-sent events. Each write gets its own deadline (the server's
// WriteTimeout would otherwise cut every stream after a minute) and is flushed at once.
type sseSink struct {
	w     io.Writer
	rc    *http.ResponseController
	still func() error // is the user still allowed? asked before every event (nil: not asked)
}

// event writes one event of the stream, once the user is still allowed to have it.
func (s *sseSink) event(msg string) error {
	if s.still != nil {
		if err := s.still(); err != nil {
			return err
		}
	}
	return s.write(msg)
}

func (s *sseSink) write(msg string) error {
	if err := s.rc.SetWriteDeadline(time.Now().Add(writeWait)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	if _, err := io.WriteString(s.w, msg); err != nil {
		return err
	}
	return s.rc.Flush()
}

// Refresh: "event: refresh" with the hub's position as the id the browser hands back.
func (s *sseSink) Refresh(id string) error {
	return s.event("id: " + id + "\nevent: refresh\ndata: refresh\n\n")
}

// Down: the listener is down; the page polls until the next refresh.
func (s *sseSink) Down() error { return s.event("event: down\ndata: down\n\n") }

// Ping is a comment: browsers ignore it, proxies see traffic. It tells nothing, so it asks
// nobody (an idle stream makes no query).
func (s *sseSink) Ping() error { return s.write(": ping\n\n") }
