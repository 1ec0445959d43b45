package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"pitlane/internal/config"
	"pitlane/internal/testdb"
	"pitlane/internal/testlog"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
	"pitlane/payments/gateway/webhooksig"
	"pitlane/web/auth"
)

// secret is one secret the scenario made, by name, as the grep looks for it.
type secret struct{ name, value string }

// leaksIn lists where any secret appears in text (also URL-encoded, as a query or form would
// carry it), one line per find, naming the secret and quoting the line.
func leaksIn(where, text string, secrets []secret) []string {
	var out []string
	for i, line := range strings.Split(text, "\n") {
		for _, s := range secrets {
			if s.value == "" {
				continue
			}
			if strings.Contains(line, s.value) || strings.Contains(line, url.QueryEscape(s.value)) {
				out = append(out, fmt.Sprintf("%s line %d carries the %s: %s", where, i+1, s.name, line))
			}
		}
	}
	return out
}

func randHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// debugLogger logs every level, as JSON and as text at once (both handlers pitlane may run
// with), into buffers the test reads.
func debugLogger(jsonOut, textOut io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelDebug}
	return slog.New(slog.NewMultiHandler(slog.NewJSONHandler(jsonOut, opts), slog.NewTextHandler(textOut, opts)))
}

// TestLogsCarryNoSecrets runs a whole scenario through the real wiring (the commands' Main,
// serve's server with its router, sweeper and gateway client, the reference-gateway simulator
// sending signed webhooks, a customer-message sink) with every log line captured at debug
// level: an API key is made, a payment is created with an Idempotency-Key (and once with a wrong
// key), paid and confirmed by a signed webhook (a forged one refused), another is canceled with
// a one-time code from the sink (after a wrong guess), and a staff member signs in to the
// console with a password (after a wrong one), checks a payment with the CSRF token and signs
// out; SECRET_KEY is set and the webhook secret is a rotation's pair. Then no log line, no
// line the commands printed to stderr, no gateway call's recorded detail and no delivered
// outbox message may carry any of those secrets.
//
// The delivered cancel message is checked too: the contract says codes are never stored in clear
// after delivery (outbox.redacted_body). Without that redaction this test fails on the outbox.
func TestLogsCarryNoSecrets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.NewURL(t)
	pool := testdb.Pool(t, dbURL)
	var jsonLogs, textLogs, cliErr testlog.Buffer
	logger := debugLogger(&jsonLogs, &textLogs)

	secrets := []secret{
		{"SECRET_KEY", randHex(t, 32)},
		{"old webhook secret", "whsec_old_" + randHex(t, 16)},
		{"webhook secret", "whsec_new_" + randHex(t, 16)},
		{"gateway API key", "gwkey_" + randHex(t, 16)},
		{"password", "pw-" + randHex(t, 12)},
		{"wrong password", "pw-" + randHex(t, 12)},
	}
	get := func(name string) string {
		for _, s := range secrets {
			if s.name == name {
				return s.value
			}
		}
		t.Fatalf("no secret %q", name)
		return ""
	}

	// The customer-message sink (NOTIFY_WEBHOOK_URL): where one-time codes go.
	messages := make(chan payments.Message, 8)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m payments.Message
		if err := json.NewDecoder(r.Body).Decode(&m); err == nil {
			messages <- m
		}
	}))
	defer sink.Close()

	addr := freeAddr(t)
	sim := gatewaysim.New(gatewaysim.Options{
		APIKey: get("gateway API key"), WebhookURL: "http://" + addr + "/webhooks/gateway",
		WebhookSecret: get("webhook secret"), Logger: logger.With("component", "gatewaysim"),
	})
	gwSrv := httptest.NewServer(sim)
	defer func() {
		gwSrv.Close()
		sim.Close() //nolint:errcheck
	}()

	vars := map[string]string{
		"DATABASE_URL": dbURL, "HTTP_ADDR": addr, "SECRET_KEY": get("SECRET_KEY"),
		"GATEWAY_URL": gwSrv.URL, "GATEWAY_API_KEY": get("gateway API key"),
		"GATEWAY_WEBHOOK_SECRET": get("old webhook secret") + "," + get("webhook secret"),
		"NOTIFY_WEBHOOK_URL":     sink.URL,
	}
	getenv := func(k string) string { return vars[k] }
	command := func(stdin string, args ...string) string {
		t.Helper()
		var out strings.Builder
		env := &Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &cliErr, Getenv: getenv, Logger: logger}
		if code := Main(args, env); code != 0 {
			t.Fatalf("pitlane %v: exit %d: %s", args, code, cliErr.String())
		}
		return out.String()
	}
	apiKey := strings.TrimSpace(command("", "apikey", "create", "shop"))
	prefix, keySecret, _ := strings.Cut(strings.TrimPrefix(apiKey, "pl_"), "_")
	wrongKeySecret := randHex(t, 32)
	secrets = append(secrets, secret{"API key", apiKey}, secret{"API key's secret part", keySecret},
		secret{"wrong API key's secret part", wrongKeySecret})
	command(get("password")+"\n", "user", "create", "--email", "ops@example.com", "--role", "admin")

	cfg, err := config.Load(getenv)
	if err != nil {
		t.Fatal(err)
	}
	base, stop := startServeWith(t, cfg, pool, logger, serveOptions{})
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()
	client := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer client.CloseIdleConnections()
	call := func(method, path, key, body string, headers ...string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}

	// The API: a payment with an Idempotency-Key, its replay, a wrong key.
	idem := "idem-" + randHex(t, 8)
	create := `{"amount":2500,"currency":"EUR","customer_contact":"buyer@example.com"}`
	code, p1 := call(http.MethodPost, "/api/v1/orders/log-order-1/payments", apiKey, create, "Idempotency-Key", idem)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %v", code, p1)
	}
	if code, _ := call(http.MethodPost, "/api/v1/orders/log-order-1/payments", apiKey, create, "Idempotency-Key", idem); code/100 != 2 {
		t.Fatalf("replay: %d", code)
	}
	if code, _ := call(http.MethodGet, "/api/v1/payments/"+p1["id"].(string), "pl_"+prefix+"_"+wrongKeySecret, ""); code != http.StatusUnauthorized {
		t.Fatalf("wrong API key: %d", code)
	}

	// The gateway takes the money and says so in a signed webhook (and a forger tries too).
	pays := sim.PaymentsByReference(p1["id"].(string))
	if len(pays) != 1 {
		t.Fatalf("%d gateway payments for %s", len(pays), p1["id"])
	}
	if _, err := sim.Succeed(pays[0].ID); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := sim.WebhooksIdle(wctx); err != nil {
		t.Fatal(err)
	}
	if code, p := call(http.MethodGet, "/api/v1/payments/"+p1["id"].(string), apiKey, ""); code != http.StatusOK || p["status"] != "Completed" {
		t.Fatalf("after the signed webhook: %d %v (deliveries %+v)", code, p["status"], sim.Deliveries())
	}
	if code, _ := call(http.MethodPost, "/webhooks/gateway", "", `{"id":"evt_forged","type":"payment.updated","data":{"id":"`+pays[0].ID+`"}}`,
		webhooksig.Header, fmt.Sprintf("t=%d,v1=%s", time.Now().Unix(), randHex(t, 32))); code != http.StatusUnauthorized {
		t.Fatalf("forged webhook: %d", code)
	}

	// Cancel with a one-time code (after a wrong guess).
	code, p2 := call(http.MethodPost, "/api/v1/orders/log-order-2/payments", apiKey, `{"amount":700,"currency":"EUR","customer_contact":"buyer@example.com"}`,
		"Idempotency-Key", "idem-"+randHex(t, 8))
	if code != http.StatusCreated {
		t.Fatalf("create 2: %d %v", code, p2)
	}
	p2ID := p2["id"].(string)
	code, ch := call(http.MethodPost, "/api/v1/payments/"+p2ID+"/cancel", apiKey, "")
	if code != http.StatusAccepted {
		t.Fatalf("cancel: %d %v", code, ch)
	}
	var msg payments.Message
	select {
	case msg = <-messages:
	case <-time.After(30 * time.Second):
		t.Fatal("no message reached the sink")
	}
	otp := regexp.MustCompile(`\b\d{6}\b`).FindString(msg.Text)
	if otp == "" {
		t.Fatalf("no code in %q", msg.Text)
	}
	secrets = append(secrets, secret{"one-time code", otp})
	n, _ := strconv.Atoi(otp)
	wrong := fmt.Sprintf("%06d", (n+1)%1_000_000)
	if code, _ := call(http.MethodPost, "/api/v1/payments/"+p2ID+"/cancel/confirm", apiKey, `{"challenge_id":"`+ch["challenge_id"].(string)+`","code":"`+wrong+`"}`); code != http.StatusUnprocessableEntity {
		t.Fatalf("wrong code: %d", code)
	}
	if code, p := call(http.MethodPost, "/api/v1/payments/"+p2ID+"/cancel/confirm", apiKey, `{"challenge_id":"`+ch["challenge_id"].(string)+`","code":"`+otp+`"}`); code != http.StatusAccepted {
		t.Fatalf("confirm: %d %v", code, p)
	}

	// The console: sign in (a wrong password first), check a payment with the CSRF token, sign out.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Timeout: 30 * time.Second, Jar: jar, CheckRedirect: client.CheckRedirect}
	defer browser.CloseIdleConnections()
	csrfRe := regexp.MustCompile(`name="csrf(?:_token|-token)"[^>]*(?:value|content)="([^"]+)"`)
	var csrf string // the token of the last page that had one
	page := func(method, path string, form url.Values) (int, string) {
		t.Helper()
		var resp *http.Response
		var err error
		if method == http.MethodGet {
			resp, err = browser.Get(base + path)
		} else {
			resp, err = browser.PostForm(base+path, form)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if m := csrfRe.FindSubmatch(body); m != nil {
			csrf = string(m[1])
			secrets = append(secrets, secret{"CSRF token", csrf})
		}
		return resp.StatusCode, string(body)
	}
	if code, _ := page(http.MethodGet, "/login", nil); code != http.StatusOK {
		t.Fatalf("sign-in page: %d", code)
	}
	if code, _ := page(http.MethodPost, "/login", url.Values{"email": {"ops@example.com"}, "password": {get("wrong password")}, "csrf_token": {csrf}}); code == http.StatusSeeOther {
		t.Fatal("signed in with a wrong password")
	}
	page(http.MethodGet, "/login", nil)
	if code, body := page(http.MethodPost, "/login", url.Values{"email": {"ops@example.com"}, "password": {get("password")}, "csrf_token": {csrf}}); code != http.StatusSeeOther {
		t.Fatalf("sign in: %d %s", code, body)
	}
	baseURL, _ := url.Parse(base)
	for _, c := range jar.Cookies(baseURL) {
		if c.Name == auth.SessionCookie || c.Name == auth.CSRFCookie {
			secrets = append(secrets, secret{"cookie " + c.Name, c.Value})
		}
	}
	if code, _ := page(http.MethodGet, "/", nil); code != http.StatusOK {
		t.Fatalf("dashboard: %d", code)
	}
	if code, _ := page(http.MethodPost, "/payments/"+p1["id"].(string)+"/check", url.Values{"csrf_token": {csrf}}); code != http.StatusSeeOther && code != http.StatusOK {
		t.Fatalf("console check: %d", code)
	}
	page(http.MethodGet, "/outbox", nil)
	if code, _ := page(http.MethodPost, "/logout", url.Values{"csrf_token": {csrf}}); code != http.StatusSeeOther {
		t.Fatalf("sign out: %d", code)
	}

	stopped = true
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// What was written: the logs at debug (both formats), what the commands printed to stderr,
	// the gateway call log, every delivered outbox message.
	if !strings.Contains(textLogs.String(), "level=DEBUG") || !strings.Contains(jsonLogs.String(), `"msg":"http request"`) {
		t.Fatalf("the capture missed the debug lines or the request log:\n%s", textLogs.String())
	}
	var leaks []string
	leaks = append(leaks, leaksIn("JSON log", jsonLogs.String(), secrets)...)
	leaks = append(leaks, leaksIn("text log", textLogs.String(), secrets)...)
	leaks = append(leaks, leaksIn("commands' stderr", cliErr.String(), secrets)...)
	rows, err := pool.Query(ctx, `SELECT 'gateway_calls.detail', coalesce(detail, '') FROM gateway_calls
		UNION ALL SELECT 'outbox', body || ' ' || coalesce(last_error, '') FROM outbox WHERE delivered_at IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	var stored, delivered int
	for rows.Next() {
		var where, text string
		if err := rows.Scan(&where, &text); err != nil {
			t.Fatal(err)
		}
		stored++
		if where == "outbox" {
			delivered++
		}
		leaks = append(leaks, leaksIn(where, text, secrets)...)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if delivered == 0 {
		t.Fatal("no delivered outbox message to look at")
	}
	if len(leaks) > 0 {
		t.Errorf("secrets leaked:\n%s", strings.Join(leaks, "\n"))
	}
	t.Logf("looked for %d secrets in %d JSON and %d text log bytes and %d stored rows", len(secrets), len(jsonLogs.String()), len(textLogs.String()), stored)

	// The negative control: the same capture and the same grep do find each secret once it is
	// logged, in either format, as it is or in a query string.
	t.Run("negative control", func(t *testing.T) {
		for _, s := range secrets {
			var j, x testlog.Buffer
			l := debugLogger(&j, &x)
			l.Debug("leak", "value", s.value)
			l.Info("http request", "uri", "/checkout?token="+url.QueryEscape(s.value))
			for where, text := range map[string]string{"JSON": j.String(), "text": x.String()} {
				if n := len(leaksIn(where, text, []secret{s})); n != 2 {
					t.Errorf("the %s, logged on purpose twice, is found %d times in the %s log", s.name, n, where)
				}
			}
		}
	})
}
