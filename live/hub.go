package live

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrClosed ends every subscription when the hub closes (the server is shutting down); the
// browser reconnects to another replica, or to this one once it is back.
var ErrClosed = errors.New("live: hub closed")

// Config is what a Hub needs. Zero values are the defaults.
type Config struct {
	// ConnString is the direct connection LISTEN runs on (not through pgbouncer in transaction
	// mode): LISTEN_DATABASE_URL, defaulting to DATABASE_URL.
	ConnString string
	// Name goes into the listener connection's application_name ("pitlane live <Name>"), so
	// an operator can find it in pg_stat_activity. Usually the replica id.
	Name   string
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the wait before reconnecting after the listener's
	// connection dropped (doubling from min to max; back to min once a connection lasted).
	// Default 500ms and 30s.
	MinBackoff, MaxBackoff time.Duration
	// Debounce: a stream sends at most one refresh per Debounce (the first at once, the rest
	// of a burst coalesced into one at the end of the window). Default 1s.
	Debounce time.Duration
	// Heartbeat: how often an idle stream writes a comment, so that proxies and balancers do
	// not close it as idle. No query is made for it. Default 25s.
	Heartbeat time.Duration
	// Lifetime ends a stream after this long; the browser reconnects at once (through the
	// sign-in check again) and catches up by its last event id. Default 10 minutes.
	Lifetime time.Duration
	// Timers is where streams get their time (tests drive it by hand). Default: the real clock.
	Timers Timers
	// OnListen, if set, is called after each successful LISTEN with the listener's backend pid
	// (tests: to know when the listener is (back) up and whom to terminate).
	OnListen func(pid uint32)
	// IdleAfter: with no page open for this long, the listener closes its connection and rests
	// until the next page opens (listener.go). Default 1 minute; negative: always listen.
	IdleAfter time.Duration
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 500 * time.Millisecond
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(30*time.Second, c.MinBackoff)
	}
	if c.Debounce <= 0 {
		c.Debounce = time.Second
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 25 * time.Second
	}
	if c.Lifetime <= 0 {
		c.Lifetime = 10 * time.Minute
	}
	if c.Timers == nil {
		c.Timers = realTimers{}
	}
	if c.IdleAfter == 0 {
		c.IdleAfter = time.Minute
	}
	return c
}

// ringSize is how many recent events a hub remembers, to tell a reconnecting stream whether
// something it shows changed while it was away. Fixed: memory does not grow with traffic.
const ringSize = 1024

// Hub fans the listener's events out to subscriptions by topic. One per replica.
type Hub struct {
	cfg   Config
	nonce string // tells this hub's positions from another replica's (a stream may move)

	mu      sync.Mutex
	closed  bool
	up      bool // the listener is listening right now
	resting bool // it is not, by choice: no page was open for IdleAfter (listener.go)
	// wake tells a resting listener that a page opened; emptied tells a listening one that the
	// last page closed. Each holds at most one poke.
	wake, emptied chan struct{}
	gen           uint64 // successful LISTENs so far: events between two generations may be lost
	seq           uint64 // events published so far
	ring          [ringSize]Event
	topics        map[string]map[*Subscription]struct{} // entries removed when their last subscriber goes
	n             int                                   // subscriptions
}

// New builds a hub; Run starts its listener.
func New(cfg Config) *Hub {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &Hub{cfg: cfg.withDefaults(), nonce: hex.EncodeToString(b), topics: map[string]map[*Subscription]struct{}{},
		wake: make(chan struct{}, 1), emptied: make(chan struct{}, 1)}
}

// Position is where a hub is in its stream of events: streams send it as their event id, pages
// embed it, and a reconnecting stream hands it back to learn whether it missed something.
type Position struct {
	hub      string
	gen, seq uint64
}

func (p Position) String() string {
	return p.hub + "-" + strconv.FormatUint(p.gen, 10) + "-" + strconv.FormatUint(p.seq, 10)
}

func parsePosition(s string) (Position, bool) {
	parts := strings.Split(s, "-")
	if len(parts) != 3 {
		return Position{}, false
	}
	gen, err1 := strconv.ParseUint(parts[1], 10, 64)
	seq, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil {
		return Position{}, false
	}
	return Position{hub: parts[0], gen: gen, seq: seq}, true
}

// Position is the hub's position now. A page takes it before it reads what it shows.
func (h *Hub) Position() Position {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.position()
}

func (h *Hub) position() Position { return Position{hub: h.nonce, gen: h.gen, seq: h.seq} }

// Pending is what a subscriber has been told since it last looked. Everything folds into it:
// a subscriber holds this and nothing more however many events arrive before it looks, so a
// slow one costs the listener neither a wait nor memory (and a stuck browser connection is cut
// by its write deadline in the HTTP layer, which ends the subscription).
type Pending struct {
	// Changes counts the events its page shows; Last is the latest of them.
	Changes int
	Last    Event
	// Refresh: refresh without knowing what changed: the listener (re)connected, and
	// notifications sent while nobody listened are lost; or the stream's position was too old.
	Refresh bool
	// Down: the listener has no connection right now, so nothing is heard; pages poll until
	// a Refresh says it is back. A state, not news: it stays until the listener is up again.
	Down bool
}

// Subscription is one stream's place in the hub. Close it when the stream ends.
type Subscription struct {
	hub   *Hub
	topic Topic
	wake  chan struct{} // one slot: news is waiting in p; closed when the subscription ends
	p     Pending       // guarded by hub.mu
	done  bool          // guarded by hub.mu: removed from the map, wake closed
	err   error         // guarded by hub.mu: why it ended (nil: closed by its owner)
}

// Topic is what the subscription listens to.
func (s *Subscription) Topic() Topic { return s.topic }

// Err is why the subscription ended: ErrClosed, or nil (Close, or still running).
func (s *Subscription) Err() error {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.err
}

// Close removes the subscription from the hub (idempotent).
func (s *Subscription) Close() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.hub.remove(s, nil)
}

// take returns what is pending and clears the news (Down, a state, stays).
func (s *Subscription) take() Pending {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	p := s.p
	s.p = Pending{Down: p.Down}
	return p
}

// Next waits for news and returns it; an ended subscription returns its error (ErrClosed, or
// errEnded after Close).
func (s *Subscription) Next(ctx context.Context) (Pending, error) {
	select {
	case <-ctx.Done():
		return Pending{}, ctx.Err()
	case _, ok := <-s.wake:
		if !ok {
			if err := s.Err(); err != nil {
				return Pending{}, err
			}
			return Pending{}, errEnded
		}
		return s.take(), nil
	}
}

var errEnded = errors.New("live: subscription closed")

// TryNext returns the news waiting now, if any, without waiting.
func (s *Subscription) TryNext() (Pending, bool) {
	select {
	case _, ok := <-s.wake:
		if ok {
			return s.take(), true
		}
	default:
	}
	return Pending{}, false
}

// poke tells s that news is waiting, without ever waiting itself (h.mu held).
func (s *Subscription) poke() {
	if s.done {
		return
	}
	select {
	case s.wake <- struct{}{}:
	default: // already poked: the subscriber will find this news too when it looks
	}
}

// Subscribe registers a stream for topic. since is the position the stream's page was rendered
// at, or the last event id the browser saw: when something the topic shows may have changed
// after it (or since is unknown, from another replica or generation, or older than what the
// hub remembers), the first news is a Refresh. While the listener is down, Down. While it rests
// (no page was open for a while), the subscription wakes it; its LISTEN then refreshes every
// subscriber once, as after any new LISTEN.
func (h *Hub) Subscribe(t Topic, since string) (*Subscription, error) {
	if !t.Valid() {
		return nil, fmt.Errorf("live: subscribe to %+v: no such topic", t)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	s := &Subscription{hub: h, topic: t, wake: make(chan struct{}, 1)}
	switch {
	case h.resting:
		poke(h.wake)
	case !h.up:
		s.p.Down = true
		s.poke()
	case h.missed(t, since):
		s.p.Refresh = true
		s.poke()
	}
	for _, k := range []string{t.key(), t.orderKey()} {
		if k == "" {
			continue
		}
		set := h.topics[k]
		if set == nil {
			set = map[*Subscription]struct{}{}
			h.topics[k] = set
		}
		set[s] = struct{}{}
	}
	h.n++
	return s, nil
}

// missed reports whether t may have missed an event after position since (h.mu held).
func (h *Hub) missed(t Topic, since string) bool {
	p, ok := parsePosition(since)
	if !ok || p.hub != h.nonce || p.gen != h.gen || p.seq > h.seq {
		return true
	}
	if h.seq-p.seq > ringSize {
		return true // older than the ring: cannot tell
	}
	for seq := p.seq + 1; seq <= h.seq; seq++ {
		if t.Shows(h.ring[seq%ringSize]) {
			return true
		}
	}
	return false
}

// remove ends s with err (h.mu held; idempotent).
func (h *Hub) remove(s *Subscription, err error) {
	if s.done {
		return
	}
	s.done, s.err = true, err
	close(s.wake)
	for _, k := range []string{s.topic.key(), s.topic.orderKey()} {
		if set := h.topics[k]; k != "" && set != nil {
			delete(set, s)
			if len(set) == 0 {
				delete(h.topics, k) // the map keeps no topic nobody watches
			}
		}
	}
	h.n--
	if h.n == 0 {
		poke(h.emptied)
	}
}

// poke leaves one wake-up in c (cap 1) if there is none yet.
func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// publish fans one event out to the subscriptions whose page shows it. It never waits on a
// subscriber: the listener must keep reading its connection.
func (h *Hub) publish(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	h.ring[h.seq%ringSize] = ev
	for _, k := range keys(ev) {
		for s := range h.topics[k] {
			s.tell(ev)
		}
	}
	if k := orderKey(ev); k != "" {
		for s := range h.topics[k] {
			if s.topic.Session != ev.Session { // its own session's event reached it above
				s.tell(ev)
			}
		}
	}
}

// tell folds ev into s's news (h.mu held).
func (s *Subscription) tell(ev Event) {
	s.p.Changes++
	s.p.Last = ev
	s.poke()
}

// setUp records a successful LISTEN: a new generation, and every subscriber refreshes once,
// because whatever happened while nobody listened was not heard.
func (h *Hub) setUp() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.up, h.resting = true, false
	h.gen++
	h.each(func(s *Subscription) { s.p.Down, s.p.Refresh = false, true })
}

// setDown records that the listener lost its connection (or, resting, could not get one back).
func (h *Hub) setDown() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.up && !h.resting {
		return
	}
	h.up, h.resting = false, false
	h.each(func(s *Subscription) { s.p.Down = true })
}

// rest stops listening by choice if no page is open (reported), so the listener can close its
// connection; a page opening afterwards wakes it (Subscribe).
func (h *Hub) rest() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n > 0 || h.closed {
		return false
	}
	h.up, h.resting = false, true
	return true
}

// watched reports whether a page is open.
func (h *Hub) watched() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n > 0
}

// each changes every subscription's news and pokes it (h.mu held).
func (h *Hub) each(f func(*Subscription)) {
	for _, set := range h.topics {
		for s := range set {
			f(s)
			s.poke()
		}
	}
}

// Close ends every subscription with ErrClosed and refuses new ones: the server calls it when
// shutdown starts, so that graceful shutdown does not wait for streams that never end by
// themselves. The listener (Run) stops with its context.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, set := range h.topics {
		for s := range set {
			h.remove(s, ErrClosed)
		}
	}
}

// Stats reports the subscriptions and the fan-out map's entries (tests: nothing is left behind).
func (h *Hub) Stats() (subscriptions, topics int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n, len(h.topics)
}

// Up reports whether the listener is well: listening, or resting while no page is open (it
// listens again as soon as one opens). False while it reconnects (pages poll meanwhile).
func (h *Hub) Up() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.up || h.resting
}

// Listening reports whether the listener holds its LISTEN connection right now.
func (h *Hub) Listening() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.up
}
