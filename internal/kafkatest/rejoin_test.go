package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// member speaks the classic group protocol for one member over a client
// of its own (a JoinGroup left waiting holds its connection's replies).
type member struct {
	t        *testing.T
	cl       *kgo.Client
	group    string
	id       string
	gen      int32
	session  time.Duration
	rebal    time.Duration
	metadata string
}

func newMember(t *testing.T, brokers []string, group string, session, rebal time.Duration, opts ...kgo.Opt) *member {
	t.Helper()
	return &member{t: t, cl: Client(t, brokers, opts...), group: group, session: session, rebal: rebal, metadata: "v1"}
}

func (m *member) joinReq() *kmsg.JoinGroupRequest {
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group = m.group
	req.MemberID = m.id
	req.SessionTimeoutMillis = int32(m.session.Milliseconds())
	req.RebalanceTimeoutMillis = int32(m.rebal.Milliseconds())
	req.ProtocolType = "idemtest"
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name, p.Metadata = "only", []byte(m.metadata)
	req.Protocols = []kmsg.JoinGroupRequestProtocol{p}
	return req
}

// join sends one JoinGroup and returns its response or the client's error.
func (m *member) join(ctx context.Context) (*kmsg.JoinGroupResponse, error) {
	return m.joinReq().RequestWith(ctx, m.cl)
}

// enter takes a member ID and sends the join that waits for the group.
func (m *member) enter(ctx context.Context) (*kmsg.JoinGroupResponse, error) {
	resp, err := m.join(ctx)
	if err != nil {
		return nil, err
	}
	if resp.ErrorCode != kerr.MemberIDRequired.Code {
		return nil, fmt.Errorf("first join: %v, want MEMBER_ID_REQUIRED", kerr.ErrorForCode(resp.ErrorCode))
	}
	m.id = resp.MemberID
	return m.joined(m.join(ctx))
}

// joined checks a join's response and keeps its generation.
func (m *member) joined(resp *kmsg.JoinGroupResponse, err error) (*kmsg.JoinGroupResponse, error) {
	if err != nil {
		return nil, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return resp, fmt.Errorf("join: %w", err)
	}
	m.gen = resp.Generation
	return resp, nil
}

// sync sends SyncGroup (the leader with an empty assignment for every
// member of its join response).
func (m *member) sync(ctx context.Context, join *kmsg.JoinGroupResponse) error {
	req := kmsg.NewPtrSyncGroupRequest()
	req.Group, req.MemberID, req.Generation = m.group, m.id, m.gen
	req.ProtocolType, req.Protocol = kmsg.StringPtr("idemtest"), kmsg.StringPtr("only")
	for _, jm := range join.Members {
		a := kmsg.NewSyncGroupRequestGroupAssignment()
		a.MemberID, a.MemberAssignment = jm.MemberID, []byte{}
		req.GroupAssignment = append(req.GroupAssignment, a)
	}
	resp, err := req.RequestWith(ctx, m.cl)
	if err != nil {
		return err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	return nil
}

// heartbeats keeps m's session alive until the returned stop is called.
func (m *member) heartbeats(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(m.session / 10)
		defer tick.Stop()
		for {
			req := kmsg.NewPtrHeartbeatRequest()
			req.Group, req.MemberID, req.Generation = m.group, m.id, m.gen
			_, _ = req.RequestWith(ctx, m.cl)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// members lists the group's member IDs as the coordinator describes them.
func members(ctx context.Context, cl *kgo.Client, group string) ([]string, error) {
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	if len(resp.Groups) != 1 {
		return nil, fmt.Errorf("describe: %d groups", len(resp.Groups))
	}
	var ids []string
	for _, gm := range resp.Groups[0].Members {
		ids = append(ids, gm.MemberID)
	}
	return ids, nil
}

type joinResult struct {
	resp *kmsg.JoinGroupResponse
	err  error
}

// stableTwo brings slow and victim into one stable generation; slow is the
// leader.
func stableTwo(t *testing.T, ctx context.Context, slow, victim *member) (stopHeartbeats func()) {
	t.Helper()
	j1, err := slow.enter(ctx)
	if err != nil {
		t.Fatalf("first member joining: %v", err)
	}
	if err := slow.sync(ctx, j1); err != nil {
		t.Fatalf("first member syncing: %v", err)
	}
	// The second member's join waits for the first to rejoin.
	second := make(chan joinResult, 1)
	go func() {
		r, err := victim.enter(ctx)
		second <- joinResult{r, err}
	}()
	var r1 *kmsg.JoinGroupResponse
	for {
		// The first member rejoins once the coordinator knows the
		// second (before, its join is answered at once, stable).
		r1, err = slow.joined(slow.join(ctx))
		if err != nil {
			t.Fatalf("first member rejoining: %v", err)
		}
		if len(r1.Members) == 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the second member never entered the group")
		case <-time.After(20 * time.Millisecond):
		}
	}
	r2 := <-second
	if r2.err != nil {
		t.Fatalf("second member joining: %v", r2.err)
	}
	stop := victim.heartbeats(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := victim.sync(ctx, r2.resp); err != nil {
			t.Errorf("second member syncing: %v", err)
		}
	}()
	if err := slow.sync(ctx, r1); err != nil {
		t.Fatalf("first member syncing: %v", err)
	}
	wg.Wait()
	return stop
}

// The chain that stalled group members under churn, on kfake: a known
// member rejoins, the rebalance waits for another member longer than the
// rejoining member's session timeout, and the coordinator drops the
// rejoining member without ever answering its JoinGroup. Its client learns
// nothing until its own request timeout (RebalanceTimeout plus
// RequestTimeoutOverhead) runs out, and then has to join again as a new
// member. With the session timeout longer than the rebalance timeout
// (GroupOptions), the same rejoin is answered.
func TestRejoinOutlivingSessionIsNeverAnswered(t *testing.T) {
	if os.Getenv("IDEM_KAFKA_BROKERS") != "" {
		t.Skip("pins kfake's behaviour")
	}
	t.Parallel()
	brokers := NewCluster(t).ListenAddrs()
	admin := Client(t, brokers)

	t.Run("session shorter than the wait", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		const group = "short-session"
		// The slow member holds the rebalance for up to a minute; the
		// victim's session is one second; its request timeout is its
		// rebalance timeout plus the overhead.
		slow := newMember(t, brokers, group, time.Minute, time.Minute)
		victim := newMember(t, brokers, group, time.Second, 2*time.Second,
			kgo.RequestTimeoutOverhead(3*time.Second), kgo.RequestRetries(0))
		stopHB := stableTwo(t, ctx, slow, victim)

		// The victim rejoins (new metadata, as after a subscription
		// change): the group waits for the slow member.
		stopHB()
		victim.metadata = "v2"
		pending := make(chan joinResult, 1)
		go func() {
			r, err := victim.join(ctx)
			pending <- joinResult{r, err}
		}()

		// The coordinator drops the victim once its session ran out,
		// while its join is still waiting.
		for {
			ids, err := members(ctx, admin, group)
			if err != nil {
				t.Fatalf("describing the group: %v", err)
			}
			if !slices.Contains(ids, victim.id) {
				break
			}
			select {
			case r := <-pending:
				t.Fatalf("the victim's join ended (%+v, %v) while it was still a member", r.resp, r.err)
			case <-ctx.Done():
				t.Fatalf("the victim stayed a member: %v", ids)
			case <-time.After(50 * time.Millisecond):
			}
		}

		// The slow member rejoins: the rebalance completes without the
		// victim.
		r1, err := slow.joined(slow.join(ctx))
		if err != nil {
			t.Fatalf("slow member rejoining: %v", err)
		}
		for _, jm := range r1.Members {
			if jm.MemberID == victim.id {
				t.Fatalf("the generation after the wait holds the dropped victim: %+v", r1.Members)
			}
		}

		// The victim's join is never answered: it ends on the client's
		// own deadline.
		var r joinResult
		select {
		case r = <-pending:
		case <-ctx.Done():
			t.Fatalf("the victim's join never ended")
		}
		if r.err == nil {
			t.Fatalf("the victim's join was answered (%v, generation %d); want it left unanswered until the client's request timeout",
				kerr.ErrorForCode(r.resp.ErrorCode), r.resp.Generation)
		}
		if !errors.Is(r.err, os.ErrDeadlineExceeded) {
			t.Fatalf("the victim's join failed with %v; want the client's read deadline (its request timeout)", r.err)
		}
		t.Logf("victim's join: %v", r.err)

		// Its member ID is gone: it must join again as a new member. The
		// timed-out request killed the victim's connection: the first
		// tries may meet it dying, as a client would, and are made again.
		resp, err := victim.join(ctx)
		for err != nil && ctx.Err() == nil {
			t.Logf("victim rejoining: %v (trying again)", err)
			time.Sleep(100 * time.Millisecond)
			resp, err = victim.join(ctx)
		}
		if err != nil {
			t.Fatalf("victim rejoining: %v", err)
		}
		if resp.ErrorCode != kerr.UnknownMemberID.Code {
			t.Fatalf("victim rejoining with its old ID: %v; want UNKNOWN_MEMBER_ID", kerr.ErrorForCode(resp.ErrorCode))
		}
	})

	t.Run("session longer than the rebalance timeout", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		const group = "long-session"
		// The slow member never rejoins: the rebalance waits its whole
		// timeout, well within the victim's session.
		const session, rebalance = 30 * time.Second, 3 * time.Second
		slow := newMember(t, brokers, group, time.Minute, rebalance)
		victim := newMember(t, brokers, group, session, rebalance, kgo.RequestRetries(0))
		stopHB := stableTwo(t, ctx, slow, victim)
		stopHB()
		victim.metadata = "v2"
		r, err := victim.joined(victim.join(ctx))
		if err != nil {
			t.Fatalf("the victim's rejoin: %v; want it answered", err)
		}
		if len(r.Members) != 0 && r.LeaderID != victim.id {
			t.Fatalf("unexpected join response %+v", r)
		}
		ids, err := members(ctx, admin, group)
		if err != nil {
			t.Fatalf("describing the group: %v", err)
		}
		if !slices.Equal(ids, []string{victim.id}) {
			t.Fatalf("members after the rebalance %v; want the victim alone (the slow member timed out)", ids)
		}
	})
}
