// Command idem runs the idem toolkit from the shell: the demo, inbox
// migrations and maintenance, duplicate audits and benchmarks.
//
//	idem <command> [subcommand] [flags]
//
// Help: 'idem -h', 'idem help <command>' and '<any command> -h' (or --help)
// print their help on stdout and exit 0.
//
// Exit status, the same for every command:
//
//	0  success: done, or nothing to do
//	1  findings: the command ran and found what it looks for (duplicates,
//	   a failed demo, a refused void); the result says what
//	2  usage: a bad flag, argument or command; nothing was done
//	3  runtime: the command could not run or finish (database unreachable
//	   or silent past --connect-timeout, a missing table, an error, an
//	   interruption by SIGINT or SIGTERM)
//
// Errors go to stderr as one line "idem <command>: <message>". With --json,
// an error (exit 2 or 3) is also written to stdout as one JSON object,
//
//	{"error": "<message>", "exit": 3, "command": "inbox stats"}
//
// so a script that reads stdout always gets JSON: the result on exit 0 and
// 1, this object on exit 2 and 3.
//
// Commands that connect to PostgreSQL take --database (default
// $IDEM_DATABASE_URL, else the local test server) and --connect-timeout
// (default 10s; a connect_timeout in the URL is kept unless the flag is
// given): a server that accepts the connection but never answers fails the
// command with exit 3 instead of hanging it.
//
// Numeric flags are checked by name ("--batch must be positive"); where 0
// means something other than a default, the flag's help says what.
//
// Each command lives in its own file and registers itself in commands.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idembroker"
)

// Exit statuses; see the package documentation.
const (
	exitOK       = 0
	exitFindings = 1
	exitUsage    = 2
	exitRuntime  = 3
)

// command is one subcommand of idem. Run gets the arguments after the
// command's name (and any sub-subcommand) and writes to stdout/stderr.
//
// Run returns nil for success; flag.ErrHelp after printing help (exit 0);
// a usage error from usagef or cmdFlags (exit 2); an *exitError with code
// exitFindings for findings (exit 1, the result already printed); any
// other error for a runtime failure (exit 3). run prints the error; a
// command never prints its own.
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

// exitError carries a specific exit status, above all exitFindings (for
// example `audit check`, which exits 1 when it finds duplicates), with an
// optional message; an empty one prints nothing more.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// usageError is a mistake in the command line: exit 2, printed with a
// pointer to the command's help.
type usageError struct {
	cmd string // "inbox stats"; empty: the top-level command
	msg string
}

func (e *usageError) Error() string { return e.msg }

// usagef returns a usage error (exit 2) with a message in the user's
// terms, naming the flag or argument at fault ("--events must be
// positive"). cmdFlags.usagef names the subcommand's help instead of the
// command's.
func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// localDatabaseURL is the database commands use when neither --database nor
// IDEM_DATABASE_URL names one: the local test server.
const localDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// databaseFlagHelp documents a --database flag.
const databaseFlagHelp = "PostgreSQL URL (default $IDEM_DATABASE_URL, else " + localDatabaseURL + ")"

// defaultConnectTimeout bounds how long a command waits for PostgreSQL to
// accept and answer a connection.
const defaultConnectTimeout = 10 * time.Second

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

// dbFlags are --database and --connect-timeout, for every command that
// connects to PostgreSQL.
type dbFlags struct {
	fs             *flag.FlagSet
	database       string
	connectTimeout time.Duration
}

// add defines the flags on fs.
func (d *dbFlags) add(fs *flag.FlagSet) {
	d.fs = fs
	fs.StringVar(&d.database, "database", "", databaseFlagHelp)
	fs.DurationVar(&d.connectTimeout, "connect-timeout", defaultConnectTimeout, "give up when PostgreSQL has not accepted and answered a connection within this time (0: no limit; without the flag, a connect_timeout in --database is kept)")
}

// validate refuses a negative --connect-timeout.
func (d *dbFlags) validate() error {
	if d.connectTimeout < 0 {
		return usagef("--connect-timeout must not be negative (0: no limit)")
	}
	return nil
}

// timeoutGiven reports whether --connect-timeout is on the command line.
func (d *dbFlags) timeoutGiven() bool {
	given := false
	d.fs.Visit(func(f *flag.Flag) { given = given || f.Name == "connect-timeout" })
	return given
}

// pool opens a pool on the database the flags name and checks that it
// answers, within --connect-timeout per connection.
func (d *dbFlags) pool(ctx context.Context) (*pgxpool.Pool, error) {
	return openPool(ctx, databaseURL(d.database), d.connectTimeout, d.timeoutGiven())
}

// openPool opens a pool on dbURL whose every connection attempt is bounded
// by timeout (0: no limit), and pings it, so that an unreachable or silent
// server fails here, with a message naming the timeout, rather than in the
// first query. Unless override is set, a connect_timeout the URL gives is
// kept: timeout is the default for URLs without one.
func openPool(ctx context.Context, dbURL string, timeout time.Duration, override bool) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, usagef("--database %s is not a PostgreSQL URL (such as postgres://user@host:5432/db)", redactURL(dbURL))
	}
	source := "--connect-timeout"
	if override || cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = timeout
	} else {
		source = "connect_timeout in --database"
	}
	timeout = cfg.ConnConfig.ConnectTimeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", redactURL(dbURL), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		if ctx.Err() == nil && timeout > 0 && (pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded)) {
			return nil, fmt.Errorf("connecting to %s: no answer within %s (%s): the server is unreachable or not answering", redactURL(dbURL), timeout, source)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connecting to %s: %w", redactURL(dbURL), ctx.Err())
		}
		return nil, fmt.Errorf("connecting to %s: %s", redactURL(dbURL), connectReason(err))
	}
	noteDatabase(ctx, "PostgreSQL "+redactURL(dbURL))
	return pool, nil
}

// connectReason says in one line why a connection failed: the server's
// refusal (authentication, unknown database) or the network's, rather than
// pgx's report of every address and attempt on lines of their own.
func connectReason(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Err != nil && opErr.Addr != nil {
		return opErr.Op + " " + opErr.Addr.String() + ": " + opErr.Err.Error()
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return dnsErr.Error()
	}
	line, _, _ := strings.Cut(err.Error(), "\n")
	return strings.TrimSuffix(line, ":")
}

// redactURL hides a password in a database URL or keyword/value string.
func redactURL(s string) string { return idembroker.RedactURL(s) }

// cmdFlags is a flag set with the command line's conventions: -h and
// --help print the help on stdout (exit 0); a bad flag is a usage error
// (exit 2) printed once, on stderr, with a pointer to the help.
type cmdFlags struct {
	*flag.FlagSet
	name     string // "inbox stats"
	synopsis string // after the name: "[flags]", "--table T --key c1,c2 [flags]"
	doc      string
	stdout   io.Writer
	hidden   map[string]bool // deprecated spellings, not listed
}

// alias defines old as a deprecated spelling of the flag named name: the
// same value, accepted as before and not listed in the help.
func (f *cmdFlags) alias(old, name string) {
	f.Var(f.Lookup(name).Value, old, "deprecated: the same as --"+name)
	if f.hidden == nil {
		f.hidden = map[string]bool{}
	}
	f.hidden[old] = true
}

// newCmdFlags returns the flag set of `idem <name>`.
func newCmdFlags(name, synopsis, doc string, stdout io.Writer) *cmdFlags {
	f := &cmdFlags{FlagSet: flag.NewFlagSet("idem "+name, flag.ContinueOnError), name: name, synopsis: synopsis, doc: doc, stdout: stdout}
	// The flag package prints its errors and the usage itself; run prints
	// them instead, once, on the right stream.
	f.SetOutput(io.Discard)
	f.Usage = func() {}
	return f
}

// help prints the command's usage, doc and flags to w.
func (f *cmdFlags) help(w io.Writer) {
	fmt.Fprintf(w, "usage: idem %s %s\n\n", f.name, f.synopsis)
	if f.doc != "" {
		fmt.Fprintf(w, "%s\n\n", strings.TrimRight(f.doc, "\n"))
	}
	fmt.Fprintln(w, "flags:")
	f.printFlags(w)
	fmt.Fprintf(w, "\nexit status: 0 ok, 1 findings, 2 usage, 3 runtime error (see idem -h)\n")
}

// parse parses args. It returns flag.ErrHelp after printing the help for
// -h, and a usage error for a bad flag or, unless positional is set, for
// any argument left over.
func (f *cmdFlags) parse(args []string, positional bool) error {
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.help(f.stdout)
			return flag.ErrHelp
		}
		return f.usagef("%s", f.flagError(err))
	}
	if !positional && f.NArg() > 0 {
		return f.usagef("unexpected argument %q (this command takes flags only)", f.Arg(0))
	}
	return nil
}

// usagef is a usage error pointing at this command's help.
func (f *cmdFlags) usagef(format string, args ...any) error {
	return &usageError{cmd: f.name, msg: fmt.Sprintf(format, args...)}
}

// flagError rewords the flag package's errors with the flag as typed
// ("--batch") and what its value should look like.
func (f *cmdFlags) flagError(err error) string {
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "unknown flag --" + rest
	}
	if rest, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return "--" + rest + " needs a value"
	}
	// invalid boolean value "x" for -apply: parse error
	if rest, ok := strings.CutPrefix(msg, "invalid boolean value "); ok {
		if val, name, ok := strings.Cut(rest, " for -"); ok {
			name, _, _ = strings.Cut(name, ":")
			return fmt.Sprintf("--%s=%s: want true or false (or the flag alone)", name, val)
		}
	}
	// invalid value "x" for flag -batch: parse error
	rest, ok := strings.CutPrefix(msg, "invalid value ")
	i := strings.Index(rest, " for flag -")
	if !ok || i < 0 {
		return msg
	}
	val := rest[:i]
	name, why, _ := strings.Cut(rest[i+len(" for flag -"):], ": ")
	if fl := f.Lookup(name); fl != nil {
		switch typ, _ := flag.UnquoteUsage(fl); typ {
		case "int":
			why = "want a whole number"
		case "duration":
			why = "want a duration such as 90s, 10m or 720h"
		case "":
			why = "want true or false"
		}
	}
	return fmt.Sprintf("--%s %s: %s", name, val, why)
}

// printFlags lists the flags as they are typed, with two dashes.
func (f *cmdFlags) printFlags(w io.Writer) {
	f.VisitAll(func(fl *flag.Flag) {
		if f.hidden[fl.Name] {
			return
		}
		typ, usage := flag.UnquoteUsage(fl)
		line := "  --" + fl.Name
		if typ != "" {
			line += " " + typ
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		switch fl.DefValue {
		case "", "0", "false", "0s":
		default:
			if typ == "string" {
				line += fmt.Sprintf(" (default %q)", fl.DefValue)
			} else {
				line += fmt.Sprintf(" (default %s)", fl.DefValue)
			}
		}
		fmt.Fprintln(w, line)
	})
}

// positive refuses a numeric flag under 1, naming it: 0 never silently
// means a default.
func (f *cmdFlags) positive(flagName string, v int) error {
	if v < 1 {
		return f.usagef("--%s must be positive (got %d)", flagName, v)
	}
	return nil
}

// wantsJSON reports whether the command line asks for JSON output, so that
// even an error found before the command's own flags are parsed is
// printed as JSON.
func wantsJSON(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "json" {
			continue
		}
		if !hasVal {
			return true
		}
		b, err := strconv.ParseBool(val)
		return err == nil && b
	}
	return false
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command line args and returns its exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	jsonOut := wantsJSON(args)
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "-help":
		usage(stdout)
		return exitOK
	case "help":
		if len(args) == 1 || isHelp(args[1]) {
			// idem help, idem help help, idem help -h: the top-level help.
			usage(stdout)
			return exitOK
		}
		// idem help inbox stats == idem inbox stats -h
		args = append(append([]string(nil), args[1:]...), "-h")
	}
	c, ok := commands[args[0]]
	if !ok {
		return report(stdout, stderr, jsonOut, "", &usageError{msg: fmt.Sprintf("unknown command %q", args[0])})
	}
	var note *databaseNote
	if !jsonOut && c.name != "migrate" {
		// migrate names its database itself, in its report.
		ctx, note = withDatabaseNote(ctx, stderr, commandPath(args))
	}
	err := c.run(ctx, args[1:], stdout, stderr)
	var findings *exitError
	if note != nil && (err == nil || errors.As(err, &findings)) {
		note.print()
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// SIGINT or SIGTERM: say so rather than "context canceled".
		err = fmt.Errorf("interrupted: %w", err)
	}
	return report(stdout, stderr, jsonOut, commandPath(args), err)
}

// commandPath names the command being run for its error line: the words
// before the first flag, at most three ("inbox window set").
func commandPath(args []string) string {
	var words []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") || len(words) == 3 {
			break
		}
		words = append(words, a)
	}
	return strings.Join(words, " ")
}

// report prints err as the package documentation says and returns the exit
// status it maps to.
func report(stdout, stderr io.Writer, jsonOut bool, name string, err error) int {
	code, msg, cmd := exitOK, "", name
	var ue *usageError
	var ee *exitError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		code, msg = exitUsage, ue.msg
		if ue.cmd != "" {
			cmd = ue.cmd
		}
	case errors.As(err, &ee):
		code, msg = ee.code, ee.msg
	default:
		code, msg = exitRuntime, err.Error()
	}
	if msg != "" {
		prefix := "idem"
		if cmd != "" {
			prefix += " " + cmd
		}
		fmt.Fprintf(stderr, "%s: %s\n", prefix, msg)
	}
	if code == exitUsage {
		help := "idem -h"
		if cmd != "" {
			help = "idem " + cmd + " -h"
		}
		fmt.Fprintf(stderr, "Run '%s' for usage.\n", help)
	}
	if jsonOut && code >= exitUsage {
		if msg == "" {
			msg = "exit status " + strconv.Itoa(code)
		}
		b, _ := json.Marshal(struct {
			Error   string `json:"error"`
			Exit    int    `json:"exit"`
			Command string `json:"command,omitempty"`
		}{msg, code, cmd})
		fmt.Fprintf(stdout, "%s\n", b)
	}
	return code
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: idem <command> [subcommand] [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprint(w, `
Run 'idem <command> -h' (or 'idem help <command>') for a command's flags.

exit status:
  0  success
  1  findings: the command ran and found what it looks for (duplicates,
     a failed demo, a refused void)
  2  usage: a bad flag, argument or command; nothing was done
  3  runtime: the command could not run or finish (database unreachable
     or silent past --connect-timeout, missing table, other errors)

Errors go to stderr. With --json, an error (exit 2 or 3) is also printed to
stdout as {"error": "...", "exit": N, "command": "..."}, so stdout is always JSON.
Commands that connect take --database and --connect-timeout (default 10s).
`)
}
