package config

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	c, err := Load(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.DatabaseURL != "" || c.HTTPAddr != "127.0.0.1:8080" || c.PublicBaseURL != "http://127.0.0.1:8080" ||
		c.Gateway != GatewayRefgw || c.GatewayTimeout != 10*time.Second || c.SweepInterval != 2*time.Second || c.ReconcileBatch != 100 || c.CodeRequestsPerContact != 0 ||
		c.SweepConcurrency != 16 || c.NotifyWebhookURL != "" || c.SecretKey != nil || c.ConsoleIdleTimeout != 30*time.Minute {
		t.Errorf("defaults: %+v", c)
	}
	if !strings.HasSuffix(c.ReplicaID, "-"+strconv.Itoa(os.Getpid())) {
		t.Errorf("ReplicaID %q: want host name + pid", c.ReplicaID)
	}
	if err := c.RequireDatabase("serve"); err == nil || !strings.HasPrefix(err.Error(), "DATABASE_URL: ") {
		t.Errorf("RequireDatabase with no URL: %v", err)
	}
}

func TestValues(t *testing.T) {
	t.Parallel()
	c, err := Load(env(map[string]string{
		"DATABASE_URL":                       "postgres://u:p@db:5432/pitlane?default_query_exec_mode=exec",
		"HTTP_ADDR":                          ":9090",
		"GATEWAY":                            "stripe",
		"GATEWAY_URL":                        "http://127.0.0.1:12111",
		"GATEWAY_TIMEOUT":                    "1500ms",
		"NOTIFY_WEBHOOK_URL":                 "https://notify.example/hook",
		"REPLICA_ID":                         "replica-a",
		"SWEEP_INTERVAL":                     "250ms",
		"SWEEP_CONCURRENCY":                  "64",
		"RECONCILE_BATCH":                    "2500",
		"CODE_REQUESTS_PER_CONTACT_PER_HOUR": "6",
		"SECRET_KEY":                         strings.Repeat("k", 32),
		"SECRET_KEY_FALLBACKS":               strings.Repeat("o", 32) + " , " + strings.Repeat("n", 40),
		"TRUSTED_PROXIES":                    "10.0.0.0/8, 192.168.1.7,fd00::/8",
		"METRICS_ADDR":                       "127.0.0.1:9091",
		"REFUND_DIRECT_LIMIT":                "EUR:50000, JPY:8000",
		"CONSOLE_IDLE_TIMEOUT":               "15m",
		"GATEWAY_CONFIRMATION_HOSTS":         " Hooks.Stripe.com, *.pay.example.com ,",
		"EVENTS_WEBHOOK_URL":                 "https://shop.example/pitlane-events",
		"EVENTS_WEBHOOK_SECRET":              strings.Repeat("e", 32) + " , " + strings.Repeat("f", 33),
		"NOTIFY_WEBHOOK_SECRET":              strings.Repeat("t", 32),
	}))
	if err != nil {
		t.Fatal(err)
	}
	var proxies []string
	for _, n := range c.TrustedProxies {
		proxies = append(proxies, n.String())
	}
	if strings.Join(proxies, " ") != "10.0.0.0/8 192.168.1.7/32 fd00::/8" || c.MetricsAddr != "127.0.0.1:9091" {
		t.Errorf("TRUSTED_PROXIES %v, METRICS_ADDR %q", proxies, c.MetricsAddr)
	}
	if strings.Join(c.ConfirmationHosts, " ") != "hooks.stripe.com *.pay.example.com" {
		t.Errorf("GATEWAY_CONFIRMATION_HOSTS %q", c.ConfirmationHosts)
	}
	if c.EventsWebhookURL != "https://shop.example/pitlane-events" || len(c.EventsWebhookSecrets) != 2 || len(c.EventsWebhookSecrets[1]) != 33 {
		t.Errorf("EVENTS_WEBHOOK_URL %q, EVENTS_WEBHOOK_SECRET %q", c.EventsWebhookURL, c.EventsWebhookSecrets)
	}
	if len(c.NotifyWebhookSecrets) != 1 {
		t.Errorf("NOTIFY_WEBHOOK_URL %q, NOTIFY_WEBHOOK_SECRET %q", c.NotifyWebhookURL, c.NotifyWebhookSecrets)
	}
	if c.ConsoleIdleTimeout != 15*time.Minute {
		t.Errorf("CONSOLE_IDLE_TIMEOUT %s", c.ConsoleIdleTimeout)
	}
	if len(c.RefundDirectLimit) != 2 || c.RefundDirectLimit["EUR"] != 50000 || c.RefundDirectLimit["JPY"] != 8000 {
		t.Errorf("REFUND_DIRECT_LIMIT %v", c.RefundDirectLimit)
	}
	if c.PublicBaseURL != "http://localhost:9090" || c.Gateway != GatewayStripe || c.GatewayTimeout != 1500*time.Millisecond ||
		c.SweepInterval != 250*time.Millisecond || c.SweepConcurrency != 64 || c.ReconcileBatch != 2500 || c.CodeRequestsPerContact != 6 || c.ReplicaID != "replica-a" || len(c.SecretKey) != 32 {
		t.Errorf("values: %+v", c)
	}
	if len(c.SecretKeyFallbacks) != 2 || string(c.SecretKeyFallbacks[0]) != strings.Repeat("o", 32) || len(c.SecretKeyFallbacks[1]) != 40 {
		t.Errorf("SECRET_KEY_FALLBACKS: %q", c.SecretKeyFallbacks)
	}
	if err := c.RequireDatabase("serve"); err != nil {
		t.Error(err)
	}
	c, err = Load(env(map[string]string{"PUBLIC_BASE_URL": "https://pay.example.com/"}))
	if err != nil || c.PublicBaseURL != "https://pay.example.com" {
		t.Errorf("PUBLIC_BASE_URL: %q, %v", c.PublicBaseURL, err)
	}
}

// TestListenURL: the live listener connects to LISTEN_DATABASE_URL when set (past pgbouncer),
// else to DATABASE_URL.
func TestListenURL(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"DATABASE_URL": "postgres://u:p@pgbouncer:6432/pitlane?default_query_exec_mode=exec"}
	c, err := Load(env(vars))
	if err != nil || c.ListenURL() != vars["DATABASE_URL"] {
		t.Errorf("without LISTEN_DATABASE_URL: %q, %v; want DATABASE_URL", c.ListenURL(), err)
	}
	vars["LISTEN_DATABASE_URL"] = "postgres://u:p@db:5432/pitlane"
	if c, err = Load(env(vars)); err != nil || c.ListenURL() != vars["LISTEN_DATABASE_URL"] {
		t.Errorf("with LISTEN_DATABASE_URL: %q, %v", c.ListenURL(), err)
	}
}

func TestValidationErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, value string }{
		{"DATABASE_URL", "postgres://u:hunter2@db:notaport/x"},
		{"DATABASE_URL", "postgres://db/x?sslmode=bogus"},
		// Keyword/value with spaces around "=" (libpq and pgx accept them): pgx's copy of the
		// string in its message did not mask that password (an outside review).
		{"DATABASE_URL", "host=db.internal user=pitlane password = hunter2 dbname=pitlane sslmode=requre"},
		{"DATABASE_URL", "host=db.internal user=pitlane password =hunter2 dbname=pitlane port=5432x"},
		{"LISTEN_DATABASE_URL", "host=db.internal password= hunter2 sslmode=requre"},
		{"GATEWAY_API_KEY", "sk_live key"},
		{"GATEWAY_API_KEY", "key\x00"},
		{"LISTEN_DATABASE_URL", "postgres://u:hunter2@db:notaport/x"},
		{"HTTP_ADDR", "8080"},
		{"HTTP_ADDR", "127.0.0.1:http"},
		{"HTTP_ADDR", "127.0.0.1:70000"},
		{"PUBLIC_BASE_URL", "pay.example.com"},
		{"PUBLIC_BASE_URL", "ftp://pay.example.com"},
		{"GATEWAY", "paypal"},
		{"GATEWAY_URL", "localhost:12111"},
		{"GATEWAY_TIMEOUT", "10"},
		{"GATEWAY_TIMEOUT", "-1s"},
		{"GATEWAY_TIMEOUT", "0s"},
		{"GATEWAY_TIMEOUT", "1ns"},
		{"GATEWAY_TIMEOUT", "2000000h"},
		{"PUBLIC_BASE_URL", "https://example.com/shop?x=1"},
		{"PUBLIC_BASE_URL", "https://example.com/#pay"},
		{"PUBLIC_BASE_URL", "https://u:hunter2@example.com"},
		{"PUBLIC_BASE_URL", "https://example.com/pay"}, // pitlane serves at the root: its pages' links would leave the path
		{"PUBLIC_BASE_URL", "https://example.com#"},    // a bare fragment swallowed every path appended to it
		{"PUBLIC_BASE_URL", "https://:443"},
		{"PUBLIC_BASE_URL", "https://example.com:99999"},
		{"PUBLIC_BASE_URL", "https://example.com:0"},
		{"GATEWAY_URL", "http://:12111"},
		// Credentials in a URL that does not parse, or whose port is bad: the message quoted it
		// whole (an outside review). The user part may be a token too.
		{"EVENTS_WEBHOOK_URL", "https://shop:hunter2@hooks.example.com:99999/x"},
		{"EVENTS_WEBHOOK_URL", "https://shop:hunter2@hooks.example.com:44x/x"},
		{"NOTIFY_WEBHOOK_URL", "https://hunter2@notify.example.com:0/x"},
		{"GATEWAY_URL", "ftp://u:hunter2@gw.example.com"},
		{"GATEWAY_URL", "https://u:hunter2@gw example.com/"},
		{"PUBLIC_BASE_URL", "https://u:hunter2@pay.example.com:70000"},
		{"EVENTS_WEBHOOK_URL", "https://shop:hunter2/abc@hooks.example.com/x"}, // "/" in the password
		{"NOTIFY_WEBHOOK_URL", "https://shop:hun?ter2hunter2@notify.example.com/x"},
		{"GATEWAY_URL", "https://shop:hunter2#x@gw.example.com/x"},
		{"SECRET_KEY", strings.Repeat(" ", 32)},
		{"SECRET_KEY", " " + strings.Repeat("k", 30) + " "},
		{"GATEWAY_WEBHOOK_SECRET", " , ,"},
		{"NOTIFY_WEBHOOK_URL", "/hook"},
		{"EVENTS_WEBHOOK_URL", "/hook"},
		{"EVENTS_WEBHOOK_SECRET", strings.Repeat("s", 32)}, // without the URL
		{"NOTIFY_WEBHOOK_SECRET", strings.Repeat("s", 32)}, // without the URL
		{"REPLICA_ID", "two words"},
		{"REPLICA_ID", strings.Repeat("r", 129)},
		{"SWEEP_INTERVAL", "often"},
		{"SWEEP_INTERVAL", "0"},
		{"SWEEP_INTERVAL", "1ns"},
		{"SWEEP_INTERVAL", "48h"},
		{"CONSOLE_IDLE_TIMEOUT", "30"},
		{"CONSOLE_IDLE_TIMEOUT", "10s"},
		{"CONSOLE_IDLE_TIMEOUT", "13h"},
		{"SWEEP_CONCURRENCY", "0"},
		{"SWEEP_CONCURRENCY", "many"},
		{"SWEEP_CONCURRENCY", "100000"},
		{"RECONCILE_BATCH", "0"},
		{"RECONCILE_BATCH", "20000"},
		{"CODE_REQUESTS_PER_CONTACT_PER_HOUR", "0"},
		{"CODE_REQUESTS_PER_CONTACT_PER_HOUR", "1001"},
		{"SECRET_KEY", "short"},
		{"SECRET_KEY_FALLBACKS", strings.Repeat("o", 32) + ",short"},
		{"TRUSTED_PROXIES", "10.0.0.0/33"},
		{"TRUSTED_PROXIES", "proxy.internal"},
		{"METRICS_ADDR", "9090"},
		{"MERCHANT_NAME", "Acme\nShop"},
		{"MERCHANT_NAME", strings.Repeat("m", MaxMerchantNameLen+1)},
		{"MERCHANT_NAME", "Acme \xff"},
		{"REFUND_DIRECT_LIMIT", "500"},
		{"REFUND_DIRECT_LIMIT", "eur:500"},
		{"REFUND_DIRECT_LIMIT", "EUR:5.00"},
		{"REFUND_DIRECT_LIMIT", "EUR:-1"},
		{"REFUND_DIRECT_LIMIT", "EUR:1,EUR:2"},
		{"GATEWAY_CONFIRMATION_HOSTS", "https://pay.example.com"},
		{"GATEWAY_CONFIRMATION_HOSTS", "pay.example.com:443"},
		{"GATEWAY_CONFIRMATION_HOSTS", "pay.example.com/checkout"},
		{"GATEWAY_CONFIRMATION_HOSTS", "*"},
		{"GATEWAY_CONFIRMATION_HOSTS", "*.com"},
		{"GATEWAY_CONFIRMATION_HOSTS", "pay..example.com"},
		{"GATEWAY_CONFIRMATION_HOSTS", "-pay.example.com"},
		{"GATEWAY_CONFIRMATION_HOSTS", "pay_1.example.com"},
	} {
		_, err := Load(env(map[string]string{tc.name: tc.value}))
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Var != tc.name {
			t.Errorf("%s=%q: error %v, want a config error naming %s", tc.name, tc.value, err, tc.name)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, tc.name+": ") || strings.Contains(msg, "\n") {
			t.Errorf("%s=%q: want one line starting with the variable, got %q", tc.name, tc.value, msg)
		}
		if strings.Contains(msg, "hunter2") {
			t.Errorf("%s: the password leaked into the message: %q", tc.name, msg)
		}
	}
}

// The OpenTelemetry SDK's own variables, when traces are exported: a bad value stops the binary
// naming the variable, and a header's value (a collector's token) is never quoted (audit 6: the
// SDK printed "Authorization: Bearer …" to stderr and started without it). Tracing off, they are
// not read.
func TestOTelSDKSettingsAreChecked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := dir + "/ca.pem"
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	const secret = "s3cr3t-collector-token"
	for _, tc := range []struct{ name, value string }{
		{"OTEL_EXPORTER_OTLP_HEADERS", "Authorization: Bearer " + secret},
		{"OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20" + secret + "%zz"},
		{"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x=1,," + secret},
		{"OTEL_EXPORTER_OTLP_TIMEOUT", "abc"},
		{"OTEL_EXPORTER_OTLP_TIMEOUT", "-5"},
		{"OTEL_BSP_MAX_QUEUE_SIZE", "lots"},
		{"OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"},
		{"OTEL_EXPORTER_OTLP_CERTIFICATE", dir + "/nonexistent.pem"},
		{"OTEL_EXPORTER_OTLP_CERTIFICATE", notPEM},
		{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", notPEM},
		{"OTEL_TRACES_SAMPLER", "bogus"},
	} {
		vars := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", tc.name: tc.value}
		if tc.name == "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE" {
			vars["OTEL_EXPORTER_OTLP_CLIENT_KEY"] = notPEM
		}
		_, err := Load(env(vars))
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Var != tc.name {
			t.Errorf("%s=%q: error %v, want a config error naming %s", tc.name, tc.value, err, tc.name)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, secret) || strings.Contains(msg, "\n") {
			t.Errorf("%s: want one line without the header's value, got %q", tc.name, msg)
		}
	}
	ratio := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
		"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"}
	if _, err := Load(env(ratio)); err == nil || !strings.HasPrefix(err.Error(), "OTEL_TRACES_SAMPLER_ARG: ") {
		t.Errorf("sampler ratio 1.5: %v, want an error naming OTEL_TRACES_SAMPLER_ARG", err)
	}
	good := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
		"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20" + secret + ",x-tenant=acme", "OTEL_EXPORTER_OTLP_TIMEOUT": "5000",
		"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
	if _, err := Load(env(good)); err != nil {
		t.Errorf("good settings: %v", err)
	}
	off := map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "garbage", "OTEL_TRACES_SAMPLER": "bogus"}
	if _, err := Load(env(off)); err != nil {
		t.Errorf("tracing off reads none of them: %v", err)
	}
}

// MERCHANT_NAME is shown as set (trimmed); unset, the checkout names the host of
// PUBLIC_BASE_URL (serve), never a made-up shop; dev sets DevMerchantName itself.
func TestMerchantName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"MERCHANT_NAME": "  Café Ümlaut & Sons  "}, "Café Ümlaut & Sons"},
		{map[string]string{"PUBLIC_BASE_URL": "https://pay.example.com:8443"}, "pay.example.com"},
		{nil, "127.0.0.1"},
	} {
		c, err := Load(env(tc.env))
		if err != nil || c.Merchant() != tc.want {
			t.Errorf("%v: Merchant() = %q (%v), want %q", tc.env, c.Merchant(), err, tc.want)
		}
	}
}

func TestLoadOrCreateSecretPersists(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), ".pitlane", "secret")
	a, err := LoadOrCreateSecret(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) < MinSecretKeyLen {
		t.Fatalf("secret too short: %d", len(a))
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secret file mode: %v, %v", fi, err)
	}
	b, err := LoadOrCreateSecret(path)
	if err != nil || string(a) != string(b) {
		t.Fatalf("second load: %q vs %q, %v", a, b, err)
	}
	if err := os.WriteFile(path, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateSecret(path); err == nil {
		t.Fatal("a too-short stored secret was accepted")
	}
}

func TestWebhookSecretsIsACommaSeparatedList(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw  string
		want []string
	}{
		{"", nil},
		{"whsec_one", []string{"whsec_one"}},
		{"whsec_old,whsec_new", []string{"whsec_old", "whsec_new"}},
		{" whsec_old , whsec_new ,", []string{"whsec_old", "whsec_new"}},
	} {
		c, err := Load(env(map[string]string{"GATEWAY_WEBHOOK_SECRET": tc.raw}))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.WebhookSecrets(); strings.Join(got, "|") != strings.Join(tc.want, "|") || len(got) != len(tc.want) {
			t.Errorf("%q: %q, want %q", tc.raw, got, tc.want)
		}
	}
}

// The events webhook needs a secret (the shop verifies each POST), each as long as SECRET_KEY.
func TestEventsWebhookNeedsASecret(t *testing.T) {
	t.Parallel()
	for _, secret := range []string{"", " , ", "short", strings.Repeat("s", 32) + ",short"} {
		_, err := Load(env(map[string]string{"EVENTS_WEBHOOK_URL": "https://shop.example/hook", "EVENTS_WEBHOOK_SECRET": secret}))
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Var != "EVENTS_WEBHOOK_SECRET" {
			t.Errorf("EVENTS_WEBHOOK_SECRET=%q: %v, want an error naming it", secret, err)
		}
	}
}

// The contract's SECRET_KEY is "at least 32 characters": a key of 16 two-byte characters (32
// bytes) was accepted, counted in bytes. From the contract review; negative control: len(v).
func TestSecretKeyLengthCountsCharacters(t *testing.T) {
	t.Parallel()
	short := strings.Repeat("é", 16)
	for _, name := range []string{"SECRET_KEY", "SECRET_KEY_FALLBACKS"} {
		vars := map[string]string{"SECRET_KEY": strings.Repeat("k", 32), name: short}
		if _, err := Load(env(vars)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s of 16 characters (32 bytes): %v, want a refusal naming it", name, err)
		}
	}
	if _, err := Load(env(map[string]string{"SECRET_KEY": strings.Repeat("é", 32)})); err != nil {
		t.Errorf("SECRET_KEY of 32 characters: %v", err)
	}
}

// NOTIFY_WEBHOOK_SECRET is optional, but a secret given is as long as SECRET_KEY's rule asks.
func TestNotifyWebhookSecretIsLongEnough(t *testing.T) {
	t.Parallel()
	// One that lists no secret was taken as unset: every code message went out unsigned.
	for _, secret := range []string{"short", strings.Repeat("s", 32) + ",short", ",", " , ", "\n"} {
		_, err := Load(env(map[string]string{"NOTIFY_WEBHOOK_URL": "https://shop.example/texts", "NOTIFY_WEBHOOK_SECRET": secret}))
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Var != "NOTIFY_WEBHOOK_SECRET" {
			t.Errorf("NOTIFY_WEBHOOK_SECRET=%q: %v, want an error naming it", secret, err)
		}
	}
	if c, err := Load(env(map[string]string{"NOTIFY_WEBHOOK_URL": "https://shop.example/texts"})); err != nil || c.NotifyWebhookSecrets != nil {
		t.Fatalf("without a secret: %v, %q", err, c.NotifyWebhookSecrets)
	}
}

// PUBLIC_BASE_URL's scheme and host are kept in lower case: "HTTPS://…" is https to every
// browser, and serve turns Secure cookies and HSTS on by the value's "https://" prefix (an
// outside review: with "HTTPS://" the staff session cookie went without Secure, and no HSTS).
func TestPublicBaseURLIsLowerCase(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"HTTPS://Pay.Example.com/":     "https://pay.example.com",
		"Https://pay.example.com:8443": "https://pay.example.com:8443",
		"http://[::1]:8080":            "http://[::1]:8080",
	} {
		c, err := Load(env(map[string]string{"PUBLIC_BASE_URL": in}))
		if err != nil || c.PublicBaseURL != want {
			t.Errorf("PUBLIC_BASE_URL=%q: %q %v, want %q", in, c.PublicBaseURL, err, want)
		}
	}
}

// GATEWAY_API_KEY from a file (a Kubernetes secret) ends with a newline: trimmed as SECRET_KEY
// is. Kept, serve started and every gateway call failed on our side ("invalid header field
// value"; an outside review).
func TestGatewayAPIKeyIsTrimmed(t *testing.T) {
	t.Parallel()
	c, err := Load(env(map[string]string{"GATEWAY_API_KEY": "sk_test_123\n"}))
	if err != nil || c.GatewayAPIKey != "sk_test_123" {
		t.Fatalf("GATEWAY_API_KEY with a line end: %q, %v", c.GatewayAPIKey, err)
	}
}

// TestABadDatabaseURLSettingIsNamed: the refusal of a bad DATABASE_URL names the setting that is
// wrong, with only the password masked: hiding every word of the string said "invalid … (parsing
// "…")" for a bad connect_timeout (a review of the password's masking).
func TestABadDatabaseURLSettingIsNamed(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]string{
		"postgres://u:hunter2@db/x?connect_timeout=abc":               "connect_timeout",
		"host=db password='hunter2 x' target_session_attrs=bogus":     "target_session_attrs",
		"host=db password = hunter2 connect_timeout=abc":              "connect_timeout",
		"postgres://db/x?password=hunter2&target_session_attrs=bogus": "target_session_attrs",
	} {
		_, err := Load(env(map[string]string{"DATABASE_URL": dsn}))
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("DATABASE_URL=%q: %v; want it to name %s without the password", dsn, err, want)
		}
	}
}
