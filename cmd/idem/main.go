// Command idem runs the idem toolkit from the shell: the demo, inbox
// migrations and maintenance, duplicate audits and benchmarks.
//
//	idem <command> [flags]
//
// Each command lives in its own file and registers itself in commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand of idem. Run gets the arguments after the
// command's name (and any sub-subcommand) and writes to stdout/stderr.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("idem: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// exitError carries a specific exit status (for example `audit check`,
// which exits 1 when it finds duplicates) without printing more.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// localDatabaseURL is the database commands use when neither --database nor
// IDEM_DATABASE_URL names one: the local test server.
const localDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// databaseFlagHelp documents a --database flag.
const databaseFlagHelp = "PostgreSQL URL (default $IDEM_DATABASE_URL, else " + localDatabaseURL + ")"

// databaseURL resolves a --database flag: the flag, else IDEM_DATABASE_URL,
// else localDatabaseURL. It is resolved at use rather than as the flag's
// default, so -h never prints a password taken from the environment.
func databaseURL(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if u := os.Getenv("IDEM_DATABASE_URL"); u != "" {
		return u
	}
	return localDatabaseURL
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "idem: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	err := c.run(ctx, args[1:], stdout, stderr)
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintln(stderr, "idem "+c.name+": "+ee.msg)
		}
		return ee.code
	default:
		fmt.Fprintf(stderr, "idem %s: %v\n", c.name, err)
		return 1
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: idem <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'idem <command> -h' for a command's flags.")
}
