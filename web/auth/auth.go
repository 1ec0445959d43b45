// Package auth is the console's sign-in machinery: server-side sessions in PostgreSQL (scs with
// pgxstore, so every replica behind the balancer shares them), CSRF tokens for every form, and
// the role check in front of each page. It is separate from package web so that the handlers
// (which web's routes import) can sign people in and out.
package auth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/alexedwards/scs/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/views"
)

// Session keys.
const (
	keyEmail      = "email"
	keyEpoch      = "epoch" // the user's session epoch at sign-in (access.User.SessionEpoch)
	keyCSRF       = "csrf"
	keyFlash      = "flash"
	keyFlashError = "flash_error"
	keySeen       = "seen" // unix seconds of the user's last request of their own (idle timeout)
	// keyHostOnly marks a session signed in by a replica that writes the __Host- cookie: the
	// unprefixed cookie never brings it in (Sessions).
	keyHostOnly = "host_only"
)

// Cookie names. Served over https (Config.Secure), both carry the __Host- prefix
// (HostSessionCookie, HostCSRFCookie): a browser then takes them only from this exact host, with
// Secure and Path=/ and no Domain, so a page on a sibling or parent domain cannot plant a session
// or a CSRF seed of its own choosing. Over plain http (dev) the prefix is not allowed.
//
// Rolling out the prefix without signing everyone out (this release): a replica reads the
// prefixed cookie and, without it, the unprefixed one (set by replicas before this release); it
// writes both, with the same value, so replicas on either side of a rolling deploy read the same
// session. The next release stops reading and writing the unprefixed names.
const (
	SessionCookie = "pitlane_session"
	// CSRFCookie binds the CSRF token of visitors without a session (sign-in page, checkout).
	CSRFCookie = "pitlane_csrf"
	// HostPrefix is the cookie name prefix browsers bind to the exact host (RFC 6265bis).
	HostPrefix        = "__Host-"
	HostSessionCookie = HostPrefix + SessionCookie
	HostCSRFCookie    = HostPrefix + CSRFCookie
	// DeviceCookie keeps a browser's device token (access.RememberDevice): its sign-ins to the
	// account it signed in to before skip the throttle's address and global buckets. The
	// __Host- prefix over https, like the others; new, so it has no unprefixed past.
	DeviceCookie     = "pitlane_device"
	HostDeviceCookie = HostPrefix + DeviceCookie
)

// SessionLifetime is how long a sign-in lasts (a working day); the cookie itself dies with the
// browser.
const SessionLifetime = 12 * time.Hour

// DefaultIdleTimeout signs a staff user out after half an hour without a request of their own
// (CONSOLE_IDLE_TIMEOUT). A live page refreshing itself is not the user's request: a console
// left open on a desk stops showing payments and stops accepting actions.
const DefaultIdleTimeout = 30 * time.Minute

// seenEvery: the time of the user's last request is written to the session at most this often,
// not on every request (each write is a row update of the sessions table), and at most a 30th
// of the idle timeout apart (seenStep). The timeout is thus judged up to one step (and the
// stamp's whole second) early, never late: with a 1-minute timeout a minute-long step signed
// out a user active every 30 s.
const seenEvery = time.Minute

// seenStep is how often the idle stamp is written: seenEvery, or a 30th of the timeout when
// that is shorter (2 s at the shortest timeout, 1 minute).
func (m *Manager) seenStep() time.Duration { return min(seenEvery, m.idle/30) }

// Config is what the manager needs.
type Config struct {
	// DB holds the sessions table (required).
	DB *pgxpool.Pool
	// Access holds the staff users (required).
	Access *access.Service
	// Secret keys the CSRF tokens of visitors without a session (the same on every replica).
	Secret []byte
	// SecretFallbacks (SECRET_KEY_FALLBACKS) still verify those tokens and sign none: a form
	// rendered by a replica on the other side of a SECRET_KEY rotation posts fine.
	SecretFallbacks [][]byte
	// Secure marks cookies Secure (set it when the console is served over https).
	Secure bool
	Logger *slog.Logger
	// IdleTimeout (CONSOLE_IDLE_TIMEOUT) ends a session after this long without a request of
	// the user's own; 0: DefaultIdleTimeout. A session still ends SessionLifetime after sign-in.
	IdleTimeout time.Duration
	// Now is the idle timeout's clock (nil: time.Now): serve passes the database's
	// (payments.DatabaseClock), as the idle stamp one replica writes another reads; tests move
	// it. The session's lifetime and its store expiry are scs's, on the host's clock (scs takes
	// no clock), compared by the store with the database's now(): a host clock off by S moves
	// the 12-hour lifetime and the 5-minute sign-out message by S.
	Now func() time.Time
}

// Manager is the console's sessions, CSRF protection and role checks.
type Manager struct {
	sm        *scs.SessionManager
	db        *pgxpool.Pool
	access    *access.Service
	secret    []byte
	fallbacks [][]byte
	secure    bool
	// The cookies' names: the __Host- ones over https. legacy: the unprefixed ones (SessionCookie,
	// CSRFCookie) are still read and written beside them during the rollout (over http they are
	// the names).
	sessionName, csrfName string
	legacy                bool
	log                   *slog.Logger
	idle                  time.Duration
	now                   func() time.Time
}

// New builds the manager.
func New(cfg Config) *Manager {
	m := &Manager{db: cfg.DB, access: cfg.Access, secret: cfg.Secret, fallbacks: cfg.SecretFallbacks, secure: cfg.Secure, log: cfg.Logger,
		idle: cfg.IdleTimeout, now: cfg.Now}
	if m.log == nil {
		m.log = slog.Default()
	}
	if m.idle <= 0 {
		m.idle = DefaultIdleTimeout
	}
	if m.now == nil {
		m.now = time.Now
	}
	m.sessionName, m.csrfName = SessionCookie, CSRFCookie
	if m.secure {
		m.sessionName, m.csrfName = HostSessionCookie, HostCSRFCookie
		m.legacy = true
	}
	if len(m.secret) == 0 {
		// Without a configured secret CSRF tokens of anonymous visitors are still unguessable
		// per process; they just do not survive a restart or a hop to another replica.
		m.secret = make([]byte, 32)
		_, _ = rand.Read(m.secret)
	}
	// Built by hand rather than with scs.New(): New installs an in-memory store whose cleanup
	// goroutine would run forever beside the PostgreSQL store we use (hashedStore: pgxstore's
	// table, without its cleanup goroutine); SignIn deletes expired rows instead
	// (ReapSessions): this package owns the store, so it owns its reaper.
	m.sm = &scs.SessionManager{
		Lifetime: SessionLifetime,
		Store:    hashedStore{db: cfg.DB},
		Codec:    scs.GobCodec{},
		ErrorFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			m.log.Error("session", "err", err)
			http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		},
		Cookie: scs.SessionCookie{
			Name:     m.sessionName,
			HttpOnly: true,
			Path:     "/",
			SameSite: http.SameSiteLaxMode,
			Secure:   cfg.Secure,
			Persist:  false,
		},
	}
	return m
}

// Sessions loads the visitor's session (when their browser sent a session cookie) and saves
// it just before the response is written, also when a handler failed and the error handler
// writes the page.
func (m *Manager) Sessions() echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req := c.Request()
			c.Response().Header().Add("Vary", "Cookie")
			var token string
			migrate := false
			if ck, err := req.Cookie(m.sessionName); err == nil {
				token = ck.Value
			} else if m.legacy {
				if ck, err := req.Cookie(SessionCookie); err == nil {
					token, migrate = ck.Value, true // signed in on a replica before this release
				}
			}
			ctx, err := m.sm.Load(req.Context(), token)
			if err != nil {
				return fmt.Errorf("load session: %w", err)
			}
			if migrate && m.sm.GetBool(ctx, keyHostOnly) {
				// A session of this release through the unprefixed cookie alone: a page on a
				// sibling subdomain can plant that cookie (Domain=), with the token of the
				// attacker's own session, in a browser without the __Host- one, which then
				// worked as the attacker's account (an outside review). Only a session signed
				// in on a replica before this release (no mark) comes in that way.
				if ctx, err = m.sm.Load(req.Context(), ""); err != nil {
					return fmt.Errorf("load session: %w", err)
				}
				migrate = false
			}
			c.SetRequest(req.WithContext(ctx))
			loaded := m.sm.Token(ctx) // "" when the store had no such session
			c.Response().Before(func() { m.save(c, migrate, loaded) })
			return next(c)
		}
	}
}

// save commits a changed session and writes its cookie (the work scs's LoadAndSave does).
// migrate: the session came in under the unprefixed cookie only; its prefixed one is written
// even when nothing changed. loaded: the token the request's session was loaded under ("" for
// none); committed under that same token, the session is only updated (hashedStore.CommitCtx),
// and if it was ended meanwhile nothing is stored and no cookie is written.
//
// The commit outlives the request by SaveGrace: a handler that succeeded just past the request's
// bound (a sign-in whose reaping waited) answers its success, and a renewal whose old row is
// already deleted must store the new one, or the answer says "done" and the browser is signed
// out (an outside review).
func (m *Manager) save(c echo.Context, migrate bool, loaded string) {
	ctx := c.Request().Context()
	w := c.Response().Writer
	switch m.sm.Status(ctx) {
	case scs.Modified:
		cctx, cancel := payments.Outlive(ctx, SaveGrace)
		defer cancel()
		if loaded != "" && m.sm.Token(ctx) == loaded {
			cctx = context.WithValue(cctx, existingOnlyKey{}, true)
		}
		token, expiry, err := m.sm.Commit(cctx)
		if errors.Is(err, errSessionEnded) {
			return // signed out (or renewed) in another request meanwhile: it stays ended
		}
		if err != nil {
			m.log.Error("save session", "err", err)
			return
		}
		m.writeSessionCookie(ctx, w, token, expiry)
	case scs.Destroyed:
		m.writeSessionCookie(ctx, w, "", time.Time{})
	case scs.Unmodified:
		if token := m.sm.Token(ctx); migrate && token != "" {
			m.sm.WriteSessionCookie(ctx, w, token, m.now().Add(SessionLifetime)) // not persisted: ends with the browser
		}
	}
}

// writeSessionCookie writes the session cookie, and during the __Host- rollout the unprefixed
// one with the same token beside it (a replica before this release reads only that one).
func (m *Manager) writeSessionCookie(ctx context.Context, w http.ResponseWriter, token string, expiry time.Time) {
	m.sm.WriteSessionCookie(ctx, w, token, expiry)
	if !m.legacy {
		return
	}
	ck := &http.Cookie{Name: SessionCookie, Value: token, Path: "/", HttpOnly: true, Secure: true, SameSite: http.SameSiteLaxMode}
	if expiry.IsZero() {
		ck.MaxAge = -1
	}
	http.SetCookie(w, ck)
}

// signedInEmail is the email of the session's staff user, "" when nobody is signed in.
func (m *Manager) signedInEmail(ctx context.Context) string {
	return m.sm.GetString(ctx, keyEmail)
}

// CSRF protects every unsafe request (POST, …) outside /api/ and /webhooks/ with a token that
// the page's forms carry in a hidden field and htmx sends in the X-CSRF-Token header. The token
// is per session for signed-in staff (stored in the session, new at every sign-in), and bound
// to a random cookie for everyone else (HMAC of the cookie under the server secret): the
// sign-in form and the customer's checkout need no session. It puts the token in the request
// context for the views (views.Viewer).
func (m *Manager) CSRF() echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req := c.Request()
			if strings.HasPrefix(req.URL.Path, "/api/") || strings.HasPrefix(req.URL.Path, "/webhooks/") {
				return next(c)
			}
			token := m.csrfToken(c)
			c.SetRequest(req.WithContext(views.WithViewer(req.Context(), views.Viewer{CSRF: token})))
			switch req.Method {
			case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
				return next(c)
			}
			// A browser that says the request comes from another site (Sec-Fetch-Site, sent by
			// every current browser) is refused before the token is looked at: a second layer
			// that holds even if a token leaked. No form of ours posts from another site (the
			// gateway sends the customer back with a GET). A page on a sibling subdomain is
			// another site too (same-site), as for the GETs that write (web.go): it can plant
			// the unprefixed CSRF seed of the __Host- rollout in a browser that holds no
			// __Host- one yet (a fresh or restarted browser), and then post the sign-in form
			// with the token of the seed it chose — the victim signed in as the attacker (an
			// outside review).
			if sfs := req.Header.Get("Sec-Fetch-Site"); sfs == "cross-site" || sfs == "same-site" {
				return payments.Errorf(payments.EFORBIDDEN,
					"This form was sent from another site (CSRF check failed). Open the page on this site and try again.")
			}
			// The header (htmx) or the form's body, never the URL's query: a token there would
			// leak through history, proxies and logs, and no form of ours puts it there.
			got := req.Header.Get(views.CSRFHeader)
			if got == "" {
				got = c.Request().PostFormValue(views.CSRFField) // the request as set above: it keeps the parsed form
			}
			if (token == "" || !m.csrfAccepts(c, token, got)) && !m.ownPageOfVisitor(c) {
				return payments.Errorf(payments.EFORBIDDEN,
					"The form expired or did not come from this site (CSRF check failed). Go back, reload the page and try again.")
			}
			return next(c)
		}
	}
}

// ownPageOfVisitor: the request comes from a visitor without a session (a customer's checkout,
// the sign-in form) whose browser says it was sent from a page of this very origin
// (Sec-Fetch-Site: same-origin, which no other site can make a browser send, not through a
// redirect either). Such a post is no forgery even when its token is stale: two tabs of a first
// visit (a customer opening the checkout link twice) each set a new CSRF cookie, and the first
// tab's Pay carried a token for the cookie the second replaced — a 403 "form expired" for a
// customer who did nothing wrong. Signed-in staff keep the strict per-session token; a browser
// that sends no Sec-Fetch-Site keeps the token check.
func (m *Manager) ownPageOfVisitor(c echo.Context) bool {
	req := c.Request()
	return req.Header.Get("Sec-Fetch-Site") == "same-origin" && m.signedInEmail(req.Context()) == ""
}

// csrfToken is the token the request's forms must carry: the session's for signed-in staff,
// the cookie-bound one otherwise (setting the cookie when the browser has none).
func (m *Manager) csrfToken(c echo.Context) string {
	ctx := c.Request().Context()
	if m.signedInEmail(ctx) != "" {
		t := m.sm.GetString(ctx, keyCSRF)
		if t == "" {
			t = randomToken()
			m.sm.Put(ctx, keyCSRF, t)
		}
		return t
	}
	seeds := m.csrfSeeds(c)
	if len(seeds) > 0 && !seeds[0].legacy {
		return cookieToken(m.secret, seeds[0].value)
	}
	var seed string
	if len(seeds) > 0 {
		seed = seeds[0].value // set by a replica before this release: kept, under the new name too
	} else {
		seed = randomToken()
		// The request itself carries no (valid) cookie: an unsafe request will fail the check
		// below, and the page rendered now gets a token matching the new cookie.
	}
	c.SetCookie(&http.Cookie{Name: m.csrfName, Value: seed, Path: "/", HttpOnly: true, Secure: m.secure, SameSite: http.SameSiteLaxMode})
	if m.legacy && len(seeds) == 0 {
		c.SetCookie(&http.Cookie{Name: CSRFCookie, Value: seed, Path: "/", HttpOnly: true, Secure: true, SameSite: http.SameSiteLaxMode})
	}
	return cookieToken(m.secret, seed)
}

// csrfSeed is a visitor's CSRF cookie value; legacy: from the unprefixed cookie.
type csrfSeed struct {
	value  string
	legacy bool
}

// csrfSeeds are the request's CSRF cookie seeds, the prefixed one first. During the __Host-
// rollout a browser may hold both, different: a form rendered by a replica before this release
// is bound to the unprefixed one.
func (m *Manager) csrfSeeds(c echo.Context) []csrfSeed {
	var out []csrfSeed
	if ck, err := c.Request().Cookie(m.csrfName); err == nil && len(ck.Value) >= 32 {
		out = append(out, csrfSeed{value: ck.Value})
	}
	if m.legacy && len(out) == 0 {
		// Only a visitor without the prefixed seed: a page on a sibling subdomain can plant an
		// unprefixed cookie beside a victim's __Host- one (a Domain= cookie), and a seed the
		// attacker chose makes a token the attacker knows (an outside review). This release's
		// replicas write both with the same value, so nobody mid-rollout needs more.
		if ck, err := c.Request().Cookie(CSRFCookie); err == nil && len(ck.Value) >= 32 {
			out = append(out, csrfSeed{value: ck.Value, legacy: true})
		}
	}
	return out
}

// cookieToken is the CSRF token bound to a visitor's cookie seed under a secret.
func cookieToken(secret []byte, seed string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("pitlane csrf v1\x00" + seed))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// csrfAccepts reports whether got is the request's token: the one csrfToken made, or — for a
// visitor without a session — the one a fallback secret makes from the same cookie (a form
// rendered under the other side of a SECRET_KEY rotation). Constant-time comparisons.
func (m *Manager) csrfAccepts(c echo.Context, token, got string) bool {
	ok := hmac.Equal([]byte(got), []byte(token))
	if ok || m.signedInEmail(c.Request().Context()) != "" {
		return ok
	}
	for i, seed := range m.csrfSeeds(c) {
		if i > 0 { // the first seed under the primary secret is token itself
			ok = hmac.Equal([]byte(got), []byte(cookieToken(m.secret, seed.value))) || ok
		}
		for _, fb := range m.fallbacks {
			ok = hmac.Equal([]byte(got), []byte(cookieToken(fb, seed.value))) || ok
		}
	}
	return ok
}

func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // never fails on supported platforms (Go ≥ 1.24)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

const (
	staffKey = "pitlane.staff"
	permKey  = "pitlane.permission" // what Require let the request do, for Still
)

// Staff returns the signed-in staff user of a request that passed Require.
func Staff(c echo.Context) payments.Staff {
	s, _ := c.Get(staffKey).(payments.Staff)
	return s
}

// Require lets a request through only for a signed-in, enabled staff user whose role has
// permission p. Nobody signed in: to the sign-in page (htmx requests get HX-Redirect). Wrong
// role: EFORBIDDEN (403). The user is read from the database on every request, so disabling a
// user, changing a role or a password (which ends the sessions signed in under the old one)
// takes effect at once on every replica.
func (m *Manager) Require(p access.Permission) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req := c.Request()
			ctx := req.Context()
			c.Response().Header().Set("Cache-Control", "no-store")
			u, ok, err := m.current(ctx)
			if err != nil {
				return err
			}
			if !ok {
				if m.signedInEmail(ctx) != "" { // a user removed, disabled or signed out since
					if err := m.sm.Destroy(ctx); err != nil {
						return fmt.Errorf("end session of a removed user: %w", err)
					}
				}
				return m.toSignIn(c)
			}
			if m.idleOut(ctx) {
				if err := m.endIdle(ctx, req.Method); err != nil {
					return err
				}
				return m.toSignIn(c)
			}
			if !passive(req) {
				m.touch(ctx)
			}
			v := views.ViewerFrom(ctx)
			v.Email, v.Role = u.Email, u.Role
			// The session as read now, for changes of staff users to check again under their locks.
			ctx = payments.WithStaffSession(ctx, u.Email, string(u.Role), u.SessionEpoch)
			c.SetRequest(req.WithContext(views.WithViewer(ctx, v)))
			c.Set(staffKey, u.Staff())
			c.Set(permKey, p)
			if !u.Role.Can(p) {
				return payments.Errorf(payments.EFORBIDDEN, "Your role (%s) cannot open this page or do this.", u.Role)
			}
			return next(c)
		}
	}
}

// Still says whether the user Require let through may still do it (nil), for a request that
// lasts: a live stream asks before each event it sends. The user is read again: disabled, a new
// password (another session epoch) or a role without the permission ends it, as the user's next
// request would be refused. A request that did not pass Require may not.
//
// The session itself is looked up too: a plain sign-out (in this tab or another) deletes it, and
// a stream opened before kept sending events after it (an outside review).
func (m *Manager) Still(c echo.Context) error {
	p, required := c.Get(permKey).(access.Permission)
	ctx := c.Request().Context()
	u, ok, err := m.current(ctx)
	if err == nil && ok {
		// Through the session store itself: its hashing, its release-before fallback and its
		// expiry rule, not a copy of them.
		_, ok, err = m.sm.Store.(scs.CtxStore).FindCtx(ctx, m.sm.Token(ctx))
	}
	switch {
	case err != nil:
		return err
	case !required || !ok || m.idleOut(ctx):
		return payments.Errorf(payments.EUNAUTHENTICATED, "signed out")
	case !u.Role.Can(p):
		return payments.Errorf(payments.EFORBIDDEN, "the role (%s) no longer has this page", u.Role)
	}
	return nil
}

// current reads the session's user again: ok is false when nobody is signed in, or the user
// was removed, disabled or signed out by a new password (another session epoch) since.
func (m *Manager) current(ctx context.Context) (u access.User, ok bool, err error) {
	email := m.signedInEmail(ctx)
	if email == "" {
		return u, false, nil
	}
	u, err = m.access.User(ctx, email)
	switch {
	case payments.ErrorCode(err) == payments.ENOTFOUND:
		return u, false, nil
	case err != nil:
		return u, false, err
	}
	return u, !u.Disabled() && u.SessionEpoch == m.sm.GetInt(ctx, keyEpoch), nil
}

// passive reports whether a request is the page's own rather than the user's: a live region's
// refresh (static/live.js marks it) or a live stream (EventSource asks for text/event-stream).
// Neither keeps a session from idling out.
func passive(r *http.Request) bool {
	return r.Header.Get(views.LiveHeader) == "1" || stream(r)
}

// stream reports whether the request opens a live stream (an EventSource asks for
// text/event-stream).
func stream(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

// idleOut reports whether the signed-in session saw no request of its user for the idle
// timeout. A session signed in before the timeout existed (no time kept) is not idle: its first
// request keeps the time.
func (m *Manager) idleOut(ctx context.Context) bool {
	seen := m.sm.GetInt64(ctx, keySeen)
	return seen != 0 && m.now().Sub(time.Unix(seen, 0)) > m.idle
}

// touch keeps the time of the user's request, at most once every seenStep.
func (m *Manager) touch(ctx context.Context) {
	now := m.now()
	if seen := m.sm.GetInt64(ctx, keySeen); seen == 0 || now.Sub(time.Unix(seen, 0)) >= m.seenStep() {
		m.sm.Put(ctx, keySeen, now.Unix())
	}
}

// endIdle ends a session that idled out as SignOut does, saying why. A request that would have
// changed something (a form sent) is not carried out, and the message says so: the sign-in page
// said only "Sign in again", and a proposal typed over half an hour looked sent (an outside
// review).
func (m *Manager) endIdle(ctx context.Context, method string) error {
	msg := fmt.Sprintf("You were signed out after %s without activity. Sign in again.", idleText(m.idle))
	if method != http.MethodGet && method != http.MethodHead {
		msg = fmt.Sprintf("You were signed out after %s without activity: what you sent was not carried out. Sign in again and send it again.", idleText(m.idle))
	}
	return m.end(ctx, keyFlashError, msg)
}

// end ends the signed-in session: a new token (the old one is deleted from the store and
// worthless from now on) carrying nothing but a message for the sign-in page, and expiring in
// minutes.
func (m *Manager) end(ctx context.Context, key, msg string) error {
	if err := m.sm.RenewToken(ctx); err != nil {
		return fmt.Errorf("end session: renew token: %w", err)
	}
	if err := m.sm.Clear(ctx); err != nil {
		return fmt.Errorf("end session: clear: %w", err)
	}
	m.sm.SetDeadline(ctx, time.Now().Add(5*time.Minute))
	m.sm.Put(ctx, key, msg)
	return nil
}

// idleText says a timeout the way the sign-in page does ("30 minutes", "1 hour").
func idleText(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		if d == time.Hour {
			return "1 hour"
		}
		return fmt.Sprintf("%d hours", d/time.Hour)
	case d%time.Minute == 0:
		if d == time.Minute {
			return "1 minute"
		}
		return fmt.Sprintf("%d minutes", d/time.Minute)
	}
	return d.String()
}

// toSignIn sends the browser to the sign-in page, and from there back where it was: a GET to
// the page it asked for; a form sent (which is not carried out) to the page it was sent from, so
// the user finds the form again (it went to the dashboard: an outside review).
func (m *Manager) toSignIn(c echo.Context) error {
	req := c.Request()
	target := "/login"
	next := "/"
	if req.Method == http.MethodGet {
		next = req.URL.RequestURI()
	} else if req.Method != http.MethodHead {
		next = sameOriginReferer(req)
	}
	if next != "/" {
		target += "?next=" + url.QueryEscape(next)
	}
	if req.Header.Get("HX-Request") == "true" {
		c.Response().Header().Set("HX-Redirect", target)
		return c.NoContent(http.StatusUnauthorized)
	}
	if stream(req) {
		// A live stream: an EventSource would follow a redirect and load the sign-in page
		// (taking its message). Refused, the page polls, and the poll leads the window there.
		return c.NoContent(http.StatusUnauthorized)
	}
	return c.Redirect(http.StatusSeeOther, target)
}

// sameOriginReferer is the path of the page a request was sent from when that page is on this
// site (its Referer names the request's own host), through LocalPath; "/" otherwise (no
// Referer, another site's, a GET that writes): a Referer is the sender's word, so it only ever
// leads to a local path, never off the site. (A post a browser says another site sent is
// refused by CSRF before it gets here.)
func sameOriginReferer(req *http.Request) string {
	ref, err := url.Parse(req.Header.Get("Referer"))
	if err != nil || ref.Host == "" || ref.Host != req.Host || (ref.Scheme != "http" && ref.Scheme != "https") {
		return "/"
	}
	return LocalPath(ref.RequestURI())
}

// GetsWithEffects are the console's GET routes that write something. They do not answer HEAD,
// nor a navigation from another site (Sec-Fetch-Site: cross-site or same-site; the session
// cookie is SameSite=Lax, so it goes along): a link in an e-mail to an admin would mark every code
// in the outbox as seen by them (who may then not confirm it), or write export entries in the
// audit log. Nor are they where a sign-in leads (LocalPath).
var GetsWithEffects = map[string]bool{"/outbox": true, "/finance/ledger.csv": true, "/admin/audit.csv": true}

// LocalPath returns next when it is a path on this site (so a sign-in cannot be turned into an
// open redirect), "/" otherwise. A GET that writes is "/" too: the sign-in's redirect is a
// same-origin navigation, so "/login?next=/outbox" in an e-mail would lead a signed-out admin
// past the cross-site guard of GetsWithEffects (TestSignInNeverLeadsToAGetThatWrites).
func LocalPath(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, `/\`) {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || GetsWithEffects[path.Clean(u.Path)] {
		return "/"
	}
	return next
}

// SignIn starts the staff user's session: a new session token (RenewToken, so a token planted
// before sign-in is worthless after it), the user's session epoch and a new CSRF token. Expired
// sessions of anyone (ReapSessions: the store has no cleanup goroutine) and dead sign-in
// throttle rows are deleted on the way.
func (m *Manager) SignIn(c echo.Context, u access.User) error {
	return m.signIn(c, u, false)
}

// ErrSignedOut: the signed-in session was ended (signed out in another tab) while a request that
// renews it (Restart, SignInAgain) ran; it stays ended.
var ErrSignedOut = &payments.Error{Code: payments.ECONFLICT, Message: "You signed out while this was under way, so you are signed out: sign in again."}

// SignInAgain renews a signed-in session as SignIn does (a new password proved: a whole
// lifetime), unless it was ended meanwhile (ErrSignedOut).
func (m *Manager) SignInAgain(c echo.Context, u access.User) error {
	return m.signIn(c, u, true)
}

func (m *Manager) signIn(c echo.Context, u access.User, signedIn bool) error {
	ctx := c.Request().Context()
	rctx := ctx
	if signedIn {
		rctx = context.WithValue(ctx, renewSignedInKey{}, true)
	}
	old := m.sm.Token(ctx)
	if err := m.sm.RenewToken(rctx); errors.Is(err, errSessionEnded) {
		return ErrSignedOut
	} else if err != nil {
		return fmt.Errorf("sign in: renew token: %w", err)
	}
	if signedIn {
		// The new token is stored through the renewal's link (hashedStore.CommitCtx): a sign-out
		// of the old one in another tab before the answer keeps it from being stored.
		ctx = context.WithValue(ctx, renewedFromKey{}, hashToken(old))
		c.SetRequest(c.Request().WithContext(ctx))
	}
	m.sm.Put(ctx, keyEmail, u.Email)
	m.sm.Put(ctx, keyEpoch, u.SessionEpoch)
	m.sm.Put(ctx, keyCSRF, randomToken())
	m.sm.Put(ctx, keySeen, m.now().Unix())
	if m.legacy {
		m.sm.Put(ctx, keyHostOnly, true)
	}
	if _, err := m.ReapSessions(ctx); err != nil {
		m.log.Warn("reap expired sessions", "err", err)
	}
	if _, err := m.access.ReapThrottle(ctx, 1000); err != nil {
		m.log.Warn("reap sign-in throttle", "err", err)
	}
	return nil
}

// SaveGrace is how long a session's save may outlive its request (Manager.save), inside the
// server's write margin after a record's grace (web.WriteMargin).
const SaveGrace = 2 * time.Second

// Epoch is the session epoch the signed-in session holds (access.User.SessionEpoch at its sign-in):
// a change of one's own account is made under it (access.ChangeOwnPassword, access.EndSessions).
func (m *Manager) Epoch(c echo.Context) int {
	return m.sm.GetInt(c.Request().Context(), keyEpoch)
}

// Restart starts the signed-in session again on a new token, as SignIn does, but keeps its
// absolute deadline: "sign out everywhere else" asks for no password, so a copy of the cookie
// someone else holds must not live on by using it (each use restarted the 12 hours: an outside
// review). A sign-in or a new password, which prove the password, start a whole lifetime.
func (m *Manager) Restart(c echo.Context, u access.User) error {
	deadline := m.sm.Deadline(c.Request().Context())
	if err := m.signIn(c, u, true); err != nil {
		return err
	}
	m.sm.SetDeadline(c.Request().Context(), deadline)
	return nil
}

// ReapSessions deletes one bounded batch of expired sessions (and of expired renewal links,
// hashedStore.DeleteCtx). pgxstore compares expiry with the database's clock, so this does too.
// A row another transaction holds is skipped: a sign-in reaps on its way and waited on it, past
// its bound (an outside review).
func (m *Manager) ReapSessions(ctx context.Context) (int64, error) {
	if m.db == nil {
		return 0, nil
	}
	tag, err := m.db.Exec(ctx, `WITH links AS (DELETE FROM session_renewals WHERE old_token IN
			(SELECT old_token FROM session_renewals WHERE expiry < now() LIMIT 1000 FOR UPDATE SKIP LOCKED))
		DELETE FROM sessions WHERE token IN (SELECT token FROM sessions WHERE expiry < now() LIMIT 1000 FOR UPDATE SKIP LOCKED)`)
	if err != nil {
		return 0, fmt.Errorf("reap sessions: %w", err)
	}
	return tag.RowsAffected(), nil
}

// SignOut ends the staff user's session (end), with the "signed out" message for the sign-in
// page.
func (m *Manager) SignOut(c echo.Context) error {
	return m.end(c.Request().Context(), keyFlash, "You are signed out.")
}

// Flash keeps a message for the next page this browser shows (after a redirect).
func (m *Manager) Flash(c echo.Context, ok bool, msg string) {
	key := keyFlash
	if !ok {
		key = keyFlashError
	}
	m.sm.Put(c.Request().Context(), key, msg)
}

// PopFlash takes the kept messages (empty when there are none).
func (m *Manager) PopFlash(c echo.Context) (msg, errMsg string) {
	ctx := c.Request().Context()
	if !m.sm.Exists(ctx, keyFlash) && !m.sm.Exists(ctx, keyFlashError) {
		return "", "" // popping nothing must not mark the session modified
	}
	return m.sm.PopString(ctx, keyFlash), m.sm.PopString(ctx, keyFlashError)
}

// IdleTimeout is how long a session lasts without a request of its user, in words for pages
// ("30 minutes").
func (m *Manager) IdleTimeout() string { return idleText(m.idle) }

// SignedIn returns the email of the signed-in staff user ("" when nobody is), without the
// database check Require does.
func (m *Manager) SignedIn(c echo.Context) string {
	return m.signedInEmail(c.Request().Context())
}

func (m *Manager) deviceName() string {
	if m.secure {
		return HostDeviceCookie
	}
	return DeviceCookie
}

// DeviceToken is the browser's device token ("" when it sent none).
func (m *Manager) DeviceToken(c echo.Context) string {
	if ck, err := c.Request().Cookie(m.deviceName()); err == nil {
		return ck.Value
	}
	return ""
}

// SetDeviceToken keeps the browser's device token for ttl (access.DeviceTTL: as long as it is
// trusted), HttpOnly, SameSite Strict: only the sign-in form, on this site, needs it.
func (m *Manager) SetDeviceToken(c echo.Context, token string, ttl time.Duration) {
	c.SetCookie(&http.Cookie{Name: m.deviceName(), Value: token, Path: "/", HttpOnly: true, Secure: m.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: int(ttl / time.Second)})
}
