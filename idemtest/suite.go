package idemtest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/idemkit/idem"
)

// Case is how one consumer is tested: a sample message and a way to build
// the consumer over a fresh database.
type Case[TTx any] struct {
	// Sample is a message the consumer handles, built as its producer builds
	// it. Required: a case without one (no ID) fails the suite, because a
	// consumer without a sample is a consumer without a test.
	Sample idem.Message
	// Setup builds the consumer over a fresh, empty database. Required.
	Setup Setup[TTx]
	// AllowNoEffect accepts a sample whose first delivery changes nothing
	// the snapshotter sees. See [AllowNoEffect].
	AllowNoEffect bool
	// Concurrency is how many deliveries race in [DeliverConcurrently].
	// Defaults to 4; keep it at most the pool's connection count.
	Concurrency int
}

// Suite is the list of a codebase's consumers, each with its [Case]. Build
// one in a test file, [Suite.Register] every consumer, and run them all
// with [ForEachConsumer]. The zero Suite is empty and ready to use.
type Suite[TTx any] struct {
	names []string
	cases map[string]Case[TTx]
}

// Register adds the consumer named name (its [idem.Config.Consumer]). It
// panics on a name registered twice, a programming error best caught at
// once.
func (s *Suite[TTx]) Register(name string, c Case[TTx]) {
	if s.cases == nil {
		s.cases = map[string]Case[TTx]{}
	}
	if _, dup := s.cases[name]; dup {
		panic(fmt.Sprintf("idemtest: consumer %q registered twice", name))
	}
	s.names = append(s.names, name)
	s.cases[name] = c
}

// Names returns the registered consumers' names, in registration order.
func (s *Suite[TTx]) Names() []string { return slices.Clone(s.names) }

// ForEachConsumer runs [DeliverTwice], [DeliverConcurrently] and
// [CrashAfterCommit] on every registered consumer, as subtests named
// consumer/check, each on a fresh database.
//
// wired lists the names of every consumer the application actually starts,
// taken from the code that wires them (not typed again by hand). Each wired
// consumer that is not registered fails the suite, and so does each
// registered one that is not wired (a typo, or a test for a consumer that no
// longer exists). That makes adding a consumer without a test impossible:
// the new consumer shows up in wired and fails until someone registers it
// with a sample message.
func ForEachConsumer[TTx any](t *testing.T, s *Suite[TTx], wired ...string) {
	t.Helper()
	for _, p := range s.coverage(wired) {
		t.Error(p)
	}
	for _, name := range s.names {
		c := s.cases[name]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if c.Sample.ID == "" {
				t.Fatalf("consumer %s has no sample message: register it with Case.Sample, a message as its producer sends it", name)
			}
			if c.Setup == nil {
				t.Fatalf("consumer %s has no Setup", name)
			}
			var opts []Option
			if c.AllowNoEffect {
				opts = append(opts, AllowNoEffect())
			}
			n := c.Concurrency
			if n == 0 {
				n = 4
			}
			named := func(t testing.TB, faults idem.FaultFunc) (*idem.Processor[TTx], Snapshotter) {
				t.Helper()
				proc, snap := c.Setup(t, faults)
				if proc.Consumer() != name {
					t.Fatalf("consumer registered as %s but Setup builds %s", name, proc.Consumer())
				}
				return proc, snap
			}
			t.Run("DeliverTwice", func(t *testing.T) {
				proc, snap := named(t, nil)
				DeliverTwice(t, proc, c.Sample, snap, opts...)
			})
			t.Run("DeliverConcurrently", func(t *testing.T) {
				DeliverConcurrently(t, named, c.Sample, n, opts...)
			})
			t.Run("CrashAfterCommit", func(t *testing.T) {
				CrashAfterCommit(t, named, c.Sample, opts...)
			})
		})
	}
}

// coverage lists wired consumers without a case and cases not wired.
func (s *Suite[TTx]) coverage(wired []string) []string {
	if len(wired) == 0 {
		return nil
	}
	var problems []string
	for _, w := range wired {
		if _, ok := s.cases[w]; !ok {
			problems = append(problems, fmt.Sprintf("consumer %s is wired but has no idempotency test: register it with a sample message", w))
		}
	}
	for _, n := range s.names {
		if !slices.Contains(wired, n) {
			problems = append(problems, fmt.Sprintf("consumer %s is registered but not wired: a typo, or a consumer that no longer exists", n))
		}
	}
	return problems
}
