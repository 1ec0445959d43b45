//go:build !linux

package pgrunner

import "syscall"

// childAttr without a parent-death signal (Linux only): on other systems Stop must run.
func childAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}
