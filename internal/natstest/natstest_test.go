package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/internal/natstest"
)

func jetStream(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// A stopped server comes back on its port with its store: the stream and
// the acknowledged message are there.
func TestRestartKeepsStore(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t)
	js := jetStream(t, s.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEEP", Subjects: []string{"keep"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "keep", []byte("x")); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if s.Running() {
		t.Fatal("Running after Stop")
	}
	s.Start()
	var info *jetstream.StreamInfo
	for {
		st, err := js.Stream(ctx, "KEEP")
		if err == nil {
			if info, err = st.Info(ctx); err == nil {
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("stream KEEP after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if info.State.Msgs != 1 {
		t.Errorf("stream KEEP holds %d messages after the restart; want 1", info.State.Msgs)
	}
}

// Three nodes form one JetStream cluster: a stream of three replicas is
// placed on all of them.
func TestCluster(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t)
	js := jetStream(t, c.URLs())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var err error
	for {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3"}, Replicas: 3, Storage: jetstream.FileStorage})
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the meta leader may still be settling
	}
	if err != nil {
		t.Fatalf("creating an R3 stream: %v", err)
	}
	if _, err := js.Publish(ctx, "r3", []byte("x")); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "R3")
	if err != nil {
		t.Fatal(err)
	}
	info := st.CachedInfo()
	if info.Cluster == nil || len(info.Cluster.Replicas)+1 != 3 {
		t.Errorf("stream R3 cluster info %+v; want a leader and two replicas", info.Cluster)
	}
}
