package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// Request decoding for the JSON API, kept apart from the handlers so that it can be fuzzed
// (FuzzAPIDecode). Everything here answers 4xx for bad input and never panics:
//
//	body over 64 KiB                        → 413
//	a body declared as something else than JSON → 415 (no Content-Type at all: read as JSON)
//	not UTF-8, not one JSON object, trailing data → 400
//	duplicate or unknown field, wrong type, out of range → 422 naming the field

// readJSONObject reads the request body as one JSON object and returns its fields. An empty body
// is allowed only when !required (bodyless actions: check, cancel); then fields is empty.
func readJSONObject(r *http.Request, required bool) (map[string]json.RawMessage, error) {
	if r.ContentLength > maxAPIBody {
		return nil, tooLarge()
	}
	var body []byte
	if r.Body != nil {
		b, err := io.ReadAll(io.LimitReader(r.Body, maxAPIBody+1))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, tooLarge()
			}
			return nil, echo.NewHTTPError(http.StatusBadRequest, "the request body could not be read")
		}
		body = b
	}
	if int64(len(body)) > maxAPIBody {
		return nil, tooLarge()
	}
	if len(body) == 0 && !required {
		return map[string]json.RawMessage{}, nil
	}
	// A body with no Content-Type is read as the only thing the API takes, JSON (a client that
	// forgot the header gets its request served, or a 400 saying what is wrong with the body);
	// one declared as anything else is refused as such.
	if ct := r.Header.Get(echo.HeaderContentType); ct != "" {
		if err := checkJSONContentType(ct); err != nil {
			return nil, err
		}
	}
	return decodeObject(body)
}

func tooLarge() error {
	return echo.NewHTTPError(http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than %d bytes", maxAPIBody))
}

// jsonCharsets are the charset labels a JSON body may carry: UTF-8 under the names clients write
// (utf8 is common: refused, a shop whose HTTP library spells it so could take no payment at
// all, a review of the API), and ASCII, which is UTF-8. RFC 8259 gives the parameter no meaning;
// one naming another encoding says the bytes are not UTF-8, and is refused.
var jsonCharsets = map[string]bool{"utf-8": true, "utf8": true, "us-ascii": true, "ascii": true}

// checkJSONContentType accepts application/json and application/*+json, in UTF-8 when a charset
// is named (jsonCharsets).
func checkJSONContentType(ct string) error {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return echo.NewHTTPError(http.StatusUnsupportedMediaType, "the Content-Type header cannot be parsed; send application/json")
	}
	if mt != "application/json" && !(strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		return echo.NewHTTPError(http.StatusUnsupportedMediaType, fmt.Sprintf("the body must be JSON (application/json), not %s", mt))
	}
	if cs, ok := params["charset"]; ok && !jsonCharsets[strings.ToLower(cs)] {
		return echo.NewHTTPError(http.StatusUnsupportedMediaType, "JSON bodies must be UTF-8")
	}
	return nil
}

// decodeObject parses exactly one JSON object and returns its members. Duplicate members are
// refused rather than letting the last one silently win (two parsers could disagree on which).
func decodeObject(body []byte) (map[string]json.RawMessage, error) {
	malformed := func(why string) error {
		return echo.NewHTTPError(http.StatusBadRequest, "the body is not valid JSON: "+why)
	}
	if !utf8.Valid(body) {
		return nil, malformed("it is not UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, malformed("expected a JSON object")
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, malformed("expected a JSON object")
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, malformed(syntaxDetail(err))
		}
		name, ok := tok.(string)
		if !ok {
			return nil, malformed("expected a member name")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, malformed(syntaxDetail(err))
		}
		if _, dup := fields[name]; dup {
			return nil, payments.Invalid(name, "field %q appears more than once", name)
		}
		fields[name] = raw
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, malformed(syntaxDetail(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, malformed("unexpected data after the JSON object")
	}
	return fields, nil
}

func syntaxDetail(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "unexpected end of input"
	}
	return "malformed"
}

// onlyFields refuses members outside allowed, naming the first one (in sorted order, so the
// message does not depend on map iteration).
func onlyFields(fields map[string]json.RawMessage, allowed ...string) error {
	var unknown []string
	for name := range fields {
		ok := false
		for _, a := range allowed {
			if name == a {
				ok = true
				break
			}
		}
		if !ok {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	first := unknown[0]
	for _, u := range unknown[1:] {
		if u < first {
			first = u
		}
	}
	if len(allowed) == 0 {
		return payments.Invalid(first, "unknown field %q: this call takes no fields", first)
	}
	return payments.Invalid(first, "unknown field %q (allowed: %s)", first, strings.Join(allowed, ", "))
}

// jsonKind names what a raw JSON value is, from its first byte (raw is well-formed).
func jsonKind(raw json.RawMessage) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "nothing"
	}
	switch c := raw[0]; {
	case c == '"':
		return "string"
	case c == '-' || (c >= '0' && c <= '9'):
		return "number"
	case c == 't' || c == 'f':
		return "boolean"
	case c == 'n':
		return "null"
	case c == '{':
		return "object"
	case c == '[':
		return "array"
	}
	return "unknown"
}

var jsonIntegerRe = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// amountField reads a required amount: a JSON integer (no fraction, no exponent, no quotes),
// > 0 and < 10^12.
func amountField(fields map[string]json.RawMessage, name string) (int64, error) {
	raw, ok := fields[name]
	if !ok || jsonKind(raw) == "null" {
		return 0, payments.Invalid(name, "%s is required: an integer amount in minor units", name)
	}
	if k := jsonKind(raw); k != "number" {
		return 0, payments.Invalid(name, "%s must be an integer in minor units, not %s", name, withArticle(k))
	}
	lit := string(bytes.TrimSpace(raw))
	if !jsonIntegerRe.MatchString(lit) {
		return 0, payments.Invalid(name, "%s must be an integer in minor units (no fraction or exponent)", name)
	}
	n, err := strconv.ParseInt(lit, 10, 64)
	if err != nil || n <= 0 || n >= payments.MaxAmount {
		return 0, payments.Invalid(name, "%s must be greater than 0 and less than 10^12", name)
	}
	return n, nil
}

// withArticle is a JSON kind as a noun in a sentence: "an array", "an object", "a string".
func withArticle(kind string) string {
	switch kind {
	case "array", "object":
		return "an " + kind
	case "null", "nothing":
		return kind
	case "unknown":
		return "an unknown value"
	}
	return "a " + kind
}

// stringField reads a string member; a missing or null member is "" with present=false.
func stringField(fields map[string]json.RawMessage, name string) (s string, present bool, err error) {
	raw, ok := fields[name]
	if !ok || jsonKind(raw) == "null" {
		return "", false, nil
	}
	if k := jsonKind(raw); k != "string" {
		return "", false, payments.Invalid(name, "%s must be a string, not %s", name, withArticle(k))
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, payments.Invalid(name, "%s is not a valid JSON string", name)
	}
	// Control characters (\u0000 above all, which PostgreSQL text cannot hold) have no place in
	// any field of this API.
	if strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return "", false, payments.Invalid(name, "%s must not contain control characters", name)
	}
	return s, true, nil
}

func requiredString(fields map[string]json.RawMessage, name string) (string, error) {
	s, ok, err := stringField(fields, name)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", payments.Invalid(name, "%s is required", name)
	}
	return s, nil
}

// createRequest is a decoded, validated POST /api/v1/orders/{order_id}/payments.
type createRequest struct {
	Input payments.CreateInput
	// Key is the Idempotency-Key header ("" when absent).
	Key string
	// Path and Fingerprint identify the request for its idempotency key: method, path and the
	// canonical body (the validated fields re-encoded in one fixed form, so whitespace, member
	// order or an explicit null do not make the same request look different).
	Path        string
	Fingerprint []byte
}

type canonicalCreate struct {
	Amount          int64  `json:"amount"`
	Currency        string `json:"currency"`
	CustomerContact string `json:"customer_contact,omitempty"`
}

// parseCreate decodes and validates a create request. It touches nothing but the request.
func parseCreate(r *http.Request, orderID string) (createRequest, error) {
	key, err := idempotencyKeyHeader(r.Header)
	if err != nil {
		return createRequest{}, err
	}
	fields, err := readJSONObject(r, true)
	if err != nil {
		return createRequest{}, err
	}
	if err := onlyFields(fields, "amount", "currency", "customer_contact"); err != nil {
		return createRequest{}, err
	}
	amount, err := amountField(fields, "amount")
	if err != nil {
		return createRequest{}, err
	}
	currency, err := requiredString(fields, "currency")
	if err != nil {
		return createRequest{}, err
	}
	contact, _, err := stringField(fields, "customer_contact")
	if err != nil {
		return createRequest{}, err
	}
	in := payments.CreateInput{OrderID: orderID, Amount: amount, Currency: currency, CustomerContact: contact}
	if err := in.Validate(); err != nil {
		return createRequest{}, err
	}
	canon, err := json.Marshal(canonicalCreate{Amount: amount, Currency: currency, CustomerContact: contact})
	if err != nil {
		return createRequest{}, fmt.Errorf("create: canonical body: %w", err)
	}
	path := "/api/v1/orders/" + orderID + "/payments"
	return createRequest{Input: in, Key: key, Path: path, Fingerprint: payments.Fingerprint(http.MethodPost, path, canon)}, nil
}

// checkoutLinkRequest is a decoded, validated POST /api/v1/orders/{order_id}/checkout-links.
type checkoutLinkRequest struct {
	Input payments.CreateInput
	// TTL is the link's lifetime from "expires_in" (seconds); 0 when absent (the default).
	TTL time.Duration
}

// parseCheckoutLink decodes and validates POST /api/v1/orders/{order_id}/checkout-links
// {"amount","currency","expires_in"?}: create's rules for the fields it shares; expires_in is a
// JSON integer of seconds within the core's bounds (payments.MinCheckoutLinkTTL …
// MaxCheckoutLinkTTL). It touches nothing but the request.
func parseCheckoutLink(r *http.Request, orderID string) (checkoutLinkRequest, error) {
	fields, err := readJSONObject(r, true)
	if err != nil {
		return checkoutLinkRequest{}, err
	}
	if err := onlyFields(fields, "amount", "currency", "expires_in"); err != nil {
		return checkoutLinkRequest{}, err
	}
	amount, err := amountField(fields, "amount")
	if err != nil {
		return checkoutLinkRequest{}, err
	}
	currency, err := requiredString(fields, "currency")
	if err != nil {
		return checkoutLinkRequest{}, err
	}
	in := payments.CreateInput{OrderID: orderID, Amount: amount, Currency: currency}
	if err := in.Validate(); err != nil {
		return checkoutLinkRequest{}, err
	}
	var ttl time.Duration
	if raw, ok := fields["expires_in"]; ok && jsonKind(raw) != "null" {
		lit := string(bytes.TrimSpace(raw))
		n, err := strconv.ParseInt(lit, 10, 64)
		lo, hi := int64(payments.MinCheckoutLinkTTL/time.Second), int64(payments.MaxCheckoutLinkTTL/time.Second)
		if jsonKind(raw) != "number" || !jsonIntegerRe.MatchString(lit) || err != nil || n < lo || n > hi {
			return checkoutLinkRequest{}, payments.Invalid("expires_in", "expires_in must be an integer number of seconds from %d to %d", lo, hi)
		}
		ttl = time.Duration(n) * time.Second
	}
	return checkoutLinkRequest{Input: in, TTL: ttl}, nil
}

// refundRequest is a decoded, validated POST /api/v1/payments/{id}/refunds.
type refundRequest struct {
	// PaymentID is the path's payment id in canonical form (lower-case UUID), so that two
	// spellings of one payment are one request for its idempotency key.
	PaymentID string
	Amount    int64
	// Key, Path and Fingerprint as in createRequest.
	Key         string
	Path        string
	Fingerprint []byte
}

type canonicalRefund struct {
	Amount int64 `json:"amount"`
}

// parseRefund decodes and validates a refund request. It touches nothing but the request. A
// payment id that is not a UUID names no payment: ENOTFOUND (404) before any key is touched.
func parseRefund(r *http.Request, paymentID string) (refundRequest, error) {
	key, err := idempotencyKeyHeader(r.Header)
	if err != nil {
		return refundRequest{}, err
	}
	fields, err := readJSONObject(r, true)
	if err != nil {
		return refundRequest{}, err
	}
	if err := onlyFields(fields, "amount"); err != nil {
		return refundRequest{}, err
	}
	amount, err := amountField(fields, "amount")
	if err != nil {
		return refundRequest{}, err
	}
	id, ok := CanonicalUUID(paymentID)
	if !ok {
		return refundRequest{}, payments.Errorf(payments.ENOTFOUND, "payment %q not found", paymentID)
	}
	canon, err := json.Marshal(canonicalRefund{Amount: amount})
	if err != nil {
		return refundRequest{}, fmt.Errorf("refund: canonical body: %w", err)
	}
	path := paymentsPath + id + "/refunds"
	return refundRequest{PaymentID: id, Amount: amount, Key: key, Path: path, Fingerprint: payments.Fingerprint(http.MethodPost, path, canon)}, nil
}

// CanonicalUUID accepts the 36-character textual form of a UUID (any case) and returns it in
// lower case; anything else (braces, urn:uuid:, no dashes) is not an id of ours.
func CanonicalUUID(s string) (string, bool) {
	if len(s) != 36 {
		return "", false
	}
	u, err := uuid.Parse(s)
	if err != nil {
		return "", false
	}
	return u.String(), true
}

// idempotencyKeyHeader returns the Idempotency-Key header: absent → "", otherwise exactly one
// value of 1-255 printable ASCII characters.
func idempotencyKeyHeader(h http.Header) (string, error) {
	vals := h.Values(HeaderIdempotencyKey)
	if len(vals) == 0 {
		return "", nil
	}
	if len(vals) > 1 {
		return "", payments.Invalid(HeaderIdempotencyKey, "send one Idempotency-Key header, not %d", len(vals))
	}
	v := vals[0]
	const rule = "Idempotency-Key must be 1-255 printable ASCII characters"
	if len(v) == 0 {
		return "", payments.Invalid(HeaderIdempotencyKey, "%s; this one is empty", rule)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return "", payments.Invalid(HeaderIdempotencyKey, "%s; this one has another byte at position %d", rule, i+1)
		}
	}
	if len(v) > 255 {
		return "", payments.Invalid(HeaderIdempotencyKey, "%s; this one has %d", rule, len(v))
	}
	return v, nil
}

// confirmRequest is a decoded POST /api/v1/payments/{id}/cancel/confirm.
type confirmRequest struct {
	ChallengeID string
	Code        string
}

func parseConfirm(r *http.Request) (confirmRequest, error) {
	fields, err := readJSONObject(r, true)
	if err != nil {
		return confirmRequest{}, err
	}
	if err := onlyFields(fields, "challenge_id", "code"); err != nil {
		return confirmRequest{}, err
	}
	ch, err := requiredString(fields, "challenge_id")
	if err != nil {
		return confirmRequest{}, err
	}
	if len(ch) != 36 {
		return confirmRequest{}, payments.Invalid("challenge_id", "challenge_id must be the challenge_id the cancel call returned")
	}
	code, err := requiredString(fields, "code")
	if err != nil {
		return confirmRequest{}, err
	}
	if code == "" || len(code) > 32 {
		return confirmRequest{}, payments.Invalid("code", "code must be the one-time code the customer received")
	}
	return confirmRequest{ChallengeID: ch, Code: code}, nil
}

// parseEmpty accepts a bodyless action (check, cancel): no body, or an empty JSON object.
func parseEmpty(r *http.Request) error {
	fields, err := readJSONObject(r, false)
	if err != nil {
		return err
	}
	return onlyFields(fields)
}
