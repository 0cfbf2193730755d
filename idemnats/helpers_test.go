package idemnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// testIDHeader is where the conformance tests put message IDs: the suite
// publishes copies of one ID back to back, which JetStream's publish
// dedupe would drop if the ID were in Nats-Msg-Id.
const testIDHeader = "Idem-Msg-Id"

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9]+`)

// uniqueName is a stream name for t that no other test uses.
func uniqueName(t testing.TB) string {
	n := strings.Trim(unsafeName.ReplaceAllString(t.Name(), "_"), "_")
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "T_" + n + "_" + hex.EncodeToString(b)
}

// connect opens a test connection to url, closed when t ends.
func connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connecting to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// createStreams creates stream name on subject name+".msgs" and its
// dead-letter stream name+"_DLQ" on "idem.dlq."+name, both file-backed.
func createStreams(t testing.TB, js jetstream.JetStream, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".msgs"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("creating stream %s: %v", name, err)
	}
	createDeadLetterStream(t, js, name)
}

func createDeadLetterStream(t testing.TB, js jetstream.JetStream, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name + "_DLQ", Subjects: []string{"idem.dlq." + name}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("creating stream %s_DLQ: %v", name, err)
	}
}
