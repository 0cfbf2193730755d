package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// svgTexts checks that data is a well-formed SVG document and returns
// the content of its text elements, in order.
func svgTexts(t *testing.T, data []byte) []string {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(data))
	var texts []string
	var root string
	depth, inText := 0, false
	var cur strings.Builder
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				root = el.Name.Local
			}
			depth++
			if el.Name.Local == "text" {
				inText = true
				cur.Reset()
			}
		case xml.EndElement:
			depth--
			if el.Name.Local == "text" {
				inText = false
				texts = append(texts, cur.String())
			}
		case xml.CharData:
			if inText {
				cur.Write(el)
			}
		}
	}
	if root != "svg" || depth != 0 {
		t.Fatalf("root element %q, depth %d at the end; want a closed svg", root, depth)
	}
	return texts
}

func count(ss []string, want string) int {
	n := 0
	for _, s := range ss {
		if s == want {
			n++
		}
	}
	return n
}

func TestRenderSVG(t *testing.T) {
	rep, err := load(filepath.Join("testdata", "two-brokers.json"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Render(&buf, rep, "svg", 96); err != nil {
		t.Fatal(err)
	}
	texts := svgTexts(t, buf.Bytes())

	// One label per consumer and broker, from its best error-free run:
	// the second hand-rolled RabbitMQ run is faster than the first, the
	// first Watermill run is faster but not exactly once; Kafka is in
	// process, so its labels have no rates.
	labels := []string{
		"1.19× · 11,924 msgs/s · 29 doubled",
		"0.044× · 437 msgs/s",
		"1.00× · 10,000 msgs/s",
		"0.055× · 550 msgs/s",
		"0.052× · 516 msgs/s",
		"1.21× · 12,061 msgs/s",
		"1.37× · 13,693 msgs/s",
		"1.10× · 3 doubled",
		"1.00×",
		"failed: timed out after 10m0s with 0 of 3030 deliveries acked",
		"1.30×",
	}
	for _, l := range labels {
		if n := count(texts, l); n != 1 {
			t.Errorf("bar label %q appears %d times, want once", l, n)
		}
	}
	// Anything shaped like a bar label (the axis' ticks are "0.05×", "2×")
	// must be one of them: no bar for a run that was not the best.
	barLike := regexp.MustCompile(`^([0-9.]+× · |failed: |[1-9][0-9]*\.[0-9]{2}×$)`)
	bars, rates := 0, 0
	for _, s := range texts {
		if barLike.MatchString(s) {
			bars++
		}
		if strings.Contains(s, " msgs/s") {
			rates++
		}
	}
	if bars != len(labels) {
		t.Errorf("%d bar labels, want %d: %q", bars, len(labels), texts)
	}
	if rates != 7 {
		t.Errorf("%d labels with a rate, want the 7 RabbitMQ ones", rates)
	}
	// The consumers name their bars, Watermill and the naive and
	// batched ones on both brokers.
	names := map[string]int{
		"naive batched (no guard)":                    2,
		"inbox SQL by hand, per message":              1,
		"hand-rolled batched inbox":                   2,
		"Watermill router + inbox SQL in its handler": 2,
		"idem per message (Handler)":                  1,
		"idem batched (HandleBatch)":                  2,
		"idem batched, 2 workers":                     1,
	}
	for name, want := range names {
		if n := count(texts, name); n != want {
			t.Errorf("consumer %q named %d times, want %d", name, n, want)
		}
	}
	for _, want := range []string{
		"RabbitMQ",
		"Kafka (in process: only the ratios mean something)",
		"3,000 messages + 30 redeliveries, batch 100, prefetch 500, best of 2 runs",
		"2 CPUs · linux/amd64 · go1.26.8 · PostgreSQL 15.20 · RabbitMQ 3.10.8 · Kafka kfake (in-process)",
		"1×",
	} {
		if count(texts, want) != 1 {
			t.Errorf("no text %q", want)
		}
	}
	if bytes.Contains(buf.Bytes(), []byte("font-family:Liberation Sans;")) {
		t.Error("a font without a fallback")
	}
}

func TestRenderOneBrokerNoBaseline(t *testing.T) {
	rep := &Report{Messages: 10, Batch: 1, Prefetch: 1, Machine: Machine{RabbitMQ: "3.13"}, Results: []Result{
		{Broker: "rabbitmq", Key: "idem-msg", Consumer: "idem per message", Guarded: true, Rate: 100, OK: true, Absolute: true, Iteration: 1},
		{Broker: "rabbitmq", Key: "handrolled-batch", Consumer: "hand-rolled batched inbox", Guarded: true, Error: "boom", Absolute: true, Iteration: 1},
	}}
	var buf bytes.Buffer
	if err := Render(&buf, rep, "svg", 96); err != nil {
		t.Fatal(err)
	}
	texts := svgTexts(t, buf.Bytes())
	for _, want := range []string{"100 msgs/s, no hand-rolled batched baseline", "failed: boom", "10 messages + 0 redeliveries, batch 1, prefetch 1"} {
		if count(texts, want) != 1 {
			t.Errorf("no text %q in %q", want, texts)
		}
	}
	for _, s := range texts {
		if strings.Contains(s, "Kafka") {
			t.Errorf("%q names a broker the report does not have", s)
		}
	}
}

func TestRenderPNG(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "peers.png")
	if err := run([]string{"-in", filepath.Join("testdata", "two-brokers.json"), "-out", out}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Width != 800 {
		t.Errorf("%d pixels wide, want 800", cfg.Width)
	}
}

func TestBest(t *testing.T) {
	rs := []Result{
		{Broker: "b", Key: "x", Rate: 5, Error: "failed"},
		{Broker: "b", Key: "y", Rate: 1},
		{Broker: "b", Key: "x", Rate: 2},
		{Broker: "b", Key: "x", Rate: 9, Error: "not exactly once"},
		{Broker: "b", Key: "x", Rate: 3},
		{Broker: "c", Key: "x", Rate: 7},
	}
	got := Best(rs)
	if len(got) != 3 || got[0].Key != "x" || got[0].Rate != 3 || got[1].Key != "y" || got[2].Broker != "c" {
		t.Fatalf("Best = %+v", got)
	}
}

func TestThousands(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 13693.4: "13,693", 1234567: "1,234,567", -4321: "-4,321"} {
		if got := thousands(v); got != want {
			t.Errorf("thousands(%v) = %q, want %q", v, got, want)
		}
	}
}
