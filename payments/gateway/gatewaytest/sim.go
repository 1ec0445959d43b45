package gatewaytest

import (
	"context"

	"pitlane/payments/gateway/gatewaysim"
)

// SimControls drives a pitlane simulator through its /_sim control API, for running the suite
// against `pitlane gatewaysim` (in this process or another).
func SimControls(r *gatewaysim.Remote) Controls {
	return Controls{
		Succeed: r.Succeed,
		Decline: func(ctx context.Context, id string) error { return r.Decline(ctx, id, "") },
		Expire:  r.Expire,
		HoldRegister: func(ctx context.Context) (func(context.Context, int) error, func(context.Context) error, error) {
			if err := r.Pause(ctx, gatewaysim.OpRegister); err != nil {
				return nil, nil, err
			}
			parked := func(ctx context.Context, n int) error { return r.WaitParked(ctx, gatewaysim.OpRegister, n) }
			release := func(ctx context.Context) error { return r.Release(ctx, gatewaysim.OpRegister) }
			return parked, release, nil
		},
	}
}
