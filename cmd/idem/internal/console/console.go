// Package console is a small web console over package dlq and the inbox:
// per consumer, the markers, the oldest marker against the window, markers
// and dead letters over time and the untimed messages; the dead letters of
// each DLQ grouped by reason, with show and redrive; the audit check of
// guarded tables; and the actions taken from it.
//
// Pages are rendered on the server from embedded html/template templates;
// there is no script. It answers only to IP addresses, localhost and the
// names it is given, so a site that rebinds its name to the console's
// address cannot read it. The console only reads unless it has a token: every
// action that changes something is a POST carrying the token, a form token
// derived from it (valid for an hour, for that form only), and passes
// net/http's cross-origin protection and a Referer check. Each action leaves
// a row in dlq's actions table (see [dlq.Inbox.Record]).
//
// What the inbox can tell honestly: it keeps markers, not a log of
// duplicates, so the console shows markers written per hour and per day
// (from processed_at); dead letters per hour come from the letters' event
// times as the DLQ holds them now, not from a history of dead-lettering.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/audit"
	"github.com/idemkit/idem/dlq"
)

//go:embed templates/*.html
var templateFS embed.FS

// Querier is what the console reads the inbox table with: *pgxpool.Pool
// has it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Config configures a [Server].
type Config struct {
	// Inbox judges redrives and keeps the actions. Required.
	Inbox *dlq.Inbox
	// DB reads the inbox table's figures. Required.
	DB Querier
	// Sources are the DLQs shown. The console owns them while it runs and
	// reads each through one call at a time.
	Sources []dlq.Source
	// Guards are the guarded tables whose audit check is shown.
	Guards []*audit.Auditor
	// Pauses, when set, shows the paused consumers and pauses and resumes
	// them (`idem consumer pause`); *pgxinbox.Store has it.
	Pauses Pauses
	// Token allows the actions; empty: the console only reads.
	Token string
	// ReadOnly refuses every action even with a token.
	ReadOnly bool
	// Hosts are the names the console answers to besides IP addresses and
	// localhost (a name a proxy in front of it uses). A request for any
	// other Host is refused: a site that rebinds its own name to 127.0.0.1
	// must not read the console.
	Hosts []string
	// CacheFor is how long a read of a DLQ is shown before it is read
	// again (a read spends no delivery, but a RabbitMQ read goes round the
	// whole queue). Defaults to 5s; an action reads again at once.
	CacheFor time.Duration
	// Rate bounds the republishes per second of a redrive. Defaults to 100.
	Rate float64
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Logger logs the actions. Defaults to slog.Default().
	Logger *slog.Logger
}

// source is one DLQ with its last read.
type source struct {
	dlq.Source
	mu      sync.Mutex
	letters []dlq.Letter
	warn    []string
	readAt  time.Time
}

// Server is the console's http.Handler.
type Server struct {
	cfg     Config
	tmpl    *template.Template
	srcs    []*source
	formKey []byte
	handler http.Handler
}

// New returns the console of cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Inbox == nil || cfg.DB == nil {
		return nil, errors.New("console: Inbox and DB are required")
	}
	if cfg.CacheFor <= 0 {
		cfg.CacheFor = 5 * time.Second
	}
	if cfg.Rate == 0 {
		cfg.Rate = 100
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	t, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, tmpl: t}
	for _, src := range cfg.Sources {
		s.srcs = append(s.srcs, &source{Source: src})
	}
	if cfg.Token != "" {
		k := sha256.Sum256([]byte("idem console form\x00" + cfg.Token))
		s.formKey = k[:]
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.overview)
	mux.HandleFunc("GET /dlq/{n}/show", s.show)
	mux.HandleFunc("GET /dlq/{n}/redrive", s.preview)
	mux.HandleFunc("POST /dlq/{n}/redrive", s.redrive)
	if cfg.Pauses != nil {
		mux.HandleFunc("GET /consumers", s.consumersPage)
		mux.HandleFunc("POST /consumers/{op}", s.pauseAction)
	}
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, http.StatusForbidden, "refused: a cross-origin request may not change anything")
	}))
	s.handler = headers(s.hostCheck(s.fetchCheck(cop.Handler(refererCheck(mux, s)))))
	return s, nil
}

// Writable reports whether the console takes actions.
func (s *Server) Writable() bool { return s.cfg.Token != "" && !s.cfg.ReadOnly }

// ServeHTTP serves the console.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Close closes the sources.
func (s *Server) Close() error {
	var errs []error
	for _, src := range s.srcs {
		src.mu.Lock()
		errs = append(errs, src.Close())
		src.mu.Unlock()
	}
	return errors.Join(errs...)
}

// headers forbids framing and sniffing and allows no script or outside
// resource.
func headers(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "same-origin")
		w.Header().Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// hostCheck refuses a request whose Host is a name the console does not
// answer to.
func (s *Server) hostCheck(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if hp, _, err := net.SplitHostPort(host); err == nil {
			host = hp
		}
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		if net.ParseIP(host) == nil && !strings.EqualFold(host, "localhost") && !slices.ContainsFunc(s.cfg.Hosts, func(a string) bool { return strings.EqualFold(a, host) }) {
			s.fail(w, http.StatusForbidden, fmt.Sprintf("refused: the console does not answer to the name %q (allow it with idem console --allow-host)", host))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// fetchCheck refuses what another site's page loads from the console
// without the user navigating to it (an image, a script, a frame, a
// fetch): a read of a RabbitMQ DLQ goes round the whole queue, and a page
// must not make a visitor's browser read it over and over.
// Browsers say so in Sec-Fetch-Site, Sec-Fetch-Mode and Sec-Fetch-Dest. A
// cross-origin POST is the cross-origin protection's to refuse.
func (s *Server) fetchCheck(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.ServeHTTP(w, r)
			return
		}
		switch r.Header.Get("Sec-Fetch-Site") {
		case "cross-site", "same-site":
			dest := r.Header.Get("Sec-Fetch-Dest")
			if r.Header.Get("Sec-Fetch-Mode") != "navigate" || (dest != "document" && dest != "") {
				s.fail(w, http.StatusForbidden, "refused: another site's page may not load the console")
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// refererCheck refuses a POST whose Referer names another host, for the
// clients that send neither Sec-Fetch-Site nor Origin.
func refererCheck(h http.Handler, s *Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			if ref := r.Header.Get("Referer"); ref != "" {
				u, err := url.Parse(ref)
				if err != nil || u.Host != r.Host {
					s.fail(w, http.StatusForbidden, "refused: the request comes from another site (Referer)")
					return
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}

// read returns the DLQ's letters, read again when the last read is older
// than CacheFor or force is set.
func (s *Server) read(ctx context.Context, src *source, force bool) ([]dlq.Letter, []string, time.Time, error) {
	src.mu.Lock()
	defer src.mu.Unlock()
	if !force && !src.readAt.IsZero() && s.cfg.Now().Sub(src.readAt) < s.cfg.CacheFor {
		return src.letters, src.warn, src.readAt, nil
	}
	ls, err := src.Peek(ctx, 0)
	if err != nil {
		return nil, nil, time.Time{}, fmt.Errorf("reading %s: %w", src.Name(), err)
	}
	src.letters, src.readAt, src.warn = ls, s.cfg.Now(), nil
	if w, ok := src.Source.(interface{ Warnings() []string }); ok {
		src.warn = w.Warnings()
	}
	return src.letters, src.warn, src.readAt, nil
}

// groupReason is a letter's reason as [dlq.Summarize] groups it.
func groupReason(l *dlq.Letter) string {
	if l.ID == "" {
		return l.Reason
	}
	return strings.ReplaceAll(l.Reason, l.ID, "<id>")
}

func (s *Server) sourceOf(w http.ResponseWriter, r *http.Request) (*source, int, bool) {
	n, err := strconv.Atoi(r.PathValue("n"))
	if err != nil || n < 0 || n >= len(s.srcs) {
		s.fail(w, http.StatusNotFound, "no such dead-letter queue")
		return nil, 0, false
	}
	return s.srcs[n], n, true
}

// page is what every template gets.
type page struct {
	Title    string
	Writable bool
	// Pauses is set when the console pauses and resumes consumers.
	Pauses   bool
	ReadOnly bool
	Now      time.Time
	Data     any
}

func (s *Server) render(w http.ResponseWriter, status int, name, title string, data any) {
	var b strings.Builder
	err := s.tmpl.ExecuteTemplate(&b, name, page{Title: title, Writable: s.Writable(), Pauses: s.cfg.Pauses != nil, ReadOnly: s.cfg.ReadOnly, Now: s.cfg.Now().UTC(), Data: data})
	if err != nil {
		s.cfg.Logger.Error("console: rendering", "page", name, "err", err)
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

func (s *Server) fail(w http.ResponseWriter, status int, msg string) {
	s.render(w, status, "error.html", http.StatusText(status), msg)
}

// Consumer is the inbox figures of one consumer.
type Consumer struct {
	Name    string
	Markers int64
	// Untimed counts the markers without an event time: the horizon could
	// not judge their messages.
	Untimed int64
	// Oldest is the retention time of the oldest marker (the later of its
	// event time and its write time); Age is how old it is and Headroom
	// the window minus Age (negative: the prune is late).
	Oldest   time.Time
	Age      time.Duration
	Headroom time.Duration
	Latest   time.Time
	// Hours are the markers written in each of the last 24 hours, Days
	// in each of the last 14 days, oldest first.
	Hours []Bar
	Days  []Bar
	// DeadHours are the dead letters of the consumer, now in the DLQs, by
	// the hour of their event time over the last 24 hours; DeadUntimed
	// those without an event time, DeadOlder those before.
	DeadHours   []Bar
	Dead        int
	DeadUntimed int
	DeadOlder   int
}

// Bar is one bar of a chart.
type Bar struct {
	Start time.Time
	Count int64
	// Pct is the bar's height against the chart's highest, 0 to 100.
	Pct int
}

// Inbox is the inbox part of the overview.
type Inbox struct {
	Table     string
	Window    time.Duration
	Consumers []*Consumer
}

// DLQ is one DLQ's listing in the overview.
type DLQ struct {
	N       int
	Listing dlq.Listing
	ReadAt  time.Time
	Err     string
}

// GuardStatus is one guarded table's audit check.
type GuardStatus struct {
	Table  string
	Key    string
	Result *audit.CheckResult
	// State: ok, duplicates, unguarded (no unique index on the key) or
	// error.
	State string
	Err   string
}

// Overview is the data of the front page.
type Overview struct {
	Inbox    Inbox
	InboxErr string
	DLQs     []DLQ
	Guards   []GuardStatus
	Actions  []dlq.Acted
	ActErr   string
}

// Consumers reads the figures of every consumer in the inbox table, in
// one scan of it: the markers are counted per consumer and per hour of the
// last 14 days, the older ones in one group, and the totals, the hours and
// the days are summed from those counts.
func (s *Server) Consumers(ctx context.Context) (Inbox, error) {
	in := Inbox{Table: s.cfg.Inbox.Table()}
	set, err := s.cfg.Inbox.Settings(ctx)
	if err != nil {
		return in, err
	}
	in.Window = set.Window
	table := pgx.Identifier(strings.Split(in.Table, ".")).Sanitize()
	now := s.cfg.Now()
	hour0 := now.UTC().Truncate(time.Hour).Add(-23 * time.Hour)
	day0 := now.UTC().Truncate(24 * time.Hour).Add(-13 * 24 * time.Hour)
	byName := map[string]*Consumer{}
	rows, err := s.cfg.DB.Query(ctx, `SELECT consumer,
       CASE WHEN processed_at >= $1 THEN date_trunc('hour', processed_at AT TIME ZONE 'UTC') END,
       count(*), count(*) FILTER (WHERE event_time IS NULL),
       min(greatest(event_time, processed_at)), max(processed_at)
FROM `+table+` GROUP BY 1, 2`, day0)
	if err != nil {
		return in, fmt.Errorf("reading the markers of %s: %w", in.Table, err)
	}
	var name string
	var hour, oldest, latest *time.Time
	var n, untimed int64
	_, err = pgx.ForEachRow(rows, []any{&name, &hour, &n, &untimed, &oldest, &latest}, func() error {
		c := byName[name]
		if c == nil {
			c = &Consumer{Name: name, Hours: bars(hour0, time.Hour, 24), Days: bars(day0, 24*time.Hour, 14)}
			byName[name] = c
			in.Consumers = append(in.Consumers, c)
		}
		c.Markers += n
		c.Untimed += untimed
		if oldest != nil && (c.Oldest.IsZero() || oldest.Before(c.Oldest)) {
			c.Oldest = *oldest
		}
		if latest != nil && latest.After(c.Latest) {
			c.Latest = *latest
		}
		if hour != nil {
			h := hour.UTC()
			if i := int(h.Sub(hour0) / time.Hour); h.Compare(hour0) >= 0 && i < len(c.Hours) {
				c.Hours[i].Count += n
			}
			if i := int(h.Truncate(24*time.Hour).Sub(day0) / (24 * time.Hour)); i >= 0 && i < len(c.Days) {
				c.Days[i].Count += n
			}
		}
		return nil
	})
	if err != nil {
		return in, fmt.Errorf("reading the markers of %s: %w", in.Table, err)
	}
	sort.Slice(in.Consumers, func(i, j int) bool { return in.Consumers[i].Name < in.Consumers[j].Name })
	for _, c := range in.Consumers {
		c.Headroom = in.Window
		if !c.Oldest.IsZero() {
			c.Age = now.Sub(c.Oldest)
			c.Headroom = in.Window - c.Age
		}
		scale(c.Hours)
		scale(c.Days)
	}
	return in, nil
}

func bars(start time.Time, step time.Duration, n int) []Bar {
	b := make([]Bar, n)
	for i := range b {
		b[i].Start = start.Add(time.Duration(i) * step)
	}
	return b
}

func scale(b []Bar) {
	var top int64
	for _, x := range b {
		top = max(top, x.Count)
	}
	for i := range b {
		if top > 0 && b[i].Count > 0 {
			b[i].Pct = max(2, int(b[i].Count*100/top))
		}
	}
}

// deadLetters adds the letters of ls to the consumers' dead-letter charts,
// adding a row for a consumer the inbox has no marker of.
func (s *Server) deadLetters(in *Inbox, ls []dlq.Letter) {
	hour0 := s.cfg.Now().UTC().Truncate(time.Hour).Add(-23 * time.Hour)
	for i := range ls {
		l := &ls[i]
		name := l.Consumer
		if name == "" {
			name = "(none named)"
		}
		var c *Consumer
		for _, cc := range in.Consumers {
			if cc.Name == name {
				c = cc
			}
		}
		if c == nil {
			c = &Consumer{Name: name, Headroom: in.Window, Hours: bars(hour0, time.Hour, 24), Days: bars(hour0.Truncate(24*time.Hour).Add(-13*24*time.Hour), 24*time.Hour, 14)}
			in.Consumers = append(in.Consumers, c)
		}
		if c.DeadHours == nil {
			c.DeadHours = bars(hour0, time.Hour, 24)
		}
		c.Dead++
		switch {
		case l.Time.IsZero():
			c.DeadUntimed++
		case l.Time.Before(hour0):
			c.DeadOlder++
		default:
			if i := int(l.Time.Sub(hour0) / time.Hour); i < len(c.DeadHours) {
				c.DeadHours[i].Count++
			}
		}
	}
	for _, c := range in.Consumers {
		if c.DeadHours == nil {
			c.DeadHours = bars(hour0, time.Hour, 24)
		}
		scale(c.DeadHours)
	}
	sort.SliceStable(in.Consumers, func(i, j int) bool { return in.Consumers[i].Name < in.Consumers[j].Name })
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var ov Overview
	in, err := s.Consumers(ctx)
	if err != nil {
		ov.InboxErr = err.Error()
	}
	var all []dlq.Letter
	for n, src := range s.srcs {
		d := DLQ{N: n}
		ls, warn, at, err := s.read(ctx, src, r.URL.Query().Has("reread"))
		if err != nil {
			d.Err = err.Error()
			d.Listing = dlq.Listing{DLQ: src.Name()}
		} else {
			d.Listing, d.ReadAt = dlq.Summarize(src.Name(), ls), at
			d.Listing.Warnings = append(d.Listing.Warnings, warn...)
			all = append(all, ls...)
		}
		ov.DLQs = append(ov.DLQs, d)
	}
	s.deadLetters(&in, all)
	ov.Inbox = in
	for _, a := range s.cfg.Guards {
		sp := a.Spec()
		g := GuardStatus{Table: sp.Table, Key: strings.Join(sp.Key, ", ")}
		res, err := a.Check(ctx)
		switch {
		case err != nil:
			g.State, g.Err = "error", err.Error()
		case res.Groups > 0:
			g.State = "duplicates"
		case res.GuardIndex == "":
			g.State = "unguarded"
		default:
			g.State = "ok"
		}
		g.Result = res
		ov.Guards = append(ov.Guards, g)
	}
	if ov.Actions, err = s.cfg.Inbox.Actions(ctx, 20); err != nil {
		ov.ActErr = err.Error()
	}
	s.render(w, http.StatusOK, "overview.html", "idem console", ov)
}

// Shown is the data of a letter's page.
type Shown struct {
	N         int
	DLQ       string
	Letter    dlq.Letter
	Judgement dlq.Judgement
	Headers   [][2]string
	Body      string
	Binary    bool
}

func (s *Server) show(w http.ResponseWriter, r *http.Request) {
	src, n, ok := s.sourceOf(w, r)
	if !ok {
		return
	}
	// A letter is named by its message ID, or, having none, by its
	// position (as idem dlq show --at).
	id, at := r.URL.Query().Get("id"), r.URL.Query().Get("at")
	ls, _, _, err := s.read(r.Context(), src, false)
	if err != nil {
		s.fail(w, http.StatusBadGateway, err.Error())
		return
	}
	for i := range ls {
		if (at == "" && ls[i].ID != id) || (at != "" && ls[i].Position != at) {
			continue
		}
		j, err := s.cfg.Inbox.Judge(r.Context(), &ls[i])
		if err != nil {
			s.fail(w, http.StatusInternalServerError, err.Error())
			return
		}
		sh := Shown{N: n, DLQ: src.Name(), Letter: ls[i], Judgement: j}
		for k, v := range ls[i].Headers {
			sh.Headers = append(sh.Headers, [2]string{k, v})
		}
		sort.Slice(sh.Headers, func(a, b int) bool { return sh.Headers[a][0] < sh.Headers[b][0] })
		if utf8.Valid(ls[i].Body) {
			sh.Body = string(ls[i].Body)
		} else {
			sh.Body, sh.Binary = fmt.Sprintf("%x", ls[i].Body[:min(len(ls[i].Body), 256)]), true
		}
		s.render(w, http.StatusOK, "show.html", "dead letter "+id, sh)
		return
	}
	if at != "" {
		s.fail(w, http.StatusNotFound, fmt.Sprintf("%s: no dead letter at %s (it may have been redriven)", src.Name(), at))
		return
	}
	s.fail(w, http.StatusNotFound, fmt.Sprintf("%s: no dead letter with message ID %q (it may have been redriven)", src.Name(), id))
}

// Preview is the data of a redrive's dry run and confirmation form.
type Preview struct {
	N        int
	DLQ      string
	Consumer string
	Reason   string
	IDs      string
	Result   dlq.Result
	Verdicts map[dlq.Verdict]int
	Form     string
	Done     *dlq.Acted
	Err      string
}

// selected are the IDs of the letters in the group of consumer and reason.
func selected(ls []dlq.Letter, consumer, reason string) []string {
	var ids []string
	seen := map[string]bool{}
	for i := range ls {
		if ls[i].Consumer == consumer && groupReason(&ls[i]) == reason && !seen[ls[i].ID] {
			seen[ls[i].ID] = true
			ids = append(ids, ls[i].ID)
		}
	}
	return ids
}

func (s *Server) preview(w http.ResponseWriter, r *http.Request) {
	src, n, ok := s.sourceOf(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	p := Preview{N: n, DLQ: src.Name(), Consumer: q.Get("consumer"), Reason: q.Get("reason")}
	var ids []string
	if q.Has("id") {
		ids = []string{q.Get("id")}
	} else {
		ls, _, _, err := s.read(r.Context(), src, false)
		if err != nil {
			s.fail(w, http.StatusBadGateway, err.Error())
			return
		}
		ids = selected(ls, p.Consumer, p.Reason)
	}
	if len(ids) == 0 {
		s.fail(w, http.StatusNotFound, "no dead letter in that group now (it may have been redriven)")
		return
	}
	p.IDs = strings.Join(ids, ",")
	src.mu.Lock()
	p.Result, p.Err = s.dryRun(r.Context(), src, p.Consumer, ids)
	src.mu.Unlock()
	p.Verdicts = p.Result.ByVerdict()
	if s.Writable() {
		p.Form = s.formToken(n, s.cfg.Now())
	}
	s.render(w, http.StatusOK, "redrive.html", "redrive from "+src.Name(), p)
}

func (s *Server) dryRun(ctx context.Context, src *source, consumer string, ids []string) (dlq.Result, string) {
	res, err := dlq.Redrive(ctx, src.Source, s.cfg.Inbox, dlq.Selection{Filter: dlq.Filter{Consumer: consumer, IDs: ids}})
	src.readAt = time.Time{}
	if err != nil {
		return res, err.Error()
	}
	return res, ""
}

// formLife is how long a confirmation form can be sent.
const formLife = time.Hour

// formToken is a token for the redrive form of DLQ n, issued at now:
// a nonce and an expiry signed with a key derived from the console token.
func (s *Server) formToken(n int, now time.Time) string {
	return s.formTokenFor(fmt.Sprintf("redrive %d", n), now)
}

// formTokenFor is a form token for the form of scope ("redrive 0",
// "consumers").
func (s *Server) formTokenFor(scope string, now time.Time) string {
	var b [24]byte
	_, _ = rand.Read(b[:16])
	binary.BigEndian.PutUint64(b[16:], uint64(now.Add(formLife).Unix()))
	return base64.RawURLEncoding.EncodeToString(b[:]) + "." + base64.RawURLEncoding.EncodeToString(s.formMAC(scope, b[:]))
}

func (s *Server) formMAC(scope string, b []byte) []byte {
	m := hmac.New(sha256.New, s.formKey)
	fmt.Fprintf(m, "%s\x00", scope)
	m.Write(b)
	return m.Sum(nil)
}

// formValid checks a form token for DLQ n.
func (s *Server) formValid(n int, tok string) bool {
	return s.formValidFor(fmt.Sprintf("redrive %d", n), tok)
}

// formValidFor checks a form token for the form of scope.
func (s *Server) formValidFor(scope, tok string) bool {
	if s.formKey == nil {
		return false
	}
	a, b, ok := strings.Cut(tok, ".")
	if !ok {
		return false
	}
	raw, err1 := base64.RawURLEncoding.DecodeString(a)
	mac, err2 := base64.RawURLEncoding.DecodeString(b)
	if err1 != nil || err2 != nil || len(raw) != 24 {
		return false
	}
	if !hmac.Equal(mac, s.formMAC(scope, raw)) {
		return false
	}
	return s.cfg.Now().Unix() <= int64(binary.BigEndian.Uint64(raw[16:]))
}

// tokenValid compares the request's console token with the console's.
func (s *Server) tokenValid(r *http.Request) bool {
	got := r.PostFormValue("token")
	if h, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && got == "" {
		got = h
	}
	if s.cfg.Token == "" || got == "" {
		return false
	}
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(s.cfg.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

func (s *Server) redrive(w http.ResponseWriter, r *http.Request) {
	src, n, ok := s.sourceOf(w, r)
	if !ok {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	switch {
	case s.cfg.ReadOnly:
		s.fail(w, http.StatusForbidden, "refused: the console is read-only (--read-only)")
		return
	case s.cfg.Token == "":
		s.fail(w, http.StatusForbidden, "refused: the console has no token, so it only reads (give idem console --token or IDEM_CONSOLE_TOKEN)")
		return
	case !s.tokenValid(r):
		s.fail(w, http.StatusForbidden, "refused: the console token is missing or wrong")
		return
	case !s.formValid(n, r.PostFormValue("form")):
		s.fail(w, http.StatusForbidden, "refused: the form is stale or not this console's (open the redrive page again)")
		return
	}
	by := strings.TrimSpace(r.PostFormValue("by"))
	if by == "" {
		s.fail(w, http.StatusBadRequest, "say who redrives (the by field): it is kept in the actions table")
		return
	}
	why := strings.TrimSpace(r.PostFormValue("why"))
	consumer := r.PostFormValue("consumer")
	var ids []string
	for _, id := range strings.Split(r.PostFormValue("ids"), ",") {
		if id = strings.TrimSpace(id); id != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		s.fail(w, http.StatusBadRequest, "no message IDs to redrive")
		return
	}
	p := Preview{N: n, DLQ: src.Name(), Consumer: consumer, Reason: r.PostFormValue("reason"), IDs: strings.Join(ids, ",")}
	src.mu.Lock()
	res, err := dlq.Redrive(r.Context(), src.Source, s.cfg.Inbox, dlq.Selection{Filter: dlq.Filter{Consumer: consumer, IDs: ids}, Apply: true, Rate: s.cfg.Rate})
	src.readAt = time.Time{}
	src.mu.Unlock()
	p.Result, p.Verdicts = res, res.ByVerdict()
	if err != nil {
		p.Err = err.Error()
	}
	acted, rerr := s.cfg.Inbox.Record(r.Context(), by, why, "console "+r.RemoteAddr, "redrive", res, err)
	if rerr != nil {
		p.Err = strings.TrimPrefix(p.Err+"; ", "; ") + rerr.Error()
	} else {
		p.Done = &acted
	}
	s.cfg.Logger.Info("console: redrive", "dlq", res.DLQ, "by", by, "matched", res.Matched, "done", res.Done, "refused", res.Refused, "err", err, "remote", r.RemoteAddr)
	status := http.StatusOK
	if err != nil || rerr != nil {
		status = http.StatusInternalServerError
	}
	s.render(w, status, "redrive.html", "redriven from "+src.Name(), p)
}

var funcs = template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"hour": func(t time.Time) string { return t.UTC().Format("Jan 2 15:00") },
	"day":  func(t time.Time) string { return t.UTC().Format("Jan 2") },
	"dur": func(d time.Duration) string {
		neg := d < 0
		if neg {
			d = -d
		}
		var s string
		switch {
		case d >= 48*time.Hour:
			s = fmt.Sprintf("%dd%dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
		case d >= time.Hour:
			s = d.Round(time.Minute).String()
		default:
			s = d.Round(time.Second).String()
		}
		if neg {
			return "−" + s
		}
		return s
	},
	"neg":  func(d time.Duration) bool { return d < 0 },
	"join": func(s []string) string { return strings.Join(s, ", ") },
	"orDash": func(s string) string {
		if s == "" {
			return "—"
		}
		return s
	},
	"more": func(g dlq.Group) bool { return g.Count > len(g.IDs) },
	"list": func(s ...string) []string { return s },
}
