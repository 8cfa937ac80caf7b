package sandbox

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

// TestNoPrincipalHoldsMoreThanHalfTheWaitSlots: with MAX_CONCURRENT_WAITS=4,
// alice's gets that wait for readiness hold at most two slots at once, and
// a third is refused as an over-limit wait is (429, at once), while bob's
// waits are still admitted; bob cannot take more than two either, and once
// alice's waits end she may wait again.
func TestNoPrincipalHoldsMoreThanHalfTheWaitSlots(t *testing.T) {
	client := fake.NewClientset()
	m := NewManager(testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true", "MAX_CONCURRENT_WAITS": "4"}), client)
	bg, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	alice := api.WithCaller(bg, api.Caller{Principal: "alice"})
	bob := api.WithCaller(bg, api.Caller{Principal: "bob"})
	for _, c := range []struct {
		ctx context.Context
		id  string
	}{{alice, "a1"}, {bob, "b1"}} {
		if _, err := m.Create(c.ctx, ownerSpec(c.id), 0); err != nil {
			t.Fatalf("create %s: %v", c.id, err)
		}
	}

	// hold starts a get that waits for a Pod that never turns Ready, until
	// its context ends, and returns once it holds its slot (or was refused).
	var wg sync.WaitGroup
	hold := func(ctx context.Context, id string) (api.Kind, context.CancelFunc) {
		ctx, cancel := context.WithCancel(ctx)
		c, _ := api.CallerFrom(ctx)
		before := m.waits.Holding(c.Principal)
		errc := make(chan error, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := m.Get(ctx, id, 15*time.Second)
			errc <- err
		}()
		for {
			select {
			case err := <-errc:
				return api.KindOf(err), cancel
			case <-time.After(5 * time.Millisecond):
				if m.waits.Holding(c.Principal) > before {
					return -1, cancel // waiting, in its slot
				}
			}
		}
	}
	type step struct {
		Name string
		Kind api.Kind // -1: admitted and waiting
	}
	var got []step
	var cancels []context.CancelFunc
	run := func(name string, ctx context.Context, id string) context.CancelFunc {
		kind, cancel := hold(ctx, id)
		got = append(got, step{name, kind})
		cancels = append(cancels, cancel)
		return cancel
	}
	a1 := run("alice waits", alice, "a1")
	a2 := run("alice waits again", alice, "a1")
	run("alice's third wait", alice, "a1")
	run("bob waits", bob, "b1")
	run("bob waits again", bob, "b1")
	run("bob's third wait", bob, "b1")
	a1()
	a2()
	for m.waits.Holding("alice") > 0 {
		time.Sleep(5 * time.Millisecond)
	}
	run("alice waits once hers ended", alice, "a1")
	want := []step{
		{"alice waits", -1}, {"alice waits again", -1}, {"alice's third wait", api.KindQuota},
		{"bob waits", -1}, {"bob waits again", -1}, {"bob's third wait", api.KindQuota},
		{"alice waits once hers ended", -1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("waits (-want +got):\n%s", diff)
	}
	// The refusal says what it is, as the replica-wide one does.
	_, err := m.Get(bob, "b1", time.Second)
	if api.KindOf(err) != api.KindQuota || !strings.Contains(api.DetailOf(err), "MAX_CONCURRENT_WAITS") {
		t.Errorf("bob's wait over his half: %v, want a quota refusal naming MAX_CONCURRENT_WAITS", err)
	}
	for _, cancel := range cancels {
		cancel()
	}
	wg.Wait()
	if n := m.waits.Holding("alice") + m.waits.Holding("bob"); n != 0 {
		t.Errorf("%d wait slots still held after every wait ended", n)
	}
}
