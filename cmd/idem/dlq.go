package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/dlq"
)

func init() {
	register(command{name: "dlq", summary: "dead letters: list, show, redrive, purge and replay (RabbitMQ queues, Kafka topics, JetStream streams)", run: runDLQ})
}

const dlqUsage = `usage: idem dlq <list|show|redrive|purge|replay|ddl> (--queue Q | --topic T) [flags]

Dead letters of a RabbitMQ dead-letter queue (--queue, as idemrabbitmq fills
it), a Kafka dead-letter topic (--topic) or a NATS JetStream dead-letter
stream (--stream, with --nats URL):
  list     group the letters by reason and consumer: counts, oldest and newest, attempts
  show     one letter: headers, body, reason, and what a redrive would do (apply,
           skip as a duplicate, expire), judged from the inbox and its window
  redrive  send letters back to their origin queue or topic (dry run unless --apply)
  purge    remove letters for good (dry run unless --apply)
  replay   apply again a message whose key has a marker: retire the marker to the
           audit table idem_inbox_retired (who, when, why), then redrive (dry run
           unless --apply)
  ddl      print the CREATE TABLE of idem_inbox_retired, for a migration tool (the
           first replay creates it otherwise)

show, redrive and replay judge each letter with the consumer's inbox key:
--key says how the consumer derives it (id, the default; json:/pointer;
template:TEXT).

A letter leaves its DLQ only after the broker confirmed its republish: a
failure in between leaves a copy in both places, and the inbox absorbs the
second. A replay retires a key's marker once per run (more copies of the
message are redriven plainly), refuses a copy whose marker a replay of the
same message wrote, and puts the marker back if the republish fails.

Reading spends nothing: a read of a RabbitMQ DLQ copies each letter back
to the queue (publisher confirm) before it acknowledges it, so no list,
show or dry run counts against a quorum queue's delivery limit, whatever
it is, and the letters keep their order; a Kafka read commits no offset; a
JetStream read gets each message by its sequence, through no consumer.
A JetStream redrive keeps Nats-Msg-Id: inside the origin stream's
duplicate window it is refused (the stream would drop it as a duplicate of
the original) and the letter stays; redrive it once the window has passed.

A Redis dead-letter stream, as idemredis fills it, is named with --stream S
(and --redis URL): a read is XRANGE, which moves no group and counts no
delivery; a redrive copies the letter to its origin stream and deletes it
in one atomic script.

Exit 1 when letters were refused or stayed in the DLQ; with --json, a run
that fails part-way prints one error object that says what it did.

Run 'idem dlq <subcommand> -h' for its flags.
`

func runDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, dlqUsage)
		return &usageError{cmd: "dlq", msg: "missing subcommand"}
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "list":
		return dlqList(ctx, rest, stdout, stderr)
	case "show":
		return dlqShow(ctx, rest, stdout)
	case "redrive", "purge", "replay":
		return dlqAct(ctx, sub, rest, stdout, stderr)
	case "ddl":
		return dlqDDL(rest, stdout)
	case "-h", "--help", "-help", "help":
		fmt.Fprint(stdout, dlqUsage)
		return nil
	default:
		return &usageError{cmd: "dlq", msg: fmt.Sprintf("unknown subcommand %q (want list, show, redrive, purge, replay or ddl)", sub)}
	}
}

// defaultAMQPURL is the broker when neither --amqp nor IDEM_AMQP_URL names one.
const defaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

// dlqFlags are the flags every dlq subcommand shares.
type dlqFlags struct {
	fs       *cmdFlags
	db       dbFlags
	amqpURL  string
	queue    string
	brokers  string
	topic    string
	redisURL string
	natsURL  string
	stream   string // a NATS JetStream or Redis dead-letter stream
	group    string
	idHeader string
	table    string
	consumer string // for letters that name none
	key      string // how the consumers derive their inbox key
	keyFunc  idem.KeyFunc
	limit    int // --delivery-limit, ignored: reads spend no delivery
	timeHdr  string
	ahead    time.Duration
	untimed  bool // the consumer refuses untimed messages
	jsonOut  bool
	inbox    bool // the subcommand judges letters against the inbox
}

// keyDoc documents --key.
const keyDoc = "how the consumer derives its inbox key, to judge with: id (the message ID, idem.ByMessageID), json:/pointer (the string or number at a JSON pointer into the body) or template:TEXT ({id} and {/pointer} replaced: template:invoice:{/customer}:{/period}); a verdict made with another key than the consumer's is wrong"

// parseKey reads --key: a verdict made with another key than the
// consumer's is wrong, and a replay would retire the wrong marker, or
// none.
func (f *dlqFlags) parseKey() error {
	if strings.TrimSpace(f.key) == "" {
		return f.fs.usagef("--key is empty: %s", keyDoc)
	}
	k, err := dlq.ParseKey(f.key)
	if err != nil {
		return f.fs.usagef("--key: %v", err)
	}
	f.keyFunc = k
	return nil
}

func newDLQFlags(name, synopsis, doc string, stdout io.Writer, inbox bool) *dlqFlags {
	f := &dlqFlags{fs: newCmdFlags("dlq "+name, synopsis, doc, stdout), inbox: inbox}
	f.fs.StringVar(&f.queue, "queue", "", "RabbitMQ dead-letter queue (\"billing.dlq\")")
	f.fs.StringVar(&f.topic, "topic", "", "Kafka dead-letter topic (\"billing.dlq\"), instead of --queue")
	f.fs.StringVar(&f.stream, "stream", "", "NATS JetStream (\"BILLING_DLQ\", with --nats) or Redis (\"billing.dlq\", with --redis) dead-letter stream, instead of --queue")
	f.addSource()
	if inbox {
		f.addInbox("inbox table, optionally schema-qualified, that judges the redrive")
	}
	f.fs.BoolVar(&f.jsonOut, "json", false, "print JSON")
	return f
}

// addSource adds the flags that say how to read the DLQs, the same for
// idem dlq and idem console.
func (f *dlqFlags) addSource() {
	f.fs.StringVar(&f.amqpURL, "amqp", "", "RabbitMQ URL (default $IDEM_AMQP_URL, else "+defaultAMQPURL+")")
	f.fs.StringVar(&f.brokers, "brokers", "", "Kafka seed brokers, comma-separated (default $IDEM_KAFKA_BROKERS)")
	f.fs.StringVar(&f.redisURL, "redis", "", "Redis URL of --stream (default $IDEM_REDIS_URL)")
	f.fs.StringVar(&f.natsURL, "nats", "", "NATS server URL of --stream (default $IDEM_NATS_URL)")
	f.fs.StringVar(&f.group, "group", dlq.DefaultGroup, "Kafka consumer group whose committed offsets mark the letters settled")
	f.fs.StringVar(&f.idHeader, "id-header", "", "header carrying the message ID (RabbitMQ default: the message_id property; Kafka: idem-message-id; NATS: Nats-Msg-Id)")
	f.fs.StringVar(&f.timeHdr, "time-header", "", "Kafka and NATS: the producers' event-time header (default x-event-time)")
	f.fs.IntVar(&f.limit, "delivery-limit", 0, "ignored, kept for scripts that pass it: a read spends no delivery, whatever the RabbitMQ queue's delivery limit (each letter read is copied back to the queue before it is acknowledged)")
}

// addInbox adds the flags that say how to judge letters, the same for
// idem dlq and idem console.
func (f *dlqFlags) addInbox(tableDoc string) {
	f.db.add(f.fs.FlagSet)
	f.fs.StringVar(&f.table, "table", "idem_inbox", tableDoc)
	f.fs.StringVar(&f.consumer, "default-consumer", "", "consumer to judge letters that name none (dead-lettered by the broker itself)")
	f.fs.StringVar(&f.key, "key", "id", keyDoc)
	f.fs.DurationVar(&f.ahead, "max-ahead", time.Hour, "the consumer's horizon MaxAhead: an event time further ahead is not trusted, and the letter is judged untimed")
	f.fs.BoolVar(&f.untimed, "refuse-untimed", false, "the consumer refuses untimed messages (Config.RefuseUntimed): judge them invalid")
}

// checkInbox checks the judging flags and reads --key.
func (f *dlqFlags) checkInbox() error {
	switch {
	case f.ahead <= 0 || f.ahead > time.Hour:
		return f.fs.usagef("--max-ahead %v: want more than 0 and at most 1h, as the consumer's horizon", f.ahead)
	case !tableName.MatchString(f.table):
		return f.fs.usagef("--table %q: want a table name, optionally schema.table, of letters, digits and _ (starting with a letter or _)", f.table)
	}
	if err := f.parseKey(); err != nil {
		return err
	}
	return f.db.validate()
}

func (f *dlqFlags) parse(args []string) error {
	if err := f.fs.parse(args, false); err != nil {
		return err
	}
	switch {
	case f.queue == "" && f.topic == "" && f.stream == "":
		return f.fs.usagef("name the dead letters: --queue (RabbitMQ), --topic (Kafka) or --stream (NATS JetStream or Redis)")
	case f.stream != "" && (f.queue != "" || f.topic != ""):
		return f.fs.usagef("--stream and --queue or --topic name two DLQs: give one")
	case f.queue != "" && f.topic != "":
		return f.fs.usagef("--queue and --topic name two DLQs: give one")
	case f.natsURL != "" && f.redisURL != "":
		return f.fs.usagef("--nats and --redis name two servers: give one")
	case f.stream != "" && f.streamBroker() == "":
		return f.fs.usagef("--stream names a NATS JetStream or a Redis stream: give --nats URL or --redis URL")
	case f.topic != "" && f.brokerList() == nil:
		return f.fs.usagef("--topic needs --brokers (or IDEM_KAFKA_BROKERS)")
	}
	if f.inbox {
		return f.checkInbox()
	}
	return nil
}

// given reports whether flag name was on the command line.
func (f *dlqFlags) given(name string) bool {
	set := false
	f.fs.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set
}

func (f *dlqFlags) brokerList() []string {
	s := f.brokers
	if s == "" {
		s = os.Getenv("IDEM_KAFKA_BROKERS")
	}
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// streamBroker says which server --stream names a stream of: the one
// whose URL flag is given, else the one whose environment variable
// (IDEM_NATS_URL, IDEM_REDIS_URL) is set; "" when that names neither or
// both.
func (f *dlqFlags) streamBroker() string {
	switch {
	case f.natsURL != "":
		return "nats"
	case f.redisURL != "":
		return "redis"
	}
	nats, redis := os.Getenv("IDEM_NATS_URL") != "", os.Getenv("IDEM_REDIS_URL") != ""
	switch {
	case nats && !redis:
		return "nats"
	case redis && !nats:
		return "redis"
	}
	return ""
}

// source opens the DLQ the flags name.
func (f *dlqFlags) source(ctx context.Context) (dlq.Source, error) {
	if f.stream != "" {
		switch f.streamBroker() {
		case "":
			return nil, f.fs.usagef("--stream names a NATS JetStream or a Redis stream: give --nats URL or --redis URL")
		case "nats":
			u := cmp.Or(f.natsURL, os.Getenv("IDEM_NATS_URL"))
			return dlq.NewNATS(ctx, dlq.NATSConfig{URL: u, Stream: f.stream, IDHeader: f.idHeader, TimeHeader: f.timeHdr})
		}
		u := cmp.Or(f.redisURL, os.Getenv("IDEM_REDIS_URL"))
		return dlq.NewRedis(ctx, dlq.RedisConfig{URL: u, Stream: f.stream, IDField: f.idHeader, TimeField: f.timeHdr})
	}
	if f.topic != "" {
		return dlq.NewKafka(ctx, dlq.KafkaConfig{Brokers: f.brokerList(), Topic: f.topic, Group: f.group, IDHeader: f.idHeader, TimeHeader: f.timeHdr})
	}
	u := f.amqpURL
	if u == "" {
		u = os.Getenv("IDEM_AMQP_URL")
	}
	if u == "" {
		u = defaultAMQPURL
	}
	return dlq.NewRabbitMQ(dlq.RabbitMQConfig{URL: u, Queue: f.queue, IDHeader: f.idHeader})
}

// openInbox opens the inbox that judges redrives; close closes its pool.
func (f *dlqFlags) openInbox(ctx context.Context) (*dlq.Inbox, func(), error) {
	pool, err := f.db.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	in, err := dlq.NewInbox(pool, &dlq.InboxConfig{Table: f.table, Consumer: f.consumer, Key: f.keyFunc, MaxAhead: f.ahead, RefuseUntimed: f.untimed})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return in, pool.Close, nil
}

func dlqList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newDLQFlags("list", "(--queue Q | --topic T) [selectors] [flags]", "Reads the dead letters, leaving them where they are, and groups them by reason (message\nIDs in it written <id>) and consumer: how many, the oldest and newest event time, the\nattempts. The selectors are those of redrive and purge. Show one with: idem dlq show --id ID.", stdout, false)
	var sels dlqSelectors
	sels.add(f.fs)
	if err := f.parse(args); err != nil {
		return err
	}
	flt, err := sels.filter(f, time.Now())
	if err != nil {
		return err
	}
	src, err := f.source(ctx)
	if err != nil {
		return err
	}
	defer src.Close()
	ls, err := listMatching(ctx, src, sels.limit, flt)
	if err != nil {
		return err
	}
	if f.jsonOut {
		return printJSON(stdout, ls)
	}
	for _, w := range ls.Warnings {
		fmt.Fprintf(stderr, "idem dlq list: warning: %s\n", w)
	}
	fmt.Fprintf(stdout, "%s: %d dead letters\n", ls.DLQ, ls.Total)
	if ls.Total == 0 {
		return nil
	}
	fmt.Fprintln(stdout)
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "COUNT\tCONSUMER\tATTEMPTS\tOLDEST\tNEWEST\tREASON\tIDS")
	for _, g := range ls.Groups {
		att := strconv.Itoa(g.MinAttempts)
		if g.MaxAttempts != g.MinAttempts {
			att += "-" + strconv.Itoa(g.MaxAttempts)
		}
		ids := strings.Join(g.IDs, ",")
		if g.Count > len(g.IDs) {
			ids += ",…"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Count, orDash(g.Consumer), att, shortTime(g.Oldest), shortTime(g.Newest), clip(g.Reason, 80), ids)
	}
	return w.Flush()
}

func dlqShow(ctx context.Context, args []string, stdout io.Writer) error {
	f := newDLQFlags("show", "(--id ID | --at POSITION | selectors) [--key K] (--queue Q | --topic T) [flags]", "Shows one dead letter (the first the selectors select: --id, --reason, --consumer,\n--since, --until, as for list and redrive; or the one at a position, for a letter\nwithout a message ID): its reason, consumer, attempts, origin, headers and body, and\nwhat a redrive would do, judged from the inbox: apply (no marker for its key),\nduplicate (its key has a marker: the consumer acks it without an effect; idem dlq\nreplay applies it once more), expire (older than the inbox's window) or invalid (no\nID). The body is cut at "+strconv.Itoa(bodyShown)+" bytes unless --full (--json prints it whole).\nExit 1 when no letter matches.", stdout, true)
	var sels dlqSelectors
	sels.add(f.fs)
	at := f.fs.String("at", "", "position of the letter, as a listing or a redrive says it (RabbitMQ: #3, the third in the queue; Kafka: partition/offset): for a letter without a message ID")
	full := f.fs.Bool("full", false, "print the whole body, however long")
	if err := f.parse(args); err != nil {
		return err
	}
	if sels.given(f) == (*at != "") {
		return f.fs.usagef("give --at or selectors (--id, --reason, --consumer, --since, --until), one of them")
	}
	flt, err := sels.filter(f, time.Now())
	if err != nil {
		return err
	}
	src, err := f.source(ctx)
	if err != nil {
		return err
	}
	defer src.Close()
	in, closeDB, err := f.openInbox(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	sh, err := showFirst(ctx, src, in, *at, sels.limit, flt)
	if errors.Is(err, dlq.ErrNotFound) {
		if f.jsonOut {
			_ = printJSON(stdout, map[string]any{"found": false, "id": sels.ids, "at": *at, "dlq": src.Name()})
		}
		return &exitError{code: exitFindings, msg: err.Error()}
	}
	if err != nil {
		return err
	}
	if f.jsonOut {
		return printJSON(stdout, sh)
	}
	l, j := sh.Letter, sh.Judgement
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	t := "none (the horizon cannot judge it)"
	if !l.Time.IsZero() {
		t = fmt.Sprintf("%s (from %s)", l.Time.UTC().Format(time.RFC3339), l.TimeSource)
	}
	for _, row := range [][2]string{
		{"message", orDash(l.ID)}, {"dlq", l.DLQ + " at " + l.Position}, {"consumer", orDash(l.Consumer)}, {"reason", l.Reason},
		{"outcome", orDash(l.Outcome)}, {"attempts", strconv.Itoa(l.Attempts)}, {"origin", orDash(l.Origin)},
		{"redrive to", orDash(l.Target)}, {"redriven", strconv.Itoa(l.Redriven)}, {"event time", t},
		{"inbox key", orDash(j.InboxKey)}, {"verdict", string(j.Verdict) + ": " + j.Why},
	} {
		fmt.Fprintf(w, "%s\t%s\n", row[0], row[1])
	}
	if err := w.Flush(); err != nil {
		return err
	}
	keys := make([]string, 0, len(l.Headers))
	for k := range l.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintln(stdout, "headers")
	for _, k := range keys {
		fmt.Fprintf(stdout, "  %s: %s\n", k, clip(l.Headers[k], 200))
	}
	fmt.Fprintf(stdout, "body (%d bytes)\n", len(l.Body))
	body, cut := l.Body, 0
	if !*full && len(body) > bodyShown {
		// Cut on a rune boundary, so that a cut text stays text.
		n := bodyShown
		for n > 0 && !utf8.RuneStart(body[n]) {
			n--
		}
		body, cut = body[:n], len(body)-n
	}
	switch {
	case utf8.Valid(body):
		fmt.Fprintf(stdout, "  %s\n", strings.ReplaceAll(string(body), "\n", "\n  "))
	case *full:
		fmt.Fprintf(stdout, "  (binary) %x\n", body)
	default:
		fmt.Fprintf(stdout, "  (binary) %x\n", body[:min(len(body), 64)])
		cut = len(l.Body) - min(len(body), 64)
	}
	if cut > 0 {
		fmt.Fprintf(stdout, "  … %d more bytes (--full prints them, --json too)\n", cut)
	}
	return nil
}

// bodyShown is how much of a body idem dlq show prints without --full: a
// body of megabytes must not flood the terminal.
const bodyShown = 4096

// showFirst finds the first letter at position at, or, without at, the
// first flt selects among the first limit letters (0: all), and judges its
// redrive.
func showFirst(ctx context.Context, src dlq.Source, in *dlq.Inbox, at string, limit int, flt dlq.Filter) (dlq.Shown, error) {
	if at == "" && limit == 0 && len(flt.IDs) == 1 && idsOnly(flt) {
		return dlq.Show(ctx, src, in, flt.IDs[0])
	}
	ls, err := src.Peek(ctx, limit)
	if err != nil {
		return dlq.Shown{}, err
	}
	for i := range ls {
		if at != "" && ls[i].Position == at || at == "" && flt.Match(&ls[i]) {
			j, err := in.Judge(ctx, &ls[i])
			return dlq.Shown{Letter: ls[i], Judgement: j}, err
		}
	}
	if at != "" {
		return dlq.Shown{}, fmt.Errorf("%w: none at %s in %s", dlq.ErrNotFound, at, src.Name())
	}
	return dlq.Shown{}, fmt.Errorf("%w: no letter matches in %s", dlq.ErrNotFound, src.Name())
}

// idsOnly reports whether flt selects by message ID alone, if at all.
func idsOnly(flt dlq.Filter) bool {
	return flt.Reason == "" && flt.Consumer == "" && flt.Since.IsZero() && flt.Until.IsZero()
}

// listMatching groups the first limit letters (0: all) that flt selects,
// as dlq.List groups them all.
func listMatching(ctx context.Context, src dlq.Source, limit int, flt dlq.Filter) (dlq.Listing, error) {
	if idsOnly(flt) && len(flt.IDs) == 0 {
		return dlq.List(ctx, src, limit)
	}
	ls, err := src.Peek(ctx, limit)
	if err != nil {
		return dlq.Listing{}, err
	}
	kept := ls[:0]
	for i := range ls {
		if flt.Match(&ls[i]) {
			kept = append(kept, ls[i])
		}
	}
	out := dlq.Summarize(src.Name(), kept)
	if w, ok := src.(interface{ Warnings() []string }); ok {
		out.Warnings = append(out.Warnings, w.Warnings()...)
	}
	return out, nil
}

func dlqDDL(args []string, stdout io.Writer) error {
	fs := newCmdFlags("dlq ddl", "[--table T]", "Prints the statement that creates the audit table of retired markers, idem_inbox_retired,\nin the schema of the inbox table, for a team that applies its schema with a migration\ntool. Without it, the first replay creates the table (CREATE TABLE IF NOT EXISTS).", stdout)
	table := fs.String("table", "idem_inbox", "inbox table, optionally schema-qualified")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if !tableName.MatchString(*table) {
		return fs.usagef("--table %q: want a table name, optionally schema.table, of letters, digits and _ (starting with a letter or _)", *table)
	}
	ddl, err := dlq.AuditDDL(*table)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, ddl)
	return err
}

// timeFlag reads --since/--until: an RFC 3339 time, or a duration back
// from now.
func timeFlag(f *cmdFlags, name, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	return time.Time{}, f.usagef("--%s %s: want an RFC 3339 time (2026-09-01T00:00:00Z) or a duration back from now (24h)", name, v)
}

// dlqSelectors are the flags that select letters, the same for list, show,
// redrive, purge and replay.
type dlqSelectors struct {
	reason, consumer, since, until, ids string
	limit                               int
}

// add adds the selector flags to f.
func (s *dlqSelectors) add(f *cmdFlags) {
	f.StringVar(&s.reason, "reason", "", "select letters whose reason contains this")
	f.StringVar(&s.consumer, "consumer", "", "select letters of this consumer")
	f.StringVar(&s.since, "since", "", "select letters with an event time at or after this (RFC 3339, or a duration back from now)")
	f.StringVar(&s.until, "until", "", "select letters with an event time before this (RFC 3339, or a duration back from now)")
	f.StringVar(&s.ids, "id", "", "select these message IDs, comma-separated")
	f.IntVar(&s.limit, "limit", 0, "read at most this many letters (0: all)")
}

// given reports whether any selector but --limit was on the command line.
func (s *dlqSelectors) given(f *dlqFlags) bool {
	for _, n := range []string{"reason", "consumer", "since", "until", "id"} {
		if f.given(n) {
			return true
		}
	}
	return false
}

// filter checks the selector flags and returns the filter they make. A
// filter given empty (an unset shell variable: --id "$ID") is refused: it
// would select every letter.
func (s *dlqSelectors) filter(f *dlqFlags, now time.Time) (dlq.Filter, error) {
	if s.limit < 0 {
		return dlq.Filter{}, f.fs.usagef("--limit must not be negative (0: all)")
	}
	for _, fl := range []struct {
		name string
		v    string
	}{{"id", strings.ReplaceAll(s.ids, ",", "")}, {"reason", s.reason}, {"consumer", s.consumer}} {
		if f.given(fl.name) && strings.TrimSpace(fl.v) == "" {
			return dlq.Filter{}, f.fs.usagef("--%s is empty: an empty filter would select every letter (leave the flag out to select them all)", fl.name)
		}
	}
	flt := dlq.Filter{Reason: s.reason, Consumer: s.consumer}
	var err error
	if flt.Since, err = timeFlag(f.fs, "since", s.since, now); err != nil {
		return dlq.Filter{}, err
	}
	if flt.Until, err = timeFlag(f.fs, "until", s.until, now); err != nil {
		return dlq.Filter{}, err
	}
	for _, id := range strings.Split(s.ids, ",") {
		if id = strings.TrimSpace(id); id != "" {
			flt.IDs = append(flt.IDs, id)
		}
	}
	return flt, nil
}

// dlqActDocs are the help texts of the acting subcommands.
var dlqActDocs = map[string]string{
	"redrive": "Sends the selected letters back to their origin queue or topic, with their message ID,\nproperties and headers, minus the dead-letter headers, plus x-idem-redriven. Each is\njudged first: apply and duplicate letters are sent (a duplicate is acked by the\nconsumer without an effect); expired ones only with --expired, invalid ones only with\n--invalid, with a warning; otherwise they are refused and stay (exit 1). A letter\nleaves the DLQ only after the broker confirmed the republish. A dry run unless --apply.",
	"purge":   "Removes the selected letters for good. A dry run unless --apply.",
	"replay":  "Applies again messages whose keys have markers (a handler bug made a wrong effect that\nwas compensated by hand): for each --id, moves its marker to the audit table\nidem_inbox_retired with --by and --why, in one transaction, then redrives it, and the\nconsumer applies it once more. A letter without a marker is redriven as by redrive.\nA second copy of the message in the DLQ is redriven without retiring anything (the\nconsumer acks it as a duplicate of the first); a copy whose key's marker was written\nby an earlier replay of the same message is refused. If the republish fails, the\nmarker is put back and the audit table says so. A dry run unless --apply.",
}

// dlqActSynopsis is the synopsis of an acting subcommand.
func dlqActSynopsis(op string) string {
	switch op {
	case "redrive":
		return "[--key K] (--queue Q | --topic T) [selectors] [--apply] [flags]"
	case "replay":
		return "--id ID[,ID] --why WHY [--key K] (--queue Q | --topic T) [--apply] [flags]"
	}
	return "(--queue Q | --topic T) [selectors] [--apply] [flags]"
}

// dlqAction is one redrive, purge or replay as the command line asked
// for it: its flags parsed and checked, its selection and, for a replay,
// who retires the markers and why.
type dlqAction struct {
	op  string
	f   *dlqFlags
	sel dlq.Selection
	ret dlq.Retirement
}

// dlqAct runs idem dlq redrive, purge or replay: parse, act, report.
func dlqAct(ctx context.Context, op string, args []string, stdout, stderr io.Writer) error {
	a, err := parseDLQAction(op, args, stdout)
	if err != nil {
		return err
	}
	res, err := a.run(ctx, stderr)
	return a.report(res, err, stdout, stderr)
}

// parseDLQAction parses and checks the flags of op: every selector is the
// same as list's and show's; a replay names its IDs and says why.
func parseDLQAction(op string, args []string, stdout io.Writer) (*dlqAction, error) {
	f := newDLQFlags(op, dlqActSynopsis(op), dlqActDocs[op], stdout, op != "purge")
	var sels dlqSelectors
	sels.add(f.fs)
	apply := f.fs.Bool("apply", false, "carry it out (default: a dry run that changes nothing)")
	var rate float64
	var expired, invalid bool
	var by, why string
	if op != "purge" {
		f.fs.Float64Var(&rate, "rate", 100, "republishes per second at most (0: no limit)")
		f.fs.BoolVar(&expired, "expired", false, "redrive expired letters too (older than the inbox window: the consumer cannot prove them new and expires them again unless its horizon applies expired messages)")
		f.fs.BoolVar(&invalid, "invalid", false, "redrive letters without a valid ID or key too (the consumer dead-letters them again unless its key function changed)")
	}
	if op == "replay" {
		f.fs.StringVar(&by, "by", "", "who replays, kept in the audit table (default: the user running idem)")
		f.fs.StringVar(&why, "why", "", "why, kept in the audit table (an incident, a ticket); required")
	}
	if err := f.parse(args); err != nil {
		return nil, err
	}
	flt, err := sels.filter(f, time.Now())
	if err != nil {
		return nil, err
	}
	if rate < 0 {
		return nil, f.fs.usagef("--rate must not be negative (0: no limit)")
	}
	a := &dlqAction{op: op, f: f, sel: dlq.Selection{Filter: flt, Apply: *apply, Rate: rate, Expired: expired, Invalid: invalid, Limit: sels.limit}}
	if op == "replay" {
		if a.ret, err = replayRetirement(f.fs, len(flt.IDs), by, why); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// replayRetirement checks a replay's --id, --why and --by (default: the
// user running idem): all three are required, and kept in the audit table.
func replayRetirement(fs *cmdFlags, ids int, by, why string) (dlq.Retirement, error) {
	if ids == 0 {
		return dlq.Retirement{}, fs.usagef("--id is required: a replay names the messages it applies again")
	}
	if strings.TrimSpace(why) == "" {
		return dlq.Retirement{}, fs.usagef("--why is required: it is kept in the audit table with the retired marker")
	}
	if by == "" {
		by = os.Getenv("USER")
		if u, err := user.Current(); err == nil && u.Username != "" {
			by = u.Username
		}
	}
	if by == "" {
		return dlq.Retirement{}, fs.usagef("--by is required (no user name found)")
	}
	return dlq.Retirement{By: by, Why: why}, nil
}

// run opens the DLQ and, but for a purge, the inbox that judges, and
// carries out the action; progress goes to stderr every 100 letters when
// it applies without --json.
func (a *dlqAction) run(ctx context.Context, stderr io.Writer) (dlq.Result, error) {
	src, err := a.f.source(ctx)
	if err != nil {
		return dlq.Result{}, err
	}
	defer src.Close()
	var in *dlq.Inbox
	if a.op != "purge" {
		var closeDB func()
		if in, closeDB, err = a.f.openInbox(ctx); err != nil {
			return dlq.Result{}, err
		}
		defer closeDB()
	}
	if a.sel.Apply && !a.f.jsonOut {
		a.sel.Progress = func(done, matched int) {
			if done%100 == 0 {
				fmt.Fprintf(stderr, "%s: %d letters…\n", a.op, done)
			}
		}
	}
	switch a.op {
	case "redrive":
		return dlq.Redrive(ctx, src, in, a.sel)
	case "purge":
		return dlq.Purge(ctx, src, in, a.sel)
	default:
		return dlq.Replay(ctx, src, in, a.sel, a.ret)
	}
}

// report prints the result of a run that ended with err and returns the
// command's error: on a failure, what was done before it is told (the
// operator must know which letters were sent; with --json, in the one
// error object on stdout); exit 1 when letters were refused or stayed in
// the DLQ.
func (a *dlqAction) report(res dlq.Result, err error, stdout, stderr io.Writer) error {
	if err != nil {
		if res.DLQ == "" {
			return err
		}
		if a.f.jsonOut {
			return fmt.Errorf("%w (before it: %s)", err, partial(res))
		}
		_ = printResult(stdout, a.op, res, false)
		return err
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(stderr, "idem dlq %s: warning: %s\n", a.op, w)
	}
	if err := printResult(stdout, a.op, res, a.f.jsonOut); err != nil {
		return err
	}
	stayed := 0
	if a.sel.Apply {
		stayed = res.Matched - res.Refused - res.Done
	}
	switch {
	case res.Refused > 0 && stayed > 0:
		return &exitError{code: exitFindings, msg: fmt.Sprintf("%d letters refused and %d more still in the DLQ (see why)", res.Refused, stayed)}
	case res.Refused > 0:
		return &exitError{code: exitFindings, msg: fmt.Sprintf("%d letters refused, left in the DLQ (see why)", res.Refused)}
	case stayed > 0:
		return &exitError{code: exitFindings, msg: fmt.Sprintf("%d matching letters are still in the DLQ (see why)", stayed)}
	}
	return nil
}

// partial says in one line what a run that failed did before: the letters
// that left the DLQ, those sent that stay, the markers retired and put
// back.
func partial(res dlq.Result) string {
	var done, sent, retired, restored []string
	for _, it := range res.Items {
		switch {
		case it.Done:
			done = append(done, it.ID)
		case it.Sent:
			sent = append(sent, it.ID)
		}
		if it.Retired != nil && it.Restored == nil && it.Sent {
			retired = append(retired, fmt.Sprintf("%s (audit row %d)", it.ID, it.Retired.ID))
		}
		if it.Restored != nil {
			restored = append(restored, fmt.Sprintf("%s (audit row %d)", it.ID, it.Restored.ID))
		}
	}
	list := func(ids []string) string {
		if len(ids) == 0 {
			return "none"
		}
		return strings.Join(ids, ", ")
	}
	s := fmt.Sprintf("%d matched, %d refused; left the DLQ: %s; sent but still in the DLQ: %s", res.Matched, res.Refused, list(done), list(sent))
	if len(retired) > 0 {
		s += "; markers retired: " + list(retired)
	}
	if len(restored) > 0 {
		s += "; markers put back: " + list(restored)
	}
	return s
}

func printResult(w io.Writer, op string, res dlq.Result, jsonOut bool) error {
	if jsonOut {
		return printJSON(w, res)
	}
	verdicts := res.ByVerdict()
	var vs []string
	for _, v := range []dlq.Verdict{dlq.Apply, dlq.Duplicate, dlq.Expire, dlq.Invalid, dlq.Unknown} {
		if verdicts[v] > 0 {
			vs = append(vs, fmt.Sprintf("%d %s", verdicts[v], v))
		}
	}
	judged := ""
	if len(vs) > 0 && op != "purge" {
		judged = " (" + strings.Join(vs, ", ") + ")"
	}
	if res.DryRun {
		fmt.Fprintf(w, "dry run: %d letters match in %s%s; %d would be refused; nothing changed (run again with --apply)\n", res.Matched, res.DLQ, judged, res.Refused)
	} else {
		past := map[string]string{"redrive": "redriven", "purge": "purged", "replay": "replayed"}[op]
		fmt.Fprintf(w, "%s %d of %d matching letters in %s%s; %d refused\n", past, res.Done, res.Matched, res.DLQ, judged, res.Refused)
	}
	if len(res.Items) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPOSITION\tVERDICT\tACTION\tDONE\tWHY")
	for _, it := range res.Items {
		done := "no"
		switch {
		case it.Done:
			done = "yes"
		case it.Sent:
			done = "sent"
		}
		why := it.Why
		if why == "" {
			why = it.Judgement.Why
		}
		if it.Retired != nil {
			why = fmt.Sprintf("marker retired (audit row %d, by %s); ", it.Retired.ID, it.Retired.RetiredBy) + why
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", it.ID, it.Position, it.Judgement.Verdict, it.Action, done, clip(why, 160))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func shortTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// clip is s on one line, cut to n runes.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > n {
		r := []rune(s)
		s = string(r[:n-1]) + "…"
	}
	return s
}
