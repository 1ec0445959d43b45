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

	"pitlane/access"
	"pitlane/payments"
)

const userUsage = "usage: pitlane user create --email E --role support|finance|admin | disable E | enable E | role E ROLE | password E (passwords on stdin)"

// runUser: console users from the command line (contract: pitlane user …). Passwords are read
// from the first line of standard input, so they never show in the process list or the shell
// history:
//
//	printf '%s\n' "$PASSWORD" | pitlane user create --email ana@example.com --role support
//	pitlane user disable ana@example.com         # offboarding: her sessions end at her next request
//	pitlane user enable ana@example.com          # undoes it: her password works again, her old sessions do not
//	pitlane user role ana@example.com finance
//	printf '%s\n' "$NEW" | pitlane user password ana@example.com   # also ends her sessions
//
// Bad input (email, role, a password shorter than access.MinPasswordLength) exits 2 with one
// line; an unknown email, an email already taken, or a change that would leave no enabled admin
// exits 1. Every change is in the audit log as "cli:<os user>".
func runUser(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 {
		return Usagef(userUsage)
	}
	switch sub, rest := args[0], args[1:]; {
	case sub == "create":
		return userCreate(ctx, env, rest)
	case sub == "disable" && len(rest) == 1:
		return userChange(ctx, env, rest[0], func(acc *access.Service, email string) (access.User, string, error) {
			u, err := acc.DisableUser(ctx, cliActor(), email)
			return u, fmt.Sprintf("user: disabled %s; their sessions end at their next request", email), err
		})
	case sub == "enable" && len(rest) == 1:
		return userChange(ctx, env, rest[0], func(acc *access.Service, email string) (access.User, string, error) {
			u, err := acc.EnableUser(ctx, cliActor(), email)
			return u, fmt.Sprintf("user: enabled %s; they sign in with their password (sessions from before the disable stay ended)", email), err
		})
	case sub == "role" && len(rest) == 2:
		role := access.Role(rest[1])
		return userChange(ctx, env, rest[0], func(acc *access.Service, email string) (access.User, string, error) {
			u, err := acc.SetRole(ctx, cliActor(), email, role)
			return u, fmt.Sprintf("user: %s is now %s", email, role), err
		}, access.ValidateRole(role))
	case sub == "password" && len(rest) == 1:
		password, err := readPassword(env.Stdin, "password")
		if err != nil {
			return err
		}
		return userChange(ctx, env, rest[0], func(acc *access.Service, email string) (access.User, string, error) {
			u, err := acc.SetPassword(ctx, cliActor(), email, password)
			return u, fmt.Sprintf("user: new password for %s; their sessions are ended", email), err
		}, access.ValidatePassword(password))
	}
	return Usagef(userUsage)
}

func userCreate(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("user create", flag.ContinueOnError)
	email := fs.String("email", "", "the user's email (their sign-in name)")
	role := fs.String("role", "", "support, finance or admin")
	if err := parseFlags(env, fs, userUsage, args); err != nil {
		return err
	}
	if fs.NArg() > 0 || *email == "" || *role == "" {
		return Usagef(userUsage)
	}
	password, err := readPassword(env.Stdin, "create")
	if err != nil {
		return err
	}
	addr := access.NormalizeEmail(*email)
	if err := access.ValidateUser(addr, access.Role(*role), password); err != nil {
		return Usagef("user create: %s", payments.ErrorMessage(err))
	}
	acc, closeDB, err := openAccess(ctx, env, "user")
	if err != nil {
		return err
	}
	defer closeDB()
	u, err := acc.CreateUser(ctx, cliActor(), addr, access.Role(*role), password)
	if err != nil {
		if payments.ErrorCode(err) == payments.ECONFLICT {
			return errors.New(payments.ErrorMessage(err))
		}
		return fmt.Errorf("create staff user: %w", err)
	}
	fmt.Fprintf(env.Stdout, "user: created %s (%s)\n", u.Email, u.Role)
	return nil
}

// userChange checks the input (exit 2 when invalid), then applies change to the named user and
// prints what it did. A refusal of the rules (no such user, the last admin) is one line, exit 1.
func userChange(ctx context.Context, env *Env, typed string, change func(*access.Service, string) (access.User, string, error), checks ...error) error {
	email := access.NormalizeEmail(typed)
	if err := access.CheckAddress(email); err != nil { // an existing account's, whatever rules came since
		return Usagef("user: %s", payments.ErrorMessage(err))
	}
	for _, err := range checks {
		if err != nil {
			return Usagef("user: %s", payments.ErrorMessage(err))
		}
	}
	acc, closeDB, err := openAccess(ctx, env, "user")
	if err != nil {
		return err
	}
	defer closeDB()
	// The row the operator named (access.UserNamed: refused when a row stored before emails
	// were composed looks like another account), changed by its own stored email.
	var msg string
	u, err := acc.UserNamed(ctx, typed)
	if err == nil {
		_, msg, err = change(acc, u.Email)
	}
	if err != nil {
		switch payments.ErrorCode(err) {
		case payments.ENOTFOUND, payments.ECONFLICT, payments.EINVALID:
			return errors.New(payments.ErrorMessage(err))
		}
		return err
	}
	fmt.Fprintln(env.Stdout, msg)
	return nil
}

// cliActor is who the audit log names for a change made on the command line.
func cliActor() payments.Staff {
	actor := "cli"
	if cu, err := user.Current(); err == nil {
		actor = "cli:" + cu.Username
	}
	return payments.Staff{Email: actor}
}

// readPassword reads the first line of r (without its line ending).
func readPassword(r io.Reader, sub string) (string, error) {
	if r == nil {
		return "", Usagef("user %s: the password is read from standard input, which is empty", sub)
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read password from standard input: %w", err)
	}
	// A byte-order mark an editor put at the start of a password file is the file's, not the
	// password's (an outside review: a password nobody could type was set).
	line = strings.TrimPrefix(strings.TrimRight(line, "\r\n"), "\uFEFF")
	if line == "" {
		return "", Usagef("user %s: no password on standard input (pipe it in: printf '%%s\\n' \"$PW\" | pitlane user %s …)", sub, sub)
	}
	return line, nil
}
