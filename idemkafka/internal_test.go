package idemkafka

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestVerbTable(t *testing.T) {
	cases := map[idem.Action]verb{
		idem.ActionAck:        commit,
		idem.ActionDeadLetter: deadLetter,
		idem.ActionRedeliver:  retry,
		idem.ActionHold:       retry,
		idem.Action(0):        retry, // unknown: lose nothing
		idem.Action(99):       retry,
	}
	for a, want := range cases {
		if got := verbFor(idem.Disposition{Action: a}); got != want {
			t.Errorf("verbFor(%v) = %v, want %v", a, got, want)
		}
	}
}

// dispose is a stand-in for Processor.Dispose: the outcome decides, a
// Blameless retry is held.
func dispose(r idem.Result) idem.Disposition {
	switch {
	case r.Outcome.Acked():
		return idem.Disposition{Action: idem.ActionAck}
	case r.Outcome == idem.DeadLettered, r.Outcome == idem.Expired:
		return idem.Disposition{Action: idem.ActionDeadLetter}
	case r.Blameless:
		return idem.Disposition{Action: idem.ActionHold, Delay: 7 * time.Millisecond}
	}
	return idem.Disposition{Action: idem.ActionRedeliver}
}

// disposed is results with the dispositions dispose gives them, as the
// processor returns them.
func disposed(results []idem.Result) []idem.Result {
	for i := range results {
		results[i].Disposition = dispose(results[i])
	}
	return results
}

func records(topic string, partition int32, from, n int64) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Partition: partition, Offset: from + int64(i)}
	}
	return recs
}

func TestSettleStopsAtTheFirstRecordToRetry(t *testing.T) {
	var dead []int64
	s := settler{
		deadLetter: func(_ context.Context, r *kgo.Record, _ idem.Result) error {
			dead = append(dead, r.Offset)
			return nil
		},
		minDelay: time.Second,
		stats:    &counters{},
	}
	recs := records("t", 0, 10, 6)
	badTime := idem.Result{Outcome: idem.DeadLettered, Err: ErrBadTime}
	results := []idem.Result{
		{Outcome: idem.Applied}, {Outcome: idem.Duplicate}, badTime, {Outcome: idem.DeadLettered},
		{Outcome: idem.Retry, Blameless: true}, {Outcome: idem.Applied},
	}
	got := s.settle(context.Background(), recs, disposed(results))
	if got.n != 4 || !got.retry || got.delay != 7*time.Millisecond || got.halt {
		t.Errorf("settled %+v; want 4 done, then a retry after the disposition's 7ms", got)
	}
	if !slices.Equal(dead, []int64{12, 13}) {
		t.Errorf("dead letters at %v; want 12 and 13", dead)
	}
	st := s.stats
	if st.applied.Load() != 1 || st.duplicates.Load() != 1 || st.deadLettered.Load() != 2 || st.held.Load() != 1 || st.retried.Load() != 0 {
		t.Errorf("counters applied %d dup %d dead %d held %d retried %d", st.applied.Load(), st.duplicates.Load(),
			st.deadLettered.Load(), st.held.Load(), st.retried.Load())
	}

	// A counted retry with no delay waits the floor; a dead letter that
	// cannot be produced halts before its record.
	got = s.settle(context.Background(), recs[:1], disposed([]idem.Result{{Outcome: idem.Retry}}))
	if got.n != 0 || !got.retry || got.delay != time.Second || s.stats.retried.Load() != 1 {
		t.Errorf("settled %+v; want a counted retry after the 1s floor", got)
	}
	s.deadLetter = func(context.Context, *kgo.Record, idem.Result) error { return context.Canceled }
	got = s.settle(context.Background(), recs[:2], disposed([]idem.Result{{Outcome: idem.Applied}, {Outcome: idem.DeadLettered}}))
	if got.n != 1 || !got.halt {
		t.Errorf("settled %+v; want 1 done, then a halt", got)
	}
}

// fakeClient is a round's client: polls return what the test pushes.
type fakeClient struct {
	mu      sync.Mutex
	paused  map[tp]int // pauses minus resumes
	offsets map[tp]kgo.EpochOffset
	fetches chan kgo.Fetches
	polls   int
}

func newFakeClient() *fakeClient {
	return &fakeClient{paused: map[tp]int{}, offsets: map[tp]kgo.EpochOffset{}, fetches: make(chan kgo.Fetches)}
}

func (f *fakeClient) PollRecords(ctx context.Context, _ int) kgo.Fetches {
	f.mu.Lock()
	f.polls++
	f.mu.Unlock()
	select {
	case fs := <-f.fetches:
		return fs
	case <-ctx.Done():
		return kgo.NewErrFetch(ctx.Err())
	}
}

func (f *fakeClient) PauseFetchPartitions(m map[string][]int32) map[string][]int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	for t, ps := range m {
		for _, p := range ps {
			f.paused[tp{t, p}]++
		}
	}
	return nil
}

func (f *fakeClient) ResumeFetchPartitions(m map[string][]int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for t, ps := range m {
		for _, p := range ps {
			f.paused[tp{t, p}]--
		}
	}
}

func (f *fakeClient) SetOffsets(m map[string]map[int32]kgo.EpochOffset) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for t, ps := range m {
		for p, o := range ps {
			f.offsets[tp{t, p}] = o
		}
	}
}

func fetchOf(recs ...[]*kgo.Record) kgo.Fetches {
	var f kgo.Fetch
	for _, rs := range recs {
		f.Topics = append(f.Topics, kgo.FetchTopic{Topic: rs[0].Topic, Partitions: []kgo.FetchPartition{{Partition: rs[0].Partition, Records: rs}}})
	}
	return kgo.Fetches{f}
}

// While one partition's worker is busy, the round polls for the others and
// runs them; it pauses each partition exactly while it has a worker.
func TestRoundOtherPartitionsFlowWhileOneIsBusy(t *testing.T) {
	fc := newFakeClient()
	release := make(chan struct{})
	var mu sync.Mutex
	var order []string
	work := func(_ context.Context, _ <-chan struct{}, k tp, recs []*kgo.Record) []*kgo.Record {
		if k.partition == 0 {
			<-release
		}
		mu.Lock()
		order = append(order, k.topic)
		mu.Unlock()
		if k.partition == 1 && recs[0].Offset == 5 {
			close(release) // the second batch of partition 1 ran while 0 was busy
		}
		return nil
	}
	r := newRound(context.Background(), fc, work, 100, time.Minute, nil, quiet, &counters{})
	go func() { fc.fetches <- fetchOf(records("b", 1, 5, 3)) }()
	r.run(fetchOf(records("a", 0, 0, 2), records("b", 1, 0, 5)))
	if !slices.Equal(order, []string{"b", "b", "a"}) {
		t.Errorf("workers finished in order %v; want partition 1 twice, then 0", order)
	}
	for k, n := range fc.paused {
		if n != 0 {
			t.Errorf("partition %v paused %d more times than resumed", k, n)
		}
	}
	if len(fc.offsets) != 0 || r.stats.delivered.Load() != 10 {
		t.Errorf("rewound %v, delivered %d; want nothing rewound, 10 delivered", fc.offsets, r.stats.delivered.Load())
	}
}

// When a rebalance waits, the workers are told to stop, the queued records
// start no worker, and every partition with records left is rewound to the
// first of them; the batches in flight are cancelled once the grace is
// over.
func TestRoundGivesUpOnRebalance(t *testing.T) {
	fc := newFakeClient()
	rebalance := make(chan struct{})
	started := make(chan struct{})
	var cancelled bool
	work := func(ctx context.Context, stop <-chan struct{}, k tp, recs []*kgo.Record) []*kgo.Record {
		if k.partition != 0 {
			return nil
		}
		close(started)
		<-stop       // told to stop: no new batch
		<-ctx.Done() // the batch in flight runs until the grace is over
		cancelled = true
		return recs[1:] // the first record settled
	}
	r := newRound(context.Background(), fc, work, 100, 10*time.Millisecond, rebalance, quiet, &counters{})
	go func() {
		<-started
		// A poll made meanwhile brings more of partition 1; it must be
		// given up too, not run.
		fc.fetches <- fetchOf(records("t", 1, 3, 4))
		close(rebalance)
	}()
	done := make(chan struct{})
	go func() {
		r.run(fetchOf(records("t", 0, 20, 3), records("t", 1, 0, 3)))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the round did not end after the rebalance signal")
	}
	if !cancelled {
		t.Error("the batch in flight was not cancelled after the grace")
	}
	want := map[tp]kgo.EpochOffset{{"t", 0}: {Offset: 21}}
	if fc.offsets[tp{"t", 0}] != want[tp{"t", 0}] {
		t.Errorf("rewound to %v, want partition 0 at 21", fc.offsets)
	}
	// Partition 1's extra records came while its first batch may or may
	// not have been running; either they ran or they were rewound to 3.
	if o, ok := fc.offsets[tp{"t", 1}]; ok && o.Offset != 3 {
		t.Errorf("partition 1 rewound to %d, want 3", o.Offset)
	}
	for k, n := range fc.paused {
		if n != 0 {
			t.Errorf("partition %v paused %d more times than resumed", k, n)
		}
	}
}

// Run's end stops the round like a rebalance, without a grace: the workers'
// context is Run's.
func TestRoundStopsWithRun(t *testing.T) {
	fc := newFakeClient()
	ctx, cancel := context.WithCancel(context.Background())
	work := func(ctx context.Context, stop <-chan struct{}, _ tp, recs []*kgo.Record) []*kgo.Record {
		cancel()
		<-ctx.Done()
		if !closed(stop) {
			<-stop
		}
		return recs
	}
	r := newRound(ctx, fc, work, 100, time.Hour, nil, quiet, &counters{})
	r.run(fetchOf(records("t", 0, 7, 2)))
	if o := fc.offsets[tp{"t", 0}]; o.Offset != 7 || r.stats.givenUp.Load() != 2 {
		t.Errorf("rewound to %v, given up %d; want 7 and 2", fc.offsets, r.stats.givenUp.Load())
	}
}

func TestRebalanceSignalIgnoresLateCalls(t *testing.T) {
	n := 0
	s := &rebalanceSignal{count: func() { n++ }}
	s.raise() // between polls: nothing waits
	ch := s.arm()
	s.raise()
	s.raise()
	if !closed(ch) || n != 1 {
		t.Errorf("closed %v, counted %d; want closed once", closed(ch), n)
	}
	s.disarm()
	s.raise()
	if ch2 := s.arm(); closed(ch2) || n != 1 {
		t.Error("a late call closed the next poll's channel")
	}
}

// A poll that brings only errors (a broker refusing at once) is not
// repeated at once while a worker runs; a closed client is not polled
// again.
func TestRoundDoesNotSpinOnFetchErrors(t *testing.T) {
	fc := newFakeClient()
	release := make(chan struct{})
	work := func(context.Context, <-chan struct{}, tp, []*kgo.Record) []*kgo.Record {
		<-release
		return nil
	}
	r := newRound(context.Background(), fc, work, 100, time.Minute, nil, quiet, &counters{})
	r.pollWait = time.Hour
	go func() {
		fc.fetches <- kgo.NewErrFetch(errors.New("not authorized"))
		// Had the round polled again, this send would be taken.
		select {
		case fc.fetches <- kgo.NewErrFetch(errors.New("again")):
			t.Error("the round polled again at once after an error")
		case <-time.After(100 * time.Millisecond):
		}
		close(release)
	}()
	r.run(fetchOf(records("t", 0, 0, 1)))
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.polls != 1 {
		t.Errorf("%d extra polls, want 1", fc.polls)
	}
}

// A refused commit is tried again only for what a still-owning member can
// wait out.
func TestRetriableCommitErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{kerr.NotCoordinator, true},
		{kerr.CoordinatorLoadInProgress, true},
		{kerr.RebalanceInProgress, true},
		{kerr.IllegalGeneration, false},
		{kerr.UnknownMemberID, false},
		{kerr.FencedInstanceID, false},
		{kerr.UnknownTopicOrPartition, false},
		{kerr.GroupAuthorizationFailed, false},
		{context.DeadlineExceeded, false},
		{kgo.ErrClientClosed, false},
		{errors.New("connection reset"), true},
	} {
		if got := retriable(c.err); got != c.want {
			t.Errorf("retriable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// After a truncation the client still holds the group's committed offset
// from before it; a pending commit between the reset and that offset has
// not been committed, and is sent.
func TestPendingCommitAfterTruncationIsSent(t *testing.T) {
	k := tp{"t", 0}
	var marks commitMarks
	var pending pendingCommits
	marks.accept(k, 150)
	marks.lower(k, 100)
	pending.put(k, pendingCommit{offset: 130})
	send := pending.take(marks.clamp(map[tp]int64{k: 150}), marks.covers)
	if _, ok := send[k]; !ok {
		t.Fatal("the pending commit of 130 after a truncation to 100 was dropped; the client held 150")
	}
	marks.accept(k, 130)
	if got := marks.clamp(map[tp]int64{k: 150})[k]; got != 150 {
		t.Fatalf("after a commit was accepted, the held offset is clamped to %d", got)
	}
}
