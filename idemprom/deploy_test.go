package idemprom_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/outbox"
)

var (
	deployRules     = filepath.Join("..", "deploy", "prometheus", "idem-alerts.yml")
	deployDashboard = filepath.Join("..", "deploy", "grafana", "idem-dashboard.json")
)

// recordingRegisterer is a registry that keeps what was registered, so the
// test knows every metric New and the collector create, whether or not
// they have a series yet.
type recordingRegisterer struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registry.Register(c)
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// described lists the names of the metrics the registered collectors
// describe.
func (r *recordingRegisterer) described(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, c := range r.collectors {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no name in %s", d)
			}
			names[m[1]] = true
		}
	}
	return names
}

// exported builds Metrics, an inbox collector on a real inbox and an
// outbox collector on a real outbox, feeds every hook so that every metric
// has a series, and returns the families gathered, by name.
func exported(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store := migrated(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO idem_inbox (consumer, key, message_id, body_sha256) VALUES ('ledger', 'k', 'k', '\x00')`); err != nil {
		t.Fatal(err)
	}
	reg := &recordingRegisterer{Registry: prometheus.NewRegistry()}
	m := idemprom.New(reg)
	coll := idemprom.NewInboxCollector(store, "idem_inbox", nil)
	reg.MustRegister(coll)
	if err := coll.Count(ctx); err != nil {
		t.Fatal(err)
	}
	ob := pgxOutbox(t, pool)
	enqueue(t, ob, pool, outbox.Message{Destination: "invoices", Key: "c-1", Body: []byte("x")})
	reg.MustRegister(idemprom.NewOutboxCollector(ob, "", nil))

	first := &idemstore.Marker{Key: "k", MessageID: "k", ProcessedAt: time.Now().Add(-time.Hour)}
	m.OnOutcome("ledger", idem.Result{Outcome: idem.Applied, Untimed: true, PrunedOn: time.Now()}, time.Millisecond)
	m.OnOutcome("ledger", idem.Result{Outcome: idem.Duplicate, First: first, Conflict: true}, time.Millisecond)
	m.OnAttempt("ledger", idem.Attempt{Class: idemstore.ClassUnavailable, Err: errors.New("connection refused")})
	m.OnSettle("ledger", "invoices", idem.Disposition{Action: idem.ActionHold}, idem.Result{})
	m.OnDeadLetter("ledger", "invoices.dlq", idem.Result{Outcome: idem.DeadLettered, Err: idem.Permanent(errors.New("no such customer"))}, nil)
	m.OnRedelivered("ledger", "invoices")
	m.OnPrune("idem_inbox", 3)
	m.OnDrop("idem_inbox", 1)
	m.OnOldest("idem_inbox", time.Hour)
	m.OnPublish("invoices", 2)
	m.OnRefuse(outbox.Record{Destination: "invoices"}, outbox.Refused(errors.New("no route")), true)
	m.OnOutage(errors.New("connection refused"), time.Second)
	idemprom.NewReconcile(reg).Observe("ledger", 0, time.Now())
	m.OnPause("ledger", idemstore.Pause{Paused: true, Since: time.Now(), By: "alice", Why: "incident"})

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	for name := range reg.described(t) {
		if out[name] == nil {
			t.Fatalf("%s is registered but has no series: feed it above", name)
		}
	}
	if len(out) != len(reg.described(t)) {
		t.Fatalf("gathered %d families, described %d", len(out), len(reg.described(t)))
	}
	return out
}

// ruleExprs reads the expressions of the rules file: every rule's expr is
// on one line, as the file's header says.
func ruleExprs(t *testing.T) (exprs []string, alerts []string) {
	t.Helper()
	f, err := os.Open(deployRules)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var inRule bool
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "- alert: "):
			alerts = append(alerts, strings.TrimPrefix(line, "- alert: "))
			inRule = true
		case strings.HasPrefix(line, "expr: "):
			if !inRule {
				t.Fatalf("expr outside a rule: %s", line)
			}
			exprs = append(exprs, strings.TrimPrefix(line, "expr: "))
			inRule = false
		case strings.HasPrefix(line, "expr:"):
			t.Fatalf("rule expression not on one line: %q", line)
		}
		// A double-quoted YAML scalar ends at its first unescaped quote:
		// PromQL matchers in an annotation would cut it short.
		if _, v, ok := strings.Cut(line, `: "`); ok && !strings.HasPrefix(line, "#") {
			if !strings.HasSuffix(v, `"`) || strings.Contains(strings.ReplaceAll(v[:len(v)-1], `\"`, ""), `"`) {
				t.Errorf("%s: a double-quoted value with a quote inside: %s", deployRules, line)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(exprs) != len(alerts) {
		t.Fatalf("%d alerts but %d expressions", len(alerts), len(exprs))
	}
	return exprs, alerts
}

// grafanaDashboard is the part of the dashboard JSON the test reads.
type grafanaDashboard struct {
	SchemaVersion int `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title      string `json:"title"`
		Type       string `json:"type"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// followsVariable says whether a dashboard query is narrowed by one of the
// dashboard's variables.
func followsVariable(expr string) bool {
	for _, f := range []string{`consumer=~"$consumer"`, `table=~"$table"`, `table=~"$outbox"`, `destination=~"$destination"`} {
		if strings.Contains(expr, f) {
			return true
		}
	}
	return false
}

// unlabelled says whether every idem metric expr uses has no labels, so
// that no variable could narrow it.
func unlabelled(expr string, fams map[string]*dto.MetricFamily) bool {
	for _, n := range metricName.FindAllString(expr, -1) {
		mf := fams[base(n, fams)]
		if mf == nil || len(mf.GetMetric()) == 0 || len(mf.GetMetric()[0].GetLabel()) > 0 {
			return false
		}
	}
	return true
}

func dashboardExprs(t *testing.T, fams map[string]*dto.MetricFamily) []string {
	t.Helper()
	b, err := os.ReadFile(deployDashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", deployDashboard, err)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want a current dashboard (36 or later)", d.SchemaVersion)
	}
	vars := map[string]string{}
	var exprs []string
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		var q struct {
			Query string `json:"query"`
		}
		if v.Type == "query" {
			if err := json.Unmarshal(v.Query, &q); err != nil || q.Query == "" {
				t.Errorf("variable %s: no query (%v)", v.Name, err)
			}
			exprs = append(exprs, q.Query)
		}
	}
	if vars["DS_PROMETHEUS"] != "datasource" || vars["consumer"] != "query" || vars["table"] != "query" || vars["outbox"] != "query" || vars["destination"] != "query" {
		t.Errorf("variables %v: want a datasource variable DS_PROMETHEUS and query variables consumer, table, outbox and destination", vars)
	}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${DS_PROMETHEUS}" {
			t.Errorf("panel %q: datasource is not ${DS_PROMETHEUS}", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if !followsVariable(tg.Expr) && !unlabelled(tg.Expr, fams) {
				t.Errorf("panel %q: query %q follows none of the consumer, table, outbox and destination variables", p.Title, tg.Expr)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	return exprs
}

var (
	metricName = regexp.MustCompile(`\bidem_[a-z_]+\b`)
	// A selector: a metric name and its matchers.
	selector = regexp.MustCompile(`\b(idem_[a-z_]+)\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
)

// base is the family a name used in a query belongs to: a histogram's
// _bucket, _sum and _count series are its own.
func base(name string, fams map[string]*dto.MetricFamily) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, suffix); ok {
			if mf := fams[b]; mf != nil && mf.GetType() == dto.MetricType_HISTOGRAM {
				return b
			}
		}
	}
	return name
}

// labelValues are the values idem produces for the labels with a fixed
// set, from the core's own names.
func labelValues() map[string][]string {
	var outcomes, actions []string
	for o := idem.Applied; o <= idem.Expired; o++ {
		outcomes = append(outcomes, o.String())
	}
	for a := idem.ActionAck; a <= idem.ActionDeadLetter; a++ {
		actions = append(actions, a.String())
	}
	return map[string][]string{
		"outcome": outcomes,
		"action":  actions,
		"class":   {"transient", "permanent", "unavailable", "config", "busy"},
		"result":  {"ok", "error"},
		"batch":   {"true", "false"},
		"reason": {idemprom.ReasonNoMessageID, idemprom.ReasonBadKey, idemprom.ReasonUntimed, idemprom.ReasonNoPartitionTime,
			idemprom.ReasonExpired, idemprom.ReasonPruned, idemprom.ReasonRetriesExhausted, idemprom.ReasonPermanent, idemprom.ReasonOther},
	}
}

// checkQuery lists what is wrong with expr: a metric name the code does
// not export, a label the metric does not have, or a value of a
// fixed-set label it never takes. The families it uses go in used.
func checkQuery(expr string, fams map[string]*dto.MetricFamily, used map[string]bool) []string {
	var problems []string
	names := metricName.FindAllString(expr, -1)
	if len(names) == 0 {
		problems = append(problems, "uses no idem metric")
	}
	for _, n := range names {
		b := base(n, fams)
		if fams[b] == nil {
			problems = append(problems, n+" is not a metric idemprom exports")
			continue
		}
		used[b] = true
	}
	values := labelValues()
	for _, sel := range selector.FindAllStringSubmatch(expr, -1) {
		mf := fams[base(sel[1], fams)]
		if mf == nil {
			continue
		}
		labels := map[string]bool{"le": mf.GetType() == dto.MetricType_HISTOGRAM && strings.HasSuffix(sel[1], "_bucket")}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels[l.GetName()] = true
		}
		for _, m := range matcher.FindAllStringSubmatch(sel[2], -1) {
			label, op, val := m[1], m[2], m[3]
			if !labels[label] {
				problems = append(problems, sel[1]+" has no label "+label)
				continue
			}
			set, fixed := values[label]
			if !fixed || strings.Contains(val, "$") {
				continue
			}
			alts := []string{val}
			if op == "=~" || op == "!~" {
				alts = strings.Split(val, "|")
			}
			for _, v := range alts {
				if !slices.Contains(set, v) {
					problems = append(problems, fmt.Sprintf("%s{%s} never takes the value %q (it takes %v)", sel[1], label, v, set))
				}
			}
		}
	}
	return problems
}

// TestDeployNamesMatch reads the shipped alert rules and dashboard and
// checks every metric, label and label value their queries use against
// what idemprom exports, and that the dashboard shows every metric.
func TestDeployNamesMatch(t *testing.T) {
	fams := exported(t)
	exprs, alerts := ruleExprs(t)
	if len(alerts) < 8 {
		t.Errorf("%d alerts in %s: %v", len(alerts), deployRules, alerts)
	}
	inRules := map[string]bool{}
	for i, e := range exprs {
		for _, p := range checkQuery(e, fams, inRules) {
			t.Errorf("%s, alert %s: %s (in %q)", deployRules, alerts[i], p, e)
		}
	}
	inDashboard := map[string]bool{}
	for _, e := range dashboardExprs(t, fams) {
		for _, p := range checkQuery(e, fams, inDashboard) {
			t.Errorf("%s: %s (in %q)", deployDashboard, p, e)
		}
	}
	for name := range fams {
		if !inDashboard[name] {
			t.Errorf("%s is exported but no dashboard panel shows it", name)
		}
	}
	for _, name := range []string{
		"idem_inbox_consumer_headroom_seconds", "idem_inbox_consumer_oldest_marker_age_seconds", "idem_dead_letters_total",
		"idem_settled_total", "idem_late_duplicates_total", "idem_untimed_total", "idem_messages_total",
		"idem_outbox_unsent", "idem_outbox_oldest_unsent_age_seconds", "idem_outbox_parked", "idem_outbox_outages_total", "idem_outbox_stats_up",
		"idem_reconcile_missing", "idem_reconcile_last_run_timestamp_seconds", "idem_consumer_paused_since_timestamp_seconds",
	} {
		if !inRules[name] {
			t.Errorf("no alert rule uses %s", name)
		}
	}
}

// TestDeployCheckCatchesMisspelling makes sure the check above is not
// vacuous: a misspelt name, label or value in a query is reported.
func TestDeployCheckCatchesMisspelling(t *testing.T) {
	fams := exported(t)
	for _, expr := range []string{
		`rate(idem_message_total[5m])`,
		`rate(idem_settled_total{action="held"}[5m])`,
		`rate(idem_dead_letters_total{reasons="permanent"}[5m])`,
		`rate(idem_attempts_failed_total{class=~"unavailable|outage"}[5m])`,
		`histogram_quantile(0.99, rate(idem_duplicate_age_second_bucket[5m]))`,
		`idem_inbox_consumer_headroom{consumer="ledger"}`,
	} {
		if problems := checkQuery(expr, fams, map[string]bool{}); len(problems) == 0 {
			t.Errorf("%q passed the check", expr)
		}
	}
	if problems := checkQuery(`sum by (le) (rate(idem_duplicate_age_seconds_bucket{consumer=~"$consumer"}[5m]))`, fams, map[string]bool{}); len(problems) != 0 {
		t.Errorf("a correct query was refused: %v", problems)
	}
	// A panel must follow a variable unless its metrics have no labels.
	if e := `sum by (destination) (idem_outbox_unsent)`; followsVariable(e) || unlabelled(e, fams) {
		t.Errorf("%q passed as following a variable", e)
	}
	if e := `sum by (instance) (rate(idem_outbox_outages_total[5m]))`; !unlabelled(e, fams) {
		t.Errorf("%q: the outage counter has no label a variable could narrow", e)
	}
}
