package main

import (
	"context"

	"pitlane/payments/gateway/gatewaysim"
)

// runGatewaysim: `pitlane gatewaysim [--addr :8090] [flags]`, the reference-gateway simulator on
// its own, with fault injection (flags and the /_sim control API: see `pitlane gatewaysim -h`).
func runGatewaysim(ctx context.Context, env *Env, args []string) error {
	return gatewaysim.Main(ctx, args, env.Stdout, env.Stderr)
}
