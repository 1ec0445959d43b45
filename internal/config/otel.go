package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// tracesEndpoint reads the standard OpenTelemetry variables that decide whether pitlane exports
// traces, and where to: the URL spans are POSTed to over OTLP/HTTP, or "" for no export at all.
//
//   - OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: the traces URL, used as it is;
//   - else OTEL_EXPORTER_OTLP_ENDPOINT: the collector's base URL, + "/v1/traces" (the spec's rule);
//   - neither, OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true: "".
//
// OTLP over gRPC and over HTTP/JSON are refused rather than silently sent as HTTP/protobuf to a
// port that does not speak it. The SDK reads the rest of the OTEL_* variables itself (headers,
// timeout, compression, certificates, sampler, batching, resource attributes).
func tracesEndpoint(getenv func(string) string) (string, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return "", nil
	}
	switch v := getenv("OTEL_TRACES_EXPORTER"); v {
	case "", "otlp":
	case "none":
		return "", nil
	default:
		return "", errorf("OTEL_TRACES_EXPORTER", "pitlane exports traces with otlp only (or none), got %q", v)
	}
	protoVar := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	proto := getenv(protoVar)
	if proto == "" {
		protoVar, proto = "OTEL_EXPORTER_OTLP_PROTOCOL", getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto != "" && proto != "http/protobuf" {
		return "", errorf(protoVar, "pitlane sends OTLP as http/protobuf only, got %q (point the endpoint at the collector's OTLP/HTTP port, 4318 by default)", proto)
	}
	endpoint := ""
	if v := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); v != "" {
		if err := checkEndpoint(v); err != nil {
			return "", errorf("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "%v", err)
		}
		endpoint = v
	} else if v := getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); v != "" {
		if err := checkEndpoint(v); err != nil {
			return "", errorf("OTEL_EXPORTER_OTLP_ENDPOINT", "%v", err)
		}
		endpoint = strings.TrimRight(v, "/") + "/v1/traces"
	}
	if endpoint == "" {
		return "", nil
	}
	if err := checkSDKSettings(getenv); err != nil {
		return "", err
	}
	return endpoint, nil
}

// checkSDKSettings checks the variables the OpenTelemetry SDK reads itself, when traces are
// exported. On a bad value the SDK prints it with its own logger — a collector's token, for a
// header written "Authorization: Bearer …" instead of "authorization=Bearer …" — and goes on
// without it (no auth header, the default sampler, no CA). Here a bad value stops the binary
// like every other setting, and a header's value is never quoted.
func checkSDKSettings(getenv func(string) string) error {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		v := getenv(name)
		if v == "" {
			continue
		}
		for i, kv := range strings.Split(v, ",") {
			key, val, ok := strings.Cut(kv, "=")
			_, kerr := url.PathUnescape(strings.TrimSpace(key))
			_, verr := url.PathUnescape(strings.TrimSpace(val))
			if !ok || strings.TrimSpace(key) == "" || kerr != nil || verr != nil {
				return errorf(name, "entry %d of the list is not key=value with URL-encoded parts (e.g. authorization=Bearer%%20TOKEN); "+
					"its value is not shown here: it may be a secret", i+1)
			}
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
		"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"} {
		if v := getenv(name); v != "" {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err != nil || n < 0 {
				return errorf(name, "%q is not a whole number (milliseconds for a timeout or delay) of 0 or more", v)
			}
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"} {
		if v := strings.TrimSpace(getenv(name)); v != "" && v != "gzip" && v != "none" {
			return errorf(name, "must be gzip or none, got %q", v)
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"} {
		if path := getenv(name); path != "" {
			pem, err := os.ReadFile(path)
			if err != nil {
				return errorf(name, "cannot read the collector's CA certificate: %v", err)
			}
			if !x509.NewCertPool().AppendCertsFromPEM(pem) {
				return errorf(name, "%s holds no PEM certificate", path)
			}
		}
	}
	for _, prefix := range []string{"OTEL_EXPORTER_OTLP_", "OTEL_EXPORTER_OTLP_TRACES_"} {
		cert, key := getenv(prefix+"CLIENT_CERTIFICATE"), getenv(prefix+"CLIENT_KEY")
		if cert == "" && key == "" {
			continue
		}
		if cert == "" || key == "" {
			return errorf(prefix+"CLIENT_CERTIFICATE", "the client certificate and %sCLIENT_KEY go together", prefix)
		}
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			return errorf(prefix+"CLIENT_CERTIFICATE", "cannot load the client certificate and key: %s", oneLine(err.Error()))
		}
	}
	sampler := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER"))
	switch sampler {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off", "traceidratio", "parentbased_traceidratio":
	default:
		return errorf("OTEL_TRACES_SAMPLER", "must be always_on, always_off, traceidratio or their parentbased_ forms, got %q", sampler)
	}
	if arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG")); arg != "" && strings.HasSuffix(sampler, "traceidratio") {
		if r, err := strconv.ParseFloat(arg, 64); err != nil || r < 0 || r > 1 {
			return errorf("OTEL_TRACES_SAMPLER_ARG", "must be a ratio from 0 to 1 for %s, got %q", sampler, arg)
		}
	}
	return nil
}

// checkEndpoint is checkHTTPURL without quoting the value: a collector URL may carry credentials.
func checkEndpoint(v string) error {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("not an absolute http(s) URL (e.g. http://otel-collector:4318)")
	}
	return nil
}
