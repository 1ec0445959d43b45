//go:build linux

package pgrunner

import "syscall"

// childAttr: own process group (a terminal's Ctrl-C goes to us, and we stop the server in
// order), the postgres user's credentials when we are root, and the parent-death signal that
// makes an orphaned postmaster impossible: if we die, even by SIGKILL, the kernel sends it
// SIGINT (fast shutdown). SIGINT rather than SIGTERM because SIGTERM ("smart") would wait for
// clients such as a still-running test binary to disconnect. Go applies Pdeathsig after
// switching credentials, so the setuid does not clear it.
func childAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGINT, Credential: cred}
}
