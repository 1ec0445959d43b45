package live

import (
	"sync"
	"time"
)

// Timers is where streams get their time: the real clock in production, a hand-driven one in
// tests (heartbeats and the debounce window without sleeping).
type Timers interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
	// Tick returns a channel that delivers every d, and a func that stops it.
	Tick(d time.Duration) (<-chan time.Time, func())
}

type realTimers struct{}

func (realTimers) Now() time.Time                         { return time.Now() }
func (realTimers) After(d time.Duration) <-chan time.Time { return time.After(d) }
func (realTimers) Tick(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// ManualTimers is Timers moved by hand (tests of this package and of the HTTP side): After
// fires when Advance passes its time; every Tick channel is one shared channel that Beat feeds.
type ManualTimers struct {
	mu     sync.Mutex
	now    time.Time
	afters []manualAfter
	beat   chan time.Time
}

type manualAfter struct {
	at time.Time
	c  chan time.Time
}

// NewManualTimers starts the clock at t.
func NewManualTimers(t time.Time) *ManualTimers {
	return &ManualTimers{now: t, beat: make(chan time.Time)}
}

func (m *ManualTimers) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

func (m *ManualTimers) After(d time.Duration) <-chan time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := make(chan time.Time, 1)
	m.afters = append(m.afters, manualAfter{at: m.now.Add(d), c: c})
	return c
}

func (m *ManualTimers) Tick(time.Duration) (<-chan time.Time, func()) { return m.beat, func() {} }

// Beat delivers one tick to one stream waiting for it (it waits until a stream takes it).
func (m *ManualTimers) Beat() { m.beat <- m.Now() }

// Advance moves the clock by d and fires the After timers now due.
func (m *ManualTimers) Advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = m.now.Add(d)
	kept := m.afters[:0]
	for _, a := range m.afters {
		if !a.at.After(m.now) {
			a.c <- m.now
		} else {
			kept = append(kept, a)
		}
	}
	m.afters = kept
}

// Armed reports how many After timers wait to fire.
func (m *ManualTimers) Armed() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.afters)
}
