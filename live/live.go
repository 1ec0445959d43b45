// Package live keeps the console's pages up to date: PostgreSQL tells what changed (LISTEN on
// one channel, fed by the triggers of migrations/00330_live.sql), one listener per replica
// hears it on a direct connection of its own, and a Hub fans each change out, in process, to
// the browsers whose page shows it. The HTTP side (server-sent events) is in package handlers;
// this package knows nothing of HTTP.
//
// What reaches a browser is only "refresh": the page fetches its own fragment again, through
// the same handler, role check and read model as a full load, so a stream never carries data
// a page would not show. Bursts are coalesced per stream (at most one refresh per Debounce),
// and an idle stream costs no query: the listener waits on its socket and a stream's heartbeat
// is a comment written from memory.
//
// LISTEN needs a session of its own for as long as it listens; pgbouncer in transaction mode
// hands the server connection to other clients after each transaction, so the listener must
// connect directly to PostgreSQL (LISTEN_DATABASE_URL, defaulting to DATABASE_URL). NOTIFY
// itself is sent at commit by whoever wrote the row, through pgbouncer or not.
package live

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Channel is the one NOTIFY channel (the triggers' pg_notify names it too).
const Channel = "pitlane_live"

// Kind is what sort of row changed: the first argument of each trigger in 00330_live.sql.
type Kind string

const (
	KindSession    Kind = "session"    // payment_sessions: status, lease, flag, schedule
	KindCall       Kind = "call"       // gateway_calls: a call to the gateway was logged
	KindCancel     Kind = "cancel"     // cancel_challenges, reverse_operations, code_wrong_guesses (00680)
	KindRefund     Kind = "refund"     // refunds
	KindCase       Kind = "case"       // finance_cases
	KindResolution Kind = "resolution" // resolution_proposals
	KindLedger     Kind = "ledger"     // accounting_entries
	KindClaim      Kind = "claim"      // finance_check_claims ("Check now" in progress)
	KindPatrol     Kind = "patrol"     // sweeper_heartbeats: a replica's patrol (Event.Session is the replica)
)

// Event is one notification: which kind of row changed, for which session and order, and the
// session's status when the row is the session itself.
type Event struct {
	Kind    Kind   `json:"k"`
	Session string `json:"id,omitempty"`
	Order   string `json:"o,omitempty"`
	Status  string `json:"s,omitempty"`
}

// decode reads a notification's payload.
func decode(payload string) (Event, error) {
	var ev Event
	if err := json.Unmarshal([]byte(payload), &ev); err != nil {
		return Event{}, fmt.Errorf("live: decode notification %q: %w", payload, err)
	}
	if ev.Kind == "" {
		return Event{}, fmt.Errorf("live: notification %q names no kind", payload)
	}
	return ev, nil
}

// Page is a console page that updates itself.
type Page string

const (
	PageDashboard   Page = "dashboard"
	PagePayments    Page = "payments" // the list
	PagePayment     Page = "payment"  // one payment: Topic.Session names it
	PageLocks       Page = "locks"
	PageStuck       Page = "finance/stuck"
	PageCases       Page = "finance/cases"
	PageFlagged     Page = "finance/flagged"
	PageResolutions Page = "finance/resolutions"
	PageLedger      Page = "finance/ledger"
)

// pageKinds is THE table of which changes each page shows. A page listed for a kind refreshes
// on every event of it; the payment page only on events of its own session, and on orderKinds
// of its order's other sessions.
var pageKinds = map[Page][]Kind{
	PageDashboard:   {KindSession, KindCase, KindPatrol},
	PagePayments:    {KindSession},
	PagePayment:     {KindSession, KindCall, KindCancel, KindRefund, KindCase, KindResolution, KindLedger, KindClaim},
	PageLocks:       {KindSession}, // leases; advisory locks notify nothing (see docs/console.md)
	PageStuck:       {KindSession, KindCall, KindCase, KindResolution, KindClaim},
	PageCases:       {KindCase, KindSession},
	PageFlagged:     {KindSession, KindRefund},
	PageResolutions: {KindResolution, KindSession},
	PageLedger:      {KindLedger},
}

// orderKinds are the changes of the order's other sessions the payment page shows: the order's
// state ("Order … (Paid)" changes only with a session's transition) and its other sessions'
// states. Not their calls, codes or ledger lines, which the page does not show: a busy order
// has a few sessions, each changing a few times, so a page of a declined session refreshes
// when the customer tries again and pays, and not on unrelated traffic.
var orderKinds = []Kind{KindSession}

// kindPages inverts pageKinds: the pages an event of a kind may refresh.
var kindPages = func() map[Kind][]Page {
	m := map[Kind][]Page{}
	for p, kinds := range pageKinds {
		for _, k := range kinds {
			m[k] = append(m[k], p)
		}
	}
	for k := range m {
		slices.Sort(m[k])
	}
	return m
}()

// Topic is what one stream listens to: a page, and for the payment page its session and that
// session's order (the payment page shows the order's state and its other sessions; "" hears
// the session alone).
type Topic struct {
	Page    Page
	Session string
	Order   string
}

// Valid reports whether t names a known page (and the payment page a session).
func (t Topic) Valid() bool {
	_, ok := pageKinds[t.Page]
	return ok && (t.Page == PagePayment) == (t.Session != "") && (t.Order == "" || t.Page == PagePayment)
}

// key is the topic's entry in the hub's fan-out map.
func (t Topic) key() string {
	if t.Page == PagePayment {
		return string(PagePayment) + ":" + t.Session
	}
	return string(t.Page)
}

// orderKey is the fan-out entry of a payment page's order ("" without one): the topic is
// reached by its own session's events through key and by its order's through this one.
func (t Topic) orderKey() string {
	if t.Page != PagePayment || t.Order == "" {
		return ""
	}
	return "order:" + t.Order
}

// Shows reports whether the page of t shows what ev changed.
func (t Topic) Shows(ev Event) bool {
	if t.Page == PagePayment && ev.Session != t.Session {
		return t.Order != "" && ev.Order == t.Order && slices.Contains(orderKinds, ev.Kind)
	}
	return slices.Contains(pageKinds[t.Page], ev.Kind)
}

// keys are the fan-out entries an event reaches.
func keys(ev Event) []string {
	pages := kindPages[ev.Kind]
	out := make([]string, 0, len(pages))
	for _, p := range pages {
		t := Topic{Page: p}
		if p == PagePayment {
			if ev.Session == "" {
				continue
			}
			t.Session = ev.Session
		}
		out = append(out, t.key())
	}
	return out
}

// orderKey is the fan-out entry of the payment pages of ev's order that ev may refresh ("" when
// none may: a kind they do not show of another session, or no order in the payload).
func orderKey(ev Event) string {
	if ev.Order == "" || !slices.Contains(orderKinds, ev.Kind) {
		return ""
	}
	return Topic{Page: PagePayment, Order: ev.Order}.orderKey()
}
