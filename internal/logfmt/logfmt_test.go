package logfmt

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestDurationsAsTextErrorsOnOneLine(t *testing.T) {
	var buf bytes.Buffer
	l := Wrap(slog.New(slog.NewJSONHandler(&buf, nil))).With(slog.Duration("window", 720*time.Hour))
	err := errors.Join(errors.New("failed to connect to `user=app`:"), errors.New("\t[::1]:5432 (localhost): dial error"), errors.New("\t127.0.0.1:5432 (localhost): dial error"))
	l.Warn("held", slog.Duration("delay", 1500*time.Millisecond), slog.Any("error", err), slog.Group("g", slog.Duration("backoff", time.Second)))
	got := buf.String()
	for _, want := range []string{`"window":"720h0m0s"`, `"delay":"1.5s"`, `"backoff":"1s"`,
		`"error":"failed to connect to ` + "`user=app`" + `; [::1]:5432 (localhost): dial error; 127.0.0.1:5432 (localhost): dial error"`} {
		if !strings.Contains(got, want) {
			t.Errorf("log line %s lacks %s", got, want)
		}
	}
	if strings.Count(got, "\n") != 1 || strings.Contains(got, `\n`) {
		t.Errorf("not one line: %q", got)
	}
}
