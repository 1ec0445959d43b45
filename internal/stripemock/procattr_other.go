//go:build !linux

package stripemock

import "os/exec"

// setParentDeathSignal has no portable equivalent off Linux; cleanup kills the process.
func setParentDeathSignal(*exec.Cmd) {}
