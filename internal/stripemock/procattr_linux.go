package stripemock

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal kills stripe-mock if the test binary dies without running its cleanups
// (a panic, `go test -timeout`), so no orphaned server outlives the run.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
