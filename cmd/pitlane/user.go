package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/user"
	"strings"

	"pitlane/payments"
)

// runUser: `pitlane user create --email E --role support|finance|admin`, the password read from
// the first line of standard input (so it never shows in the process list or shell history):
//
//	printf '%s\n' "$PASSWORD" | pitlane user create --email ana@example.com --role support
//
// Bad input (email, role, a password shorter than payments.MinPasswordLength) exits 2 with one
// line; an email already taken exits 1.
func runUser(ctx context.Context, env *Env, args []string) error {
	const usage = "usage: pitlane user create --email E --role support|finance|admin (password on stdin)"
	if len(args) == 0 || args[0] != "create" {
		return Usagef(usage)
	}
	fs := flag.NewFlagSet("user create", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	email := fs.String("email", "", "the user's email (their sign-in name)")
	role := fs.String("role", "", "support, finance or admin")
	if err := fs.Parse(args[1:]); err != nil {
		return Usagef("user create: %v (%s)", err, usage)
	}
	if fs.NArg() > 0 || *email == "" || *role == "" {
		return Usagef(usage)
	}
	password, err := readPassword(env.Stdin)
	if err != nil {
		return err
	}
	addr := payments.NormalizeEmail(*email)
	if err := payments.ValidateStaffUser(addr, payments.Role(*role), password); err != nil {
		return Usagef("user create: %s", payments.ErrorMessage(err))
	}
	svc, closeDB, err := adminService(ctx, env, "user")
	if err != nil {
		return err
	}
	defer closeDB()
	u, err := svc.CreateStaffUser(ctx, addr, payments.Role(*role), password)
	if err != nil {
		if payments.ErrorCode(err) == payments.ECONFLICT {
			return errors.New(payments.ErrorMessage(err))
		}
		return fmt.Errorf("create staff user: %w", err)
	}
	actor := "cli"
	if cu, err := user.Current(); err == nil {
		actor = "cli:" + cu.Username
	}
	if err := svc.RecordAudit(ctx, payments.AuditEntry{Actor: actor, Action: payments.AuditUserCreate, Target: u.Email, Detail: "role " + string(u.Role)}); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "user: created %s (%s)\n", u.Email, u.Role)
	return nil
}

// readPassword reads the first line of r (without its line ending).
func readPassword(r io.Reader) (string, error) {
	if r == nil {
		return "", Usagef("user create: the password is read from standard input, which is empty")
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read password from standard input: %w", err)
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", Usagef("user create: no password on standard input (pipe it in: printf '%%s\\n' \"$PW\" | pitlane user create …)")
	}
	return line, nil
}
