package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"sync/atomic"

	"pitlane/payments/gateway/gatewaysim"
)

// runGatewaysim: `pitlane gatewaysim [--addr 127.0.0.1:8090] [flags]`, the reference-gateway simulator on
// its own, with fault injection (flags and the /_sim control API: see `pitlane gatewaysim -h`).
//
// An error before the simulator listens (a bad flag, a missing webhook secret, an address it
// cannot bind) is a usage error, exit 2 like every bad setting; after that, a failure is exit 1.
func runGatewaysim(ctx context.Context, env *Env, args []string) error {
	out := &listenWatcher{w: env.Stdout}
	err := gatewaysim.Main(ctx, args, out, env.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h: its flags were listed
	}
	if err != nil && !out.listening.Load() {
		return Usagef("%s", strings.TrimPrefix(err.Error(), "gatewaysim: "))
	}
	return err
}

// listenWatcher passes output through and notes Main's "gatewaysim listening on" line.
type listenWatcher struct {
	w         io.Writer
	listening atomic.Bool
}

func (l *listenWatcher) Write(p []byte) (int, error) {
	if strings.Contains(string(p), "gatewaysim listening on ") {
		l.listening.Store(true)
	}
	return l.w.Write(p)
}
