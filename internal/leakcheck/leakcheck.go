// Package leakcheck fails a test binary whose tests left goroutines running:
// call Main from TestMain. It uses the standard library only: the stacks of
// every goroutine, before the tests and after them.
package leakcheck

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Main runs the tests of m and returns their exit code, or 1 when they
// passed and left a goroutine running: one that was not there before the
// tests and is still there after grace (closed connections and pools stop
// their goroutines a moment after Close returns). The stacks of those it
// found are printed to stderr.
func Main(m *testing.M, grace time.Duration) int {
	before := goroutines()
	code := m.Run()
	if code != 0 {
		return code
	}
	var left []string
	for deadline := time.Now().Add(grace); ; {
		left = left[:0]
		for id, stack := range goroutines() {
			if _, ok := before[id]; !ok && !benign(stack) {
				left = append(left, stack)
			}
		}
		if len(left) == 0 {
			return code
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "leakcheck: %d goroutines the tests started are still running %v after they ended:\n\n%s\n", len(left), grace, strings.Join(left, "\n\n"))
	return 1
}

// benign reports whether a goroutine is the runtime's or the testing
// package's own, which outlive the tests by design.
func benign(stack string) bool {
	for _, s := range []string{
		"testing.(*M).",
		"testing.runTests",
		"testing.tRunner",
		"os/signal.",
		"runtime.ensureSigM",
		"leakcheck.goroutines",
	} {
		if strings.Contains(stack, s) {
			return true
		}
	}
	return false
}

// goroutines returns the stack of every goroutine by its ID.
func goroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		// "goroutine 7 [chan receive]:"
		head, _, _ := bytes.Cut(g, []byte("\n"))
		f := strings.Fields(string(head))
		if len(f) >= 2 && f[0] == "goroutine" {
			out[f[1]] = string(g)
		}
	}
	return out
}
