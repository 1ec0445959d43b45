package handlers

import (
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// Checkout serves the customer's pages of an order (no staff sign-in; CSRF by cookie):
//
//	GET  /checkout/:order_id?amount=1999&currency=EUR&exp=…&gen=…&gsig=…&sig=…   the order's state; Pay when payable
//	POST /checkout/:order_id                                  one Pay click (intent key in the form)
//	GET  /checkout/:order_id/return                           back from the gateway: Check, show the result
//
// The shop links customers to the first with a signed checkout link (payments/checkout_link.go,
// made by POST /api/v1/orders/{order_id}/checkout-links): the amount and currency in the URL are
// what the customer could edit, so the page offers them only under a valid sig, and the Pay
// click is verified again. Without a link, an order with earlier payments offers its last
// payment's amount and currency (a retry after a decline) while the links that priced the order
// are valid (payments.CheckoutRetry). The gateway sends customers back to
// the order's page (ReturnURL: PUBLIC_BASE_URL + /checkout/{order_id}) or to /return; both ask
// the gateway about an active session before showing it.
type Checkout struct {
	svc        *payments.Service
	staleAfter time.Duration
	merchant   string
	log        *slog.Logger
}

// NewCheckout builds the checkout handlers; idem.StaleAfter bounds how long one Pay click may
// hold its intent key (zero: the default); merchant is the name every page shows the customer
// (MERCHANT_NAME; "" gives DefaultMerchantName).
func NewCheckout(svc *payments.Service, idem payments.IdempotencyConfig, merchant string, log *slog.Logger) *Checkout {
	if log == nil {
		log = slog.Default()
	}
	return &Checkout{svc: svc, staleAfter: idem.StaleAfter, merchant: MerchantName(merchant), log: log}
}

// DefaultMerchantName is shown when no merchant name is configured (only reachable by building
// the server without one: cmd always passes one).
const DefaultMerchantName = "pitlane"

// MerchantName is the name the checkout shows for merchant ("" → DefaultMerchantName).
func MerchantName(merchant string) string {
	if merchant == "" {
		return DefaultMerchantName
	}
	return merchant
}

// view starts a page of the order.
func (h *Checkout) view(orderID, state string) views.CheckoutView {
	return views.CheckoutView{Merchant: h.merchant, OrderID: orderID, State: state}
}

// render answers a checkout page. A waiting page looks again by itself through the Refresh
// header rather than <meta http-equiv="refresh">: browsers treat both alike, and the page
// carries its own off switch (CheckoutUpdates), which the accessibility checkers' meta-refresh
// rule cannot see. Every checkout answer is per order and changes any moment: never cached.
func (h *Checkout) render(c echo.Context, status int, v views.CheckoutView) error {
	hdr := c.Response().Header()
	hdr.Set("Cache-Control", "no-store")
	if u := v.Updates; u.Waiting() && !u.Off {
		hdr.Set("Refresh", strconv.Itoa(u.RefreshSeconds())+"; url="+u.Next)
	}
	return render.HTML(c, status, views.Checkout(v))
}

// customer is the actor of every change the checkout causes.
var customer = payments.Actor{Kind: payments.ActorCustomer, ID: "checkout"}

func (h *Checkout) orderID(c echo.Context) (string, error) {
	id := payments.CheckoutPathOrderID(PathParam(c, "order_id")) // "." and ".." arrive as "~." and "~.." (payments.CheckoutPath)
	if !payments.ValidOrderID(id) {
		return "", notFound("order")
	}
	return id, nil
}

// Page: GET /checkout/:order_id[?amount=&currency=&exp=&gen=&gsig=&sig=][&view=…][&contact=][&intent=…].
func (h *Checkout) Page(c echo.Context) error {
	id, err := h.orderID(c)
	if err != nil {
		return err
	}
	if ok, err := h.mayView(c, id); !ok {
		return err
	}
	if key := c.QueryParam("intent"); key != "" {
		if done, err := h.followIntent(c, id, key); done || err != nil {
			return err
		}
	}
	return h.show(c, c.QueryParams(), id, false, http.StatusOK, "")
}

// Return: GET /checkout/:order_id/return, the gateway's way back.
func (h *Checkout) Return(c echo.Context) error {
	id, err := h.orderID(c)
	if err != nil {
		return err
	}
	if ok, err := h.mayView(c, id); !ok {
		return err
	}
	return h.show(c, c.QueryParams(), id, true, http.StatusOK, "")
}

// namesALink reports whether a URL's query carries any part of a checkout link: it is then
// judged as a link (verified, or refused as changed), never as the order's plain page.
func namesALink(q url.Values) bool {
	return q.Has("amount") || q.Has("currency") || q.Has("sig") || q.Has("exp") || q.Has("gen") || q.Has("gsig")
}

// mayView says whether the request may see the order's page (payments.OrderPageToken): with a
// genuine checkout link of the order in the URL (an expired one too: the customer had it) or
// with the order's page token. A link that does not verify gets the bad-link page, which shows
// nothing of the order; no link and no token, the answer for an order that does not exist — a
// guessed order id learns neither whether it is paid nor its amount, and starts nothing.
func (h *Checkout) mayView(c echo.Context, orderID string) (bool, error) {
	q := c.QueryParams()
	if namesALink(q) {
		_, err := h.verifiedOffer(orderID, q)
		if err == nil || payments.ErrorCode(err) == payments.EEXPIRED {
			return true, nil
		}
		return false, h.refuse(c, orderID, err)
	}
	if h.svc.VerifyOrderPageToken(orderID, q.Get(payments.OrderPageParam)) {
		return true, nil
	}
	return false, notFound("order")
}

// followIntent is the page a Pay click lands on when it could not go straight to the gateway:
// its first request was still running (a double click), or the answer is not in yet. When the
// click's session has a payment page, go there; while it is being prepared, look again soon.
func (h *Checkout) followIntent(c echo.Context, orderID, key string) (bool, error) {
	ctx := c.Request().Context()
	it, err := h.svc.GetCheckoutIntent(ctx, key)
	if err != nil || it.OrderID != orderID {
		return false, nil // a stale or foreign key: just show the order
	}
	if it.InFlight(h.svc.Now()) {
		v := h.view(orderID, views.CheckoutConfirming)
		v.Amount, v.Currency = it.Amount, it.Currency
		v.Updates = updates(c.Request().URL)
		return true, h.render(c, http.StatusOK, v)
	}
	if it.SessionID == "" {
		return false, nil
	}
	sess, err := h.svc.Get(ctx, it.SessionID)
	if err != nil {
		return false, err
	}
	if bank, err := h.toBank(c, sess); err != nil || bank {
		return true, err
	}
	return false, nil // the page says why not
}

// toBank sends the customer to the session's page at the bank (303) and reports true when the
// customer may pay there: the session is Registered, its page is one we send customers to, and
// the gateway holds no money of the order that finance is checking (PaymentInReview). Otherwise
// it does nothing: the order's page says where the payment is (in review, confirming). The
// click's follow-up page and a resubmitted click answer from here, not from show: they sent a
// customer to a payment's page at the bank while the order's page refused the way there.
func (h *Checkout) toBank(c echo.Context, s payments.Session) (bool, error) {
	if s.Status != payments.StatusRegistered || !h.svc.TrustedConfirmationURL(s.ConfirmationURL) {
		return false, nil
	}
	if inReview, err := h.svc.PaymentInReview(c.Request().Context(), s.OrderID); err != nil || inReview {
		return false, err
	}
	return true, c.Redirect(http.StatusSeeOther, s.ConfirmationURL)
}

// show renders the order's state. q is what the page was opened with: a checkout link's parts
// and the contact prefill (a GET's query; for a refused Pay click, the form's link when it was
// genuine, so the answer is the link's page and never a bad link). check: have the gateway asked
// about the active session first (always on return; on the plain page unless the session is
// still being registered) — at most once per payments.PageLookEvery for the session, whoever
// loads the page how often (CheckFromPage); in between the page shows what the database knows.
func (h *Checkout) show(c echo.Context, q url.Values, orderID string, check bool, status int, notice string) error {
	ctx := c.Request().Context()
	order, sessions, err := h.svc.GetOrder(ctx, orderID)
	if err != nil && payments.ErrorCode(err) != payments.ENOTFOUND {
		return err
	}
	active := findSession(sessions, order.ActiveSessionID)
	// stale: the page could not hear the gateway's word about the session (its look was taken
	// less than payments.PageLookEvery ago — the page the customer left for the bank, say — or
	// the gateway did not answer). The database's Registered would then say "not charged yet"
	// about a payment the customer may have just approved — on the return page, and on the
	// order's own page, which is where the gateway's return URL sends customers; the page waits
	// instead, and looks again when the gateway may next be asked (staleUntil).
	var (
		stale      bool
		staleUntil time.Time
	)
	if active != nil && (check || active.Status != payments.StatusRegistering) {
		look, cerr := h.svc.CheckFromPage(ctx, customer, active.ID)
		if cerr != nil {
			if payments.ErrorCode(cerr) == payments.EINTERNAL {
				return cerr
			}
			if notice == "" {
				notice = "We could not reach the bank just now; this page will look again."
			}
		}
		stale, staleUntil = !look.Asked || cerr != nil, look.Next
		if order, sessions, err = h.svc.GetOrder(ctx, orderID); err != nil {
			return err
		}
		active = findSession(sessions, order.ActiveSessionID)
	}
	v := h.view(orderID, "")
	v.Notice = notice
	v.View = h.svc.OrderPageToken(orderID) // the retry form's: the Pay click may see the page too
	switch {
	case order.Status == payments.OrderPaid:
		v.State, v.Session = views.CheckoutPaid, findSession(sessions, order.PaidSessionID)
	case active != nil:
		v.Session = active
		inReview := false
		if active.Status == payments.StatusRegistered {
			// No way to the bank's page while finance checks money the gateway may hold for the
			// order (PaymentInReview: a late payment reported after this one began, or this
			// one's answer for another amount): this payment would be a second charge (Pay
			// clicks are refused alike).
			var err error
			if inReview, err = h.svc.PaymentInReview(ctx, orderID); err != nil {
				return err
			}
		}
		switch {
		case inReview:
			v.State = views.CheckoutInReview
		case active.Status == payments.StatusRegistered && stale:
			// Back from the gateway before it may be asked again: "confirming", looking again at
			// the order's page as soon as it may ask (which then shows the payment's end, or the
			// way back to the gateway's page if the customer did not pay there).
			v.State, v.Updates = views.CheckoutConfirming, h.selfUpdatesAt(c, orderID, staleUntil)
		case active.Status == payments.StatusRegistered && h.svc.TrustedConfirmationURL(active.ConfirmationURL):
			v.State = views.CheckoutContinue
		case active.Status == payments.StatusCanceling:
			v.State, v.Updates = views.CheckoutCanceling, h.selfUpdates(c, orderID)
		default: // Registering, Unknown, Authorized: the gateway's word is awaited
			v.State, v.Updates = views.CheckoutConfirming, h.selfUpdates(c, orderID)
		}
	default:
		var latest *payments.Session
		if len(sessions) > 0 {
			latest = &sessions[len(sessions)-1]
			v.Session = latest
		}
		if latest != nil && (latest.Status == payments.StatusFailed || latest.Status == payments.StatusCanceled) {
			inReview, err := h.svc.PaymentInReview(ctx, orderID)
			if err != nil {
				return err
			}
			if inReview { // the gateway may hold this customer's money: no "try again"
				v.State = views.CheckoutInReview
				break
			}
		}
		pay, err := h.payable(c, q, orderID, latest)
		switch code := payments.ErrorCode(err); {
		case err == nil:
			v.State = afterLatest(latest)
			v.Amount, v.Currency, v.Sig, v.Expires, v.Intent = pay.amount, pay.currency, pay.sig, pay.exp, uuid.NewString()
			v.Generation, v.GenSig = pay.gen, pay.gsig
			v.Contact = strings.TrimSpace(q.Get("contact"))
			if payments.ValidateContact(v.Contact) != nil {
				v.Contact = "" // a prefill the Pay form would refuse: the customer types their own
			}
		case code == payments.EINTERNAL || code == payments.EUNAVAIL:
			return err // the database's trouble, not the link's: the error page, 503 when it passes
		case errors.Is(err, payments.ErrNoCheckoutRetry):
			// No link ever priced the order (the shop paid it over the API): its story, without
			// a form (no Intent); the state says to go back to the shop.
			v.State = afterLatest(latest)
		default:
			v.State, status = refusedLink(err, status)
		}
	}
	// The summary's amount is the session's where the page shows one; a refused link names none
	// (not even the last payment's: the customer followed a link for another amount).
	if v.Currency == "" && v.Session != nil && v.State != views.CheckoutBadLink && v.State != views.CheckoutExpired && v.State != views.CheckoutReplaced {
		v.Amount, v.Currency = v.Session.Amount, v.Session.Currency
	}
	return h.render(c, status, v)
}

// afterLatest is the state of an order with no active session that may be paid: its last
// payment's end tells the story (declined → try again, canceled → pay again), or nothing was
// tried yet.
func afterLatest(latest *payments.Session) string {
	switch {
	case latest == nil:
		return views.CheckoutPay
	case latest.Status == payments.StatusFailed:
		return views.CheckoutDeclined
	case latest.Status == payments.StatusCanceled:
		return views.CheckoutCanceled
	}
	return views.CheckoutPay
}

// payOffer is what a Pay form pays: an amount and currency, and the link's sig and exp that
// signed them ("" and 0 for the retry of the order's last payment).
type payOffer struct {
	amount   int64
	currency string
	sig      string
	exp      int64
	gen      int64  // the link's price generation (payments.NoLinkGeneration: a link without one)
	gsig     string // its signature with the generation
}

// payable is what the Pay form may offer for an order with no active session: the amount and
// currency of the checkout link in q whose signature matches and that has not expired (and its
// sig and exp, for the form to carry), or, when q names no link at all, the order's last
// payment's (latest, nil when none) while the links that priced the order are valid
// (payments.CheckoutRetry: EEXPIRED after them, ErrNoCheckoutRetry when no link ever priced
// it). A link that does not verify is never replaced by the last payment's amount: the
// customer would see another amount than the link they followed, and a changed link is worth
// saying so. The error is VerifyCheckoutLink's (EEXPIRED: an expired link), EINVALID,
// CheckoutRetry's, or payments.ErrLinkReplaced when the shop has made a newer link for another
// amount or currency (the order's checkout price).
func (h *Checkout) payable(c echo.Context, q url.Values, orderID string, latest *payments.Session) (payOffer, error) {
	var offer payOffer
	switch {
	case namesALink(q):
		var err error
		if offer, err = h.verifiedOffer(orderID, q); err != nil {
			return payOffer{}, err
		}
	case latest != nil:
		// The page's retry, with the order's page token only: held to the links' time, and to
		// the order's checkout price (ErrLinkReplaced), by CheckoutRetry.
		if err := h.svc.CheckoutRetry(c.Request().Context(), orderID, latest.Amount, latest.Currency); err != nil {
			return payOffer{}, err
		}
		return payOffer{amount: latest.Amount, currency: latest.Currency}, nil
	default:
		return payOffer{}, payments.Invalid("sig", "this payment link is incomplete")
	}
	// A genuine offer the shop has replaced since (a newer link for another amount, or for the
	// same amount after another price between): the Pay click's claim would refuse it, so the
	// page offers nothing and says why.
	price, priced, err := h.svc.CheckoutPrice(c.Request().Context(), orderID)
	switch {
	case err != nil:
		return payOffer{}, err
	case priced && price.Replaces(offer.amount, offer.currency, offer.gen):
		return payOffer{}, payments.ErrLinkReplaced
	}
	return offer, nil
}

// verifiedOffer parses a link's parts as a browser sent them (a URL's query or a Pay form:
// amount, currency, exp, gen and gsig — absent in links made before generations — and sig) and
// verifies them.
func (h *Checkout) verifiedOffer(orderID string, q url.Values) (payOffer, error) {
	n, ok := parseMinorAmount(q.Get("amount"))
	e, err := strconv.ParseInt(q.Get("exp"), 10, 64)
	gen, gerr := payments.CheckoutLinkGeneration(q)
	if !ok || err != nil || gerr != nil {
		return payOffer{}, payments.Invalid("sig", "this payment link is incomplete or was changed")
	}
	cur, sig, gsig := strings.ToUpper(q.Get("currency")), q.Get("sig"), q.Get("gsig")
	if err := h.svc.VerifyCheckoutLink(orderID, n, cur, e, gen, sig, gsig); err != nil {
		return payOffer{}, err
	}
	return payOffer{amount: n, currency: cur, sig: sig, exp: e, gen: gen, gsig: gsig}, nil
}

// refusedLink is the page state and status for a link that pays nothing: expired → 410 (the
// link was genuine, its time is up), replaced by a newer link for another amount → 409,
// anything else → 400 (incomplete or changed). A status other
// than 200 chosen by the caller (a refused Pay POST) is kept.
func refusedLink(err error, status int) (string, int) {
	state, refused := views.CheckoutBadLink, http.StatusBadRequest
	switch {
	case payments.ErrorCode(err) == payments.EEXPIRED:
		state, refused = views.CheckoutExpired, http.StatusGone
	case errors.Is(err, payments.ErrLinkReplaced):
		state, refused = views.CheckoutReplaced, http.StatusConflict
	}
	if status == http.StatusOK {
		status = refused
	}
	return state, status
}

// lookParam counts, in the URL a waiting page refreshes to, how often it has looked already;
// autoParam=off (autoOff) is the customer's "stop updating this page".
const (
	lookParam = "look"
	autoParam = "auto"
	autoOff   = "off"
)

// maxRefreshAfter caps the waiting page's refresh interval.
const maxRefreshAfter = 30 * time.Second

// nextLook is where and when a waiting page looks again: the same URL with its look count one
// higher, after an interval that doubles with each look (1 s, 2 s, 4 s … up to 30 s). A customer
// who leaves the page open costs a few requests a minute, not one a second; the gateway is asked
// at most every payments.PageLookEvery anyway.
func nextLook(cur *url.URL) (string, time.Duration) {
	q := cur.Query()
	n, err := strconv.Atoi(q.Get(lookParam))
	if err != nil || n < 0 {
		n = 0
	}
	n = min(n, 10)
	after := min(time.Second<<n, maxRefreshAfter)
	q.Set(lookParam, strconv.Itoa(n+1))
	u := *cur
	u.RawQuery = q.Encode()
	return u.RequestURI(), after
}

// LookAgain is how a customer's page whose look met a passing failure (a 503: the database
// away for a moment) looks again by itself, as a waiting page does (updates): back (the look's
// own path and query) with its look count one higher, after nextLook's interval, and the link
// that stops it. Without it a waiting page that met one 503 stopped updating for good. Nothing
// when the customer turned updates off (auto=off) or back is not a path.
func LookAgain(back string) (views.CheckoutUpdates, bool) {
	u, err := url.Parse(back)
	if err != nil || u.Path == "" || u.Host != "" || u.Scheme != "" || u.Query().Get(autoParam) == autoOff {
		return views.CheckoutUpdates{}, false
	}
	return updates(u), true
}

// updates is how the waiting page at cur looks again: by itself (nextLook), or, once the
// customer turned that off (auto=off), only when they click "Check now".
func updates(cur *url.URL) views.CheckoutUpdates {
	q := cur.Query()
	if q.Get(autoParam) == autoOff {
		q.Del(autoParam)
		on := *cur
		on.RawQuery = q.Encode()
		return views.CheckoutUpdates{Next: cur.RequestURI(), Off: true, Toggle: on.RequestURI()}
	}
	next, after := nextLook(cur)
	q.Del(lookParam)
	q.Set(autoParam, autoOff)
	off := *cur
	off.RawQuery = q.Encode()
	return views.CheckoutUpdates{Next: next, After: after, Toggle: off.RequestURI()}
}

// selfUpdates are the updates of the order's own page: also from /return, the page looks
// again at the order's plain URL, carrying only the look count and the off switch of the current
// URL (not a link's amount or the customer's contact).
func (h *Checkout) selfUpdates(c echo.Context, orderID string) views.CheckoutUpdates {
	q := url.Values{}
	for _, k := range []string{lookParam, autoParam} {
		if v := c.QueryParam(k); v != "" {
			q.Set(k, v)
		}
	}
	if tok := h.svc.OrderPageToken(orderID); tok != "" {
		q.Set(payments.OrderPageParam, tok) // a page opened by its link looks again without it
	}
	u, err := url.Parse(payments.CheckoutPath(orderID)) // an escaped path: Path and RawPath agree
	if err != nil {
		u = &url.URL{Path: "/checkout/" + orderID}
	}
	u.RawQuery = q.Encode()
	return updates(u)
}

// selfUpdatesAt are selfUpdates whose next look is when the gateway may next be asked (at), not
// earlier (it would find no turn, and wait again) and at least a second away.
func (h *Checkout) selfUpdatesAt(c echo.Context, orderID string, at time.Time) views.CheckoutUpdates {
	u := h.selfUpdates(c, orderID)
	if !u.Off {
		wait := (at.Sub(h.svc.Now()) + time.Second - 1).Truncate(time.Second) // Refresh counts whole seconds
		u.After = min(max(wait, u.After, time.Second), maxRefreshAfter)       // not before the gateway's turn, nor before the look's back-off
	}
	return u
}

func findSession(sessions []payments.Session, id string) *payments.Session {
	if id == "" {
		return nil
	}
	for i := range sessions {
		if sessions[i].ID == id {
			return &sessions[i]
		}
	}
	return nil
}
