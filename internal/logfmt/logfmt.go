// Package logfmt is how idem writes its log lines, whatever handler the
// application gave it: durations as text ("1.5s", not nanoseconds in a
// JSON handler) and every error and string on one line (a driver's
// multi-line error, with its DETAIL or HINT, or errors.Join's, flattened).
package logfmt

import (
	"context"
	"log/slog"
	"strings"
)

// Wrap returns l writing through the rules of this package; a logger
// already wrapped is returned as is.
func Wrap(l *slog.Logger) *slog.Logger {
	if l == nil {
		return nil
	}
	if _, ok := l.Handler().(handler); ok {
		return l
	}
	return slog.New(handler{l.Handler()})
}

// OneLine joins the lines of s with "; ", each trimmed, empty ones
// dropped.
func OneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	out := lines[:0]
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, strings.TrimSuffix(l, ":"))
		}
	}
	return strings.Join(out, "; ")
}

type handler struct{ h slog.Handler }

func (h handler) Enabled(ctx context.Context, l slog.Level) bool { return h.h.Enabled(ctx, l) }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, OneLine(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(fix(a))
		return true
	})
	return h.h.Handle(ctx, out)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	fixed := make([]slog.Attr, len(as))
	for i, a := range as {
		fixed[i] = fix(a)
	}
	return handler{h.h.WithAttrs(fixed)}
}

func (h handler) WithGroup(name string) slog.Handler { return handler{h.h.WithGroup(name)} }

func fix(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindDuration:
		return slog.String(a.Key, v.Duration().String())
	case slog.KindString:
		if s := v.String(); strings.ContainsAny(s, "\r\n") {
			return slog.String(a.Key, OneLine(s))
		}
	case slog.KindAny:
		if err, ok := v.Any().(error); ok && err != nil {
			return slog.String(a.Key, OneLine(err.Error()))
		}
	case slog.KindGroup:
		g := v.Group()
		fixed := make([]any, len(g))
		for i, m := range g {
			fixed[i] = fix(m)
		}
		return slog.Group(a.Key, fixed...)
	}
	return slog.Attr{Key: a.Key, Value: v}
}
