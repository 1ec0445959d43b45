package config

import (
	"errors"
	"net/url"
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
	if v := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); v != "" {
		if err := checkEndpoint(v); err != nil {
			return "", errorf("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "%v", err)
		}
		return v, nil
	}
	if v := getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); v != "" {
		if err := checkEndpoint(v); err != nil {
			return "", errorf("OTEL_EXPORTER_OTLP_ENDPOINT", "%v", err)
		}
		return strings.TrimRight(v, "/") + "/v1/traces", nil
	}
	return "", nil
}

// checkEndpoint is checkHTTPURL without quoting the value: a collector URL may carry credentials.
func checkEndpoint(v string) error {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("not an absolute http(s) URL (e.g. http://otel-collector:4318)")
	}
	return nil
}
