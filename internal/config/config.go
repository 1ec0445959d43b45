// Package config reads pitlane's settings from the environment (the contract's table, plus
// SECRET_KEY). Every invalid value is reported as one line naming the variable, so the binary
// can print it and exit 2 instead of failing later somewhere less obvious.
package config

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Gateways pitlane can talk to (GATEWAY).
const (
	GatewayRefgw  = "refgw"
	GatewayStripe = "stripe"
)

// MinSecretKeyLen is the shortest SECRET_KEY accepted (32 characters); `openssl rand -hex 32`
// prints a good one.
const MinSecretKeyLen = 32

// Config is the process configuration. Field comments name the variable.
type Config struct {
	DatabaseURL          string        // DATABASE_URL; "" means unset (dev then starts a private cluster)
	ListenDatabaseURL    string        // LISTEN_DATABASE_URL: the live listener's direct connection; "": DATABASE_URL (ListenURL)
	HTTPAddr             string        // HTTP_ADDR, default 127.0.0.1:8080
	PublicBaseURL        string        // PUBLIC_BASE_URL without a trailing slash, default http://+HTTP_ADDR
	Gateway              string        // GATEWAY: GatewayRefgw (default) or GatewayStripe
	GatewayURL           string        // GATEWAY_URL
	GatewayAPIKey        string        // GATEWAY_API_KEY
	GatewayWebhookSecret string        // GATEWAY_WEBHOOK_SECRET: one secret or a comma-separated list (WebhookSecrets)
	GatewayTimeout       time.Duration // GATEWAY_TIMEOUT, default 10s
	// ConfirmationHosts (GATEWAY_CONFIRMATION_HOSTS: comma-separated host names, "*.example.com"
	// for any subdomain) are the hosts whose https pages the gateway may send customers to.
	// Empty: any https host (and always the gateway's own origin).
	ConfirmationHosts []string
	NotifyWebhookURL  string // NOTIFY_WEBHOOK_URL; "" keeps messages in the outbox
	// NotifyWebhookSecrets (NOTIFY_WEBHOOK_SECRET, comma-separated while rotating; optional) sign
	// each POST to NOTIFY_WEBHOOK_URL as the events webhook's are.
	NotifyWebhookSecrets [][]byte
	// EventsWebhookURL (EVENTS_WEBHOOK_URL) is where the events feed is POSTed for the shop; ""
	// turns the events webhook off. EventsWebhookSecrets (EVENTS_WEBHOOK_SECRET, comma-separated
	// while rotating, each at least MinSecretKeyLen characters) sign each POST, one v1 entry each.
	EventsWebhookURL     string
	EventsWebhookSecrets [][]byte
	ReplicaID            string        // REPLICA_ID, default host name + "-" + pid
	SweepInterval        time.Duration // SWEEP_INTERVAL, default 2s
	SweepConcurrency     int           // SWEEP_CONCURRENCY, default 16: drives one replica's patrol runs at once
	// ShutdownDrain (SHUTDOWN_DRAIN, unset: none) is how long a replica told to stop goes on
	// serving with /readyz answering 503 "stopping" before it closes its listener: the time its
	// balancer (a Kubernetes Service's endpoints, a health check's interval × its threshold)
	// takes to stop sending it new requests.
	ShutdownDrain time.Duration
	// ReconcileBatch (RECONCILE_BATCH, default 100) is how many sessions the reconciliation
	// leader compares with the gateway each minute: a pass over the sessions changed within the
	// lookback (7 days) must end within about a day, so a shop changing more than about
	// 100 × 1,440 sessions a week raises it (each costs one or two gateway reads).
	ReconcileBatch int
	// TrustedProxies (TRUSTED_PROXIES: comma-separated addresses or CIDR ranges) are the peers
	// whose X-Forwarded-For names the client. Empty: the peer is the client.
	TrustedProxies []*net.IPNet
	// MetricsAddr (METRICS_ADDR, host:port) serves /metrics on a listener of its own instead of
	// HTTP_ADDR, so operators can keep it off the public port. "" keeps it on HTTP_ADDR.
	MetricsAddr string
	// SecretKey (SECRET_KEY) keys the HMACs of checkout links, one-time codes and CSRF tokens;
	// every replica must use the same one. nil when unset: `dev` then persists a generated one
	// in .pitlane/secret; `serve` refuses to start (RequireSecret).
	SecretKey []byte
	// SecretKeyFallbacks (SECRET_KEY_FALLBACKS, comma-separated, each as long as SECRET_KEY must
	// be) are older — or, while a rotation is being rolled out, newer — secrets that still VERIFY
	// checkout links, one-time codes and CSRF tokens, but never sign anything: what makes
	// rotating SECRET_KEY possible without breaking links and forms in flight
	// (docs/operations.md, "Rotating SECRET_KEY"; the name follows Django's setting).
	SecretKeyFallbacks [][]byte
	// MerchantName (MERCHANT_NAME) is whom customers pay: every checkout page shows it. "" when
	// unset: see Merchant for what is shown then; `dev` sets DevMerchantName.
	MerchantName string
	// RefundDirectLimit (REFUND_DIRECT_LIMIT: "EUR:50000,USD:50000", minor units per currency)
	// is how much of one payment finance refunds from the console without a second person;
	// beyond it (and in any currency not listed) a refund needs a four-eyes approval.
	RefundDirectLimit map[string]int64
	// CodeRequestsPerContact (CODE_REQUESTS_PER_CONTACT_PER_HOUR, 1 to MaxCodeRequestsPerContact)
	// bounds the one-time codes sent to one customer contact within an hour across all its
	// payments. 0 (unset): only the contract's 3 per payment per hour.
	CodeRequestsPerContact int
	// ConsoleIdleTimeout (CONSOLE_IDLE_TIMEOUT, default 30m, 1m to 12h) signs a staff user out
	// of the console after this long without a request of their own; a page refreshing itself
	// does not count.
	ConsoleIdleTimeout time.Duration
	// OTLPTracesEndpoint is where spans are exported over OTLP/HTTP, from the standard
	// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT (otel.go). "": tracing exports nothing.
	OTLPTracesEndpoint string
}

// DevMerchantName is the merchant `pitlane dev` shows on its checkout pages unless MERCHANT_NAME
// is set.
const DevMerchantName = "pitlane demo shop"

// MaxMerchantNameLen bounds MERCHANT_NAME (characters): it heads a phone-sized page.
const MaxMerchantNameLen = 80

// Merchant is the name the checkout shows: MERCHANT_NAME, or else the host of PUBLIC_BASE_URL
// (pay.example.com). Unset in `serve`, a real customer is never shown a made-up shop name: the
// host is what their address bar says anyway, plain but true.
func (c Config) Merchant() string {
	if c.MerchantName != "" {
		return c.MerchantName
	}
	if u, err := url.Parse(c.PublicBaseURL); err == nil && u.Hostname() != "" {
		return u.Hostname()
	}
	return "this shop"
}

// Error is a configuration error: which variable, and what is wrong with it.
type Error struct {
	Var string
	Msg string
}

func (e *Error) Error() string { return e.Var + ": " + e.Msg }

func errorf(v, format string, args ...any) *Error {
	return &Error{Var: v, Msg: fmt.Sprintf(format, args...)}
}

// Load reads and validates every variable through getenv and returns the first problem, in
// the order of the contract's table.
func Load(getenv func(string) string) (Config, error) {
	c := Config{
		DatabaseURL:          getenv("DATABASE_URL"),
		HTTPAddr:             or(getenv("HTTP_ADDR"), "127.0.0.1:8080"),
		Gateway:              or(getenv("GATEWAY"), GatewayRefgw),
		GatewayURL:           getenv("GATEWAY_URL"),
		GatewayAPIKey:        strings.TrimSpace(getenv("GATEWAY_API_KEY")),
		GatewayWebhookSecret: getenv("GATEWAY_WEBHOOK_SECRET"),
		NotifyWebhookURL:     getenv("NOTIFY_WEBHOOK_URL"),
		ReplicaID:            getenv("REPLICA_ID"),
	}
	// A key from a file (a Kubernetes secret) ends with its newline, which no header may carry:
	// serve started and every gateway call failed on our side, not_sent (an outside review).
	if strings.IndexFunc(c.GatewayAPIKey, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		return c, errorf("GATEWAY_API_KEY", "must be printable ASCII without spaces (the gateway's key as it gave it)")
	}
	if c.GatewayWebhookSecret != "" && len(c.WebhookSecrets()) == 0 {
		return c, errorf("GATEWAY_WEBHOOK_SECRET", "lists no secret (only commas and spaces); unset it to refuse every webhook")
	}
	if c.DatabaseURL != "" {
		if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
			return c, errorf("DATABASE_URL", "not a valid PostgreSQL URL: %s", parseError(err, c.DatabaseURL))
		}
	}
	if c.ListenDatabaseURL = getenv("LISTEN_DATABASE_URL"); c.ListenDatabaseURL != "" {
		if _, err := pgxpool.ParseConfig(c.ListenDatabaseURL); err != nil {
			return c, errorf("LISTEN_DATABASE_URL", "not a valid PostgreSQL URL: %s", parseError(err, c.ListenDatabaseURL))
		}
	}
	host, port, err := net.SplitHostPort(c.HTTPAddr)
	if err != nil {
		return c, errorf("HTTP_ADDR", "%q is not host:port (e.g. 127.0.0.1:8080)", c.HTTPAddr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return c, errorf("HTTP_ADDR", "%q has no valid port number", c.HTTPAddr)
	}
	if v := getenv("PUBLIC_BASE_URL"); v != "" {
		if err := checkHTTPURL(v); err != nil {
			return c, errorf("PUBLIC_BASE_URL", "%v", err)
		}
		u, _ := url.Parse(v)
		if strings.ContainsAny(v, "?#") || u.User != nil || strings.Trim(u.EscapedPath(), "/") != "" {
			// Paths are appended to it (…/checkout/{order}): a query or fragment would swallow them.
			// And pitlane serves at the root of its host: its pages link /static/…, /checkout/…,
			// so a base with a path gave customers links whose page could not be paid from (the
			// Pay form posted outside the path, the stylesheets 404; an outside review).
			return c, errorf("PUBLIC_BASE_URL", "must be the scheme and host (and port) pitlane is reached at, without a path, credentials, query or fragment: pitlane serves at the root of its host (e.g. https://pay.example.com)")
		}
		// Scheme and host as lower case: "HTTPS://…" is https to every browser, and the Secure
		// cookies and HSTS follow a prefix test of this value (an outside review: they were off).
		c.PublicBaseURL = strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host)
	} else {
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "localhost"
		}
		c.PublicBaseURL = "http://" + net.JoinHostPort(host, port)
	}
	if c.Gateway != GatewayRefgw && c.Gateway != GatewayStripe {
		return c, errorf("GATEWAY", "must be %q or %q, got %q", GatewayRefgw, GatewayStripe, c.Gateway)
	}
	if c.GatewayURL != "" {
		if err := checkHTTPURL(c.GatewayURL); err != nil {
			return c, errorf("GATEWAY_URL", "%v", err)
		}
	}
	if c.GatewayTimeout, err = duration(getenv, "GATEWAY_TIMEOUT", 10*time.Second, 10*time.Millisecond, 10*time.Minute); err != nil {
		return c, err
	}
	if c.ConfirmationHosts, err = parseHosts(getenv("GATEWAY_CONFIRMATION_HOSTS")); err != nil {
		return c, err
	}
	if c.NotifyWebhookURL != "" {
		if err := checkHTTPURL(c.NotifyWebhookURL); err != nil {
			return c, errorf("NOTIFY_WEBHOOK_URL", "%v", err)
		}
		if c.NotifyWebhookSecrets, err = secretList(getenv, "NOTIFY_WEBHOOK_SECRET"); err != nil {
			return c, err
		}
		if getenv("NOTIFY_WEBHOOK_SECRET") != "" && len(c.NotifyWebhookSecrets) == 0 {
			// Taken as unset, every code message went out unsigned (an outside review).
			return c, errorf("NOTIFY_WEBHOOK_SECRET", "lists no secret (only commas and spaces); unset it to send messages unsigned")
		}
	} else if getenv("NOTIFY_WEBHOOK_SECRET") != "" {
		return c, errorf("NOTIFY_WEBHOOK_SECRET", "is set but NOTIFY_WEBHOOK_URL is not: set the URL or unset the secret")
	}
	if c.EventsWebhookURL = getenv("EVENTS_WEBHOOK_URL"); c.EventsWebhookURL != "" {
		if err := checkHTTPURL(c.EventsWebhookURL); err != nil {
			return c, errorf("EVENTS_WEBHOOK_URL", "%v", err)
		}
		if c.EventsWebhookSecrets, err = secretList(getenv, "EVENTS_WEBHOOK_SECRET"); err != nil {
			return c, err
		}
		if len(c.EventsWebhookSecrets) == 0 {
			return c, errorf("EVENTS_WEBHOOK_SECRET", "is required with EVENTS_WEBHOOK_URL: the shop checks each POST's signature with it")
		}
	} else if getenv("EVENTS_WEBHOOK_SECRET") != "" {
		return c, errorf("EVENTS_WEBHOOK_SECRET", "is set but EVENTS_WEBHOOK_URL is not: set the URL or unset the secret")
	}
	if c.ReplicaID == "" {
		c.ReplicaID = defaultReplicaID()
	} else if len(c.ReplicaID) > 128 || strings.IndexFunc(c.ReplicaID, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0 {
		return c, errorf("REPLICA_ID", "must be printable characters without spaces, at most 128 bytes")
	}
	if c.SweepInterval, err = duration(getenv, "SWEEP_INTERVAL", 2*time.Second, 10*time.Millisecond, 24*time.Hour); err != nil {
		return c, err
	}
	if c.ShutdownDrain, err = duration(getenv, "SHUTDOWN_DRAIN", 0, time.Millisecond, 5*time.Minute); err != nil {
		return c, err
	}
	if c.ConsoleIdleTimeout, err = duration(getenv, "CONSOLE_IDLE_TIMEOUT", 30*time.Minute, time.Minute, 12*time.Hour); err != nil {
		return c, err
	}
	if c.SweepConcurrency, err = count(getenv, "SWEEP_CONCURRENCY", 16, MaxSweepConcurrency); err != nil {
		return c, err
	}
	if c.ReconcileBatch, err = count(getenv, "RECONCILE_BATCH", 100, MaxReconcileBatch); err != nil {
		return c, err
	}
	if c.CodeRequestsPerContact, err = count(getenv, "CODE_REQUESTS_PER_CONTACT_PER_HOUR", 0, MaxCodeRequestsPerContact); err != nil {
		return c, err
	}
	if c.TrustedProxies, err = parseProxies(getenv("TRUSTED_PROXIES")); err != nil {
		return c, err
	}
	if c.MetricsAddr = getenv("METRICS_ADDR"); c.MetricsAddr != "" {
		if _, port, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			return c, errorf("METRICS_ADDR", "%q is not host:port (e.g. 127.0.0.1:9090)", c.MetricsAddr)
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return c, errorf("METRICS_ADDR", "%q has no valid port number", c.MetricsAddr)
		}
	}
	if v := strings.TrimSpace(getenv("MERCHANT_NAME")); v != "" {
		if n := len([]rune(v)); n > MaxMerchantNameLen || !utf8.ValidString(v) ||
			strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			return c, errorf("MERCHANT_NAME", "must be 1-%d printable characters (the shop's name as customers know it)", MaxMerchantNameLen)
		}
		c.MerchantName = v
	}
	var asGiven []byte
	if v := getenv("SECRET_KEY"); v != "" {
		if !longEnoughSecret(v) {
			return c, errorf("SECRET_KEY", "must be at least %d characters (e.g. the output of `openssl rand -hex 32`)", MinSecretKeyLen)
		}
		// Without the spaces around it, as every entry of SECRET_KEY_FALLBACKS is read: a key with
		// a trailing newline (a Kubernetes secret made from a file) signed with the newline, and
		// the same value moved into the fallbacks at a rotation's second step was trimmed there:
		// every link, code and form signed under the old key failed (an outside review). The value
		// as given still verifies (a fallback): what replicas of the release before signed with it.
		c.SecretKey = []byte(strings.TrimSpace(v))
		if string(c.SecretKey) != v {
			asGiven = []byte(v)
		}
	}
	if c.SecretKeyFallbacks, err = secretList(getenv, "SECRET_KEY_FALLBACKS"); err != nil {
		return c, err
	}
	c.SecretKeyFallbacks = append(c.SecretKeyFallbacks, withLineEnds(getenv("SECRET_KEY_FALLBACKS"))...)
	if asGiven != nil {
		c.SecretKeyFallbacks = append(c.SecretKeyFallbacks, asGiven)
	}
	if c.RefundDirectLimit, err = parseRefundLimit(getenv("REFUND_DIRECT_LIMIT")); err != nil {
		return c, err
	}
	if c.OTLPTracesEndpoint, err = tracesEndpoint(getenv); err != nil {
		return c, err
	}
	return c, nil
}

// parseRefundLimit reads REFUND_DIRECT_LIMIT: comma-separated CURRENCY:AMOUNT pairs, the amount
// in minor units (as every amount of the API), e.g. "EUR:50000,JPY:50000" for 500.00 EUR and
// 50000 JPY. Minor units per currency, not one number: 50000 is 500 EUR but only about 300 EUR
// in yen. Unset: nil (finance refunds nothing without a second person).
func parseRefundLimit(v string) (map[string]int64, error) {
	var out map[string]int64
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		cur, amount, ok := strings.Cut(item, ":")
		cur, amount = strings.TrimSpace(cur), strings.TrimSpace(amount)
		n, err := strconv.ParseInt(amount, 10, 64)
		if !ok || len(cur) != 3 || strings.ToUpper(cur) != cur || strings.IndexFunc(cur, func(r rune) bool { return r < 'A' || r > 'Z' }) >= 0 ||
			err != nil || n < 0 || n >= 1e12 {
			return nil, errorf("REFUND_DIRECT_LIMIT", "%q is not CURRENCY:AMOUNT in minor units (e.g. EUR:50000 for 500.00 EUR)", item)
		}
		if _, dup := out[cur]; dup {
			return nil, errorf("REFUND_DIRECT_LIMIT", "%s is listed twice", cur)
		}
		if out == nil {
			out = map[string]int64{}
		}
		out[cur] = n
	}
	return out, nil
}

// longEnoughSecret: at least MinSecretKeyLen characters, as the contract counts them (not bytes:
// 16 two-byte characters are 32 bytes), not counting spaces around it: 32 spaces were a key
// anyone could guess (an outside review). The key signs without them (Load).
func longEnoughSecret(v string) bool {
	return utf8.RuneCountInString(strings.TrimSpace(v)) >= MinSecretKeyLen
}

// secretList reads a comma-separated list of secrets (a rotation's old and new), each at least
// MinSecretKeyLen characters, as long as SECRET_KEY must be. Spaces around entries and empty
// entries are dropped; nil when unset.
func secretList(getenv func(string) string, name string) ([][]byte, error) {
	var out [][]byte
	for v := range strings.SplitSeq(getenv(name), ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		if !longEnoughSecret(v) {
			return nil, errorf(name, "every secret in the list must be at least %d characters, like SECRET_KEY", MinSecretKeyLen)
		}
		out = append(out, []byte(v))
	}
	return out, nil
}

// withLineEnds are the entries of a secret list that carry a line end or a tab (the spaces
// beside a comma are the list's), as given: a SECRET_KEY from a file signed with its trailing
// newline before this release (Load), and the links it signed live for weeks; the same value
// moved into SECRET_KEY_FALLBACKS at a rotation's second step still verifies them (an outside
// review). secretList has checked every entry already.
func withLineEnds(list string) [][]byte {
	var out [][]byte
	for given := range strings.SplitSeq(list, ",") {
		if g := strings.Trim(given, " "); g != strings.TrimSpace(g) {
			out = append(out, []byte(g))
		}
	}
	return out
}

// parseHosts reads GATEWAY_CONFIRMATION_HOSTS: host names (lower-cased), each optionally "*."
// followed by a name with at least two labels, comma-separated. A URL, a port or a bare "*" is
// refused: the list names hosts, and a wildcard over a whole top-level domain allows anyone.
func parseHosts(v string) ([]string, error) {
	var out []string
	for item := range strings.SplitSeq(v, ",") {
		item = strings.ToLower(strings.TrimSpace(item))
		if item == "" {
			continue
		}
		name, wild := strings.CutPrefix(item, "*.")
		if !hostName(name) || (wild && !strings.Contains(name, ".")) {
			return nil, errorf("GATEWAY_CONFIRMATION_HOSTS", "%q is not a host name or *.domain (e.g. pay.example.com,*.stripe.com; no scheme, port or path)", item)
		}
		out = append(out, item)
	}
	return out, nil
}

// hostName reports whether s is a DNS name (letters, digits and hyphens in dot-separated labels
// of 1-63 characters, none starting or ending with a hyphen) or an IP address.
func hostName(s string) bool {
	if net.ParseIP(s) != nil {
		return true
	}
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' ||
			strings.IndexFunc(label, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') }) >= 0 {
			return false
		}
	}
	return true
}

// parseProxies reads TRUSTED_PROXIES: addresses (a single host) or CIDR ranges, comma-separated.
func parseProxies(v string) ([]*net.IPNet, error) {
	var out []*net.IPNet
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if !strings.Contains(item, "/") {
			ip := net.ParseIP(item)
			if ip == nil {
				return nil, errorf("TRUSTED_PROXIES", "%q is neither an IP address nor a CIDR range (e.g. 10.0.0.0/8)", item)
			}
			bits := 128
			if ip.To4() != nil {
				ip, bits = ip.To4(), 32
			}
			out = append(out, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
			continue
		}
		_, n, err := net.ParseCIDR(item)
		if err != nil {
			return nil, errorf("TRUSTED_PROXIES", "%q is neither an IP address nor a CIDR range (e.g. 10.0.0.0/8)", item)
		}
		out = append(out, n)
	}
	return out, nil
}

// RequireDatabase reports an unset DATABASE_URL for commands that cannot run without one.
func (c Config) RequireDatabase(command string) error {
	if c.DatabaseURL == "" {
		return errorf("DATABASE_URL", "required by `pitlane %s` (e.g. postgres://user@host:5432/pitlane; `pitlane dev` starts a private PostgreSQL instead, and with it running its banner prints the URL)", command)
	}
	return nil
}

// ListenURL is the connection the live console's listener uses: LISTEN_DATABASE_URL, or
// DATABASE_URL when that is unset (right when DATABASE_URL reaches PostgreSQL directly).
func (c Config) ListenURL() string {
	if c.ListenDatabaseURL != "" {
		return c.ListenDatabaseURL
	}
	return c.DatabaseURL
}

// RequireSecret reports an unset SECRET_KEY for commands that serve other people: without one
// there is nothing to sign checkout links, one-time codes and CSRF tokens with that an attacker
// could not know or compute (a key derived from database identifiers is readable by any
// database user).
func (c Config) RequireSecret(command string) error {
	if len(c.SecretKey) == 0 {
		return errorf("SECRET_KEY", "required by `pitlane %s`: at least %d characters, the same on every replica (e.g. `openssl rand -hex 32`; `pitlane dev` generates one)", command, MinSecretKeyLen)
	}
	return nil
}

// WebhookSecrets splits GATEWAY_WEBHOOK_SECRET into its secrets: a comma-separated list, so
// that during a rotation the old and the new secret both verify (the receiver accepts a
// signature under any of them; order does not matter). Spaces around entries and empty entries
// are dropped, so a secret itself can contain neither a comma nor leading or trailing spaces.
// nil when unset.
func (c Config) WebhookSecrets() []string {
	var out []string
	for s := range strings.SplitSeq(c.GatewayWebhookSecret, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// LoadOrCreateSecret returns the secret stored at path, creating a random one (mode 0600) on
// first use, so that `pitlane dev` keeps its sessions and pending one-time codes across
// restarts without anyone configuring SECRET_KEY.
func LoadOrCreateSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		s := strings.TrimSpace(string(b))
		if !longEnoughSecret(s) {
			return nil, errorf("SECRET_KEY", "the secret in %s is shorter than %d characters; delete the file to get a new one", path, MinSecretKeyLen)
		}
		return []byte(s), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("config: read secret: %w", err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("config: generate secret: %w", err)
	}
	s := hex.EncodeToString(raw)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	// O_EXCL: if another process created it first, use theirs.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return LoadOrCreateSecret(path)
	} else if err != nil {
		return nil, fmt.Errorf("config: write secret: %w", err)
	}
	if _, err := f.WriteString(s + "\n"); err != nil {
		f.Close()
		return nil, fmt.Errorf("config: write secret: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("config: write secret: %w", err)
	}
	return []byte(s), nil
}

// duration reads a duration within [lo, hi] (def when unset): a sweep every nanosecond keeps
// an idle replica busy with thousands of transactions a second, and a gateway timeout of years
// overflows the leases and graces derived from it.
func duration(getenv func(string) string, name string, def, lo, hi time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return 0, errorf(name, "%q is not a duration (e.g. %s)", v, def)
	case d <= 0:
		return 0, errorf(name, "must be positive, got %s", v)
	case d < lo || d > hi:
		return 0, errorf(name, "must be between %s and %s, got %s", lo, hi, d)
	}
	return d, nil
}

// MaxSweepConcurrency bounds SWEEP_CONCURRENCY: each drive may hold a database connection for
// its short transactions, and far more than the pool or the gateway's rate limit allows only
// queues the drives somewhere else.
const MaxSweepConcurrency = 1024

// MaxReconcileBatch bounds RECONCILE_BATCH: a run is one session after another, and a run
// of more than a minute only delays the next one.
const MaxReconcileBatch = 10000

// MaxCodeRequestsPerContact bounds CODE_REQUESTS_PER_CONTACT_PER_HOUR: more would be no bound.
const MaxCodeRequestsPerContact = 1000

// count reads a positive integer of at most maxN (def when unset).
func count(getenv func(string) string, name string, def, maxN int) (int, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxN {
		return 0, errorf(name, "must be a whole number from 1 to %d, got %q", maxN, v)
	}
	return n, nil
}

func checkHTTPURL(v string) error {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return fmt.Errorf("%q is not an absolute http(s) URL", shownURL(v))
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q has no valid port number", shownURL(v))
		}
	}
	return nil
}

// shownURL is v as a message may quote it: everything before the last "@" after the scheme
// replaced (the credentials a URL may carry: a webhook's user:password, a token as the user),
// whether or not v parses. The message of a bad EVENTS_WEBHOOK_URL went to stderr and the
// journal with its password in it (an outside review); a password may hold "/", "?" or "#"
// unescaped (a base64 token), so the host's end is not where the credentials end. An "@" in a
// path hides the host too: a message may say less, never a secret.
func shownURL(v string) string {
	scheme, rest, ok := strings.Cut(v, "://")
	if !ok {
		scheme, rest = "", v
	} else {
		scheme += "://"
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return v
	}
	return scheme + "xxxxx" + rest[at:]
}

func defaultReplicaID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "pitlane"
	}
	return h + "-" + strconv.Itoa(os.Getpid())
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// parseError is pgx's refusal of a connection string without the string: pgx masks the
// password in its copy on a best-effort basis, and a keyword/value one written "password = x"
// (spaces around "=", which libpq and pgx accept) was printed in clear (an outside review). What
// pgx says after the string is kept — it names the setting that is wrong — with any password of
// the string masked in it too.
func parseError(err error, conn string) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, "`: "); i >= 0 {
		msg = msg[i+len("`: "):]
	}
	for _, m := range connPasswords.FindAllStringSubmatch(conn, -1) {
		for _, secret := range m[1:] {
			if secret == "" {
				continue
			}
			msg = strings.ReplaceAll(msg, secret, "…")
			if dec, err := url.PathUnescape(secret); err == nil && dec != "" {
				msg = strings.ReplaceAll(msg, dec, "…")
			}
		}
	}
	return oneLine(msg)
}

// connPasswords finds the passwords of a connection string: a URL's user info, a password or
// sslpassword query parameter, a keyword/value password (quoted or not, spaces around "=").
var connPasswords = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://[^@/?#]*?:([^@/?#]*)@` +
	`|[?&](?i:ssl)?password=([^&#]*)` +
	`|(?i:\b(?:ssl)?password)\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\S*))`)

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
