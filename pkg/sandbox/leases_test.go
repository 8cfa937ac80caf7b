package sandbox

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/ownership"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// twoKeys is a configuration with the principals alice, bob and default:
// ownership is enforced.
var twoKeys = map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true",
	"PROVISIONER_API_KEY": "the-default-key-0123456789", "PROVISIONER_API_KEYS": "alice=alice-key-0123456789abcdef,bob=bob-key-0123456789abcdef"}

func with(env map[string]string, more ...string) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v
	}
	for i := 0; i+1 < len(more); i += 2 {
		out[more[i]] = more[i+1]
	}
	return out
}

func as(ctx context.Context, p string) context.Context {
	return api.WithCaller(ctx, api.Caller{Principal: p})
}

// leaseHolders maps each ownership Lease's id (its annotation) to its holder.
func leaseHolders(t *testing.T, client *fake.Clientset) map[string]string {
	t.Helper()
	l, err := client.CoordinationV1().Leases("deer-flow").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, x := range l.Items {
		id := x.Annotations[keys.AnnotationUserID] + x.Annotations[keys.AnnotationThreadID]
		holder := ""
		if x.Spec.HolderIdentity != nil {
			holder = *x.Spec.HolderIdentity
		}
		out[id] = holder
	}
	return out
}

// TestRefusedCreateWritesNoLease (issue 45, finding 3 and "a principal at
// its limit writes nothing"): bob, at his quota, sends creates that each
// name new ids, as in the measurement. Every one is refused 429,
// and none records an id: with the quota's Service cache running nothing
// at all is written (the cache shows him full before any write); without
// it (no watch yet) each create's slot is written, counted and removed,
// but no Lease. Alice may then use the ids bob named.
func TestRefusedCreateWritesNoLease(t *testing.T) {
	for _, tc := range []struct {
		name       string
		run        bool // start the quota's Service cache
		wantWrites []string
	}{
		{name: "the cache knows bob is full: nothing written", run: true, wantWrites: nil},
		{name: "no cache: the slot decides, no Lease", run: false,
			wantWrites: []string{"create services", "delete services", "create services", "delete services", "create services", "delete services"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			apiServerWrites(t, client)
			m := NewManager(testConfig(t, with(twoKeys, "MAX_SANDBOXES_PER_PRINCIPAL", "1")), client)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if tc.run {
				m.Run(ctx)
				if !m.quota.Synced(ctx, 5*time.Second) {
					t.Fatal("the quota's cache did not sync")
				}
			}
			first := ownerSpec("bob-own")
			first.UserID, first.ThreadID = "bob-user", "bob-thread"
			if _, err := m.Create(as(ctx, "bob"), first, 0); err != nil {
				t.Fatalf("bob's first create: %v", err)
			}
			if tc.run {
				waitHeld(t, ctx, m, first.ID)
			}
			before := len(client.Actions())
			for i := 1; i <= 3; i++ {
				s := ownerSpec(fmt.Sprintf("squat%d", i))
				s.UserID, s.ThreadID = fmt.Sprintf("alice%d", i), fmt.Sprintf("alice-thread%d", i)
				_, err := m.Create(as(ctx, "bob"), s, 0)
				if api.KindOf(err) != api.KindQuota {
					t.Fatalf("bob's create %d at his quota: %v, want KindQuota", i, err)
				}
			}
			var writes []string
			for _, a := range client.Actions()[before:] {
				if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
					writes = append(writes, v+" "+a.GetResource().Resource)
				}
			}
			if diff := cmp.Diff(tc.wantWrites, writes); diff != "" {
				t.Errorf("writes of the refused creates (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(map[string]string{"bob-user": "bob", "bob-thread": "bob"}, leaseHolders(t, client)); diff != "" {
				t.Errorf("Leases (-want +got):\n%s", diff)
			}
			s := ownerSpec("alice-own")
			s.UserID, s.ThreadID = "alice1", "alice-thread1"
			if _, err := m.Create(as(ctx, "alice"), s, 0); err != nil {
				t.Errorf("alice's create with the ids bob named: %v", err)
			}
		})
	}
}

// waitHeld waits until the quota's Service cache holds the sandbox id's Service.
func waitHeld(t *testing.T, ctx context.Context, m *Manager, id string) {
	t.Helper()
	for !m.quota.Holds(resources.ServiceName(id)) {
		if ctx.Err() != nil {
			t.Fatalf("the quota's cache never held %s", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOwnedIDsAreBounded (issue 45, finding 3): at MAX_OWNED_IDS_PER_PRINCIPAL
// a create that names a new id is refused 429 with a detail naming the
// setting, and writes nothing; creates with the ids the principal owns go
// on, and another principal is not held by alice's count.
func TestOwnedIDsAreBounded(t *testing.T) {
	client := fake.NewClientset()
	apiServerWrites(t, client)
	m := NewManager(testConfig(t, with(twoKeys, "MAX_OWNED_IDS_PER_PRINCIPAL", "2")), client)
	ctx := context.Background()
	spec := func(id, user, thread string) api.Spec {
		s := ownerSpec(id)
		s.UserID, s.ThreadID = user, thread
		return s
	}
	if _, err := m.Create(as(ctx, "alice"), spec("a1", "u1", "t1"), 0); err != nil {
		t.Fatal(err)
	}
	before := len(client.Actions())
	_, err := m.Create(as(ctx, "alice"), spec("a2", "u1", "t2"), 0)
	if api.KindOf(err) != api.KindQuota || !strings.Contains(api.DetailOf(err), "MAX_OWNED_IDS_PER_PRINCIPAL") {
		t.Errorf("a new thread at the bound: %v, want KindQuota naming MAX_OWNED_IDS_PER_PRINCIPAL", err)
	}
	for _, a := range client.Actions()[before:] {
		if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
			t.Errorf("the refused create wrote: %s %s", v, a.GetResource().Resource)
		}
	}
	for _, c := range []struct {
		who string
		s   api.Spec
	}{{"alice", spec("a3", "u1", "t1")}, {"bob", spec("b1", "ub", "tb")}} {
		if _, err := m.Create(as(ctx, c.who), c.s, 0); err != nil {
			t.Errorf("%s's create %s: %v", c.who, c.s.ID, err)
		}
	}
}

// TestReapFreesUnusedIDs (issue 45, finding 3): the reap frees the Lease
// of an id that no sandbox has used for ownership.Retention (its marker
// that old), keeps one a live sandbox uses (and clears its marker), and
// marks one it finds unused for the first time. Then another principal
// may claim the freed id.
func TestReapFreesUnusedIDs(t *testing.T) {
	client := fake.NewClientset()
	apiServerWrites(t, client)
	m := NewManager(testConfig(t, twoKeys), client)
	ctx := context.Background()
	live := ownerSpec("live1")
	live.UserID, live.ThreadID = "u-live", "t-live"
	if _, err := m.Create(as(ctx, "alice"), live, 0); err != nil {
		t.Fatal(err)
	}
	old := func(f ownership.Field, id, holder string) {
		name := ownership.LeaseName(f, id)
		suffix := name[len(ownership.LeasePrefix):]
		for _, l := range []*coordinationv1.Lease{
			{ObjectMeta: metav1.ObjectMeta{Name: ownership.UnusedPrefix + suffix, Namespace: "deer-flow",
				CreationTimestamp: metav1.NewTime(time.Now().Add(-ownership.Retention - time.Hour)),
				Labels:            map[string]string{keys.LabelManagedBy: keys.ManagedByValue}}},
		} {
			if _, err := client.CoordinationV1().Leases("deer-flow").Create(ctx, l, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if holder == "" {
			return
		}
		field, annotation := keys.OwnsUser, keys.AnnotationUserID
		if f == ownership.Thread {
			field, annotation = keys.OwnsThread, keys.AnnotationThreadID
		}
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "deer-flow",
			Labels:      map[string]string{keys.LabelManagedBy: keys.ManagedByValue, keys.LabelOwns: field, keys.LabelPrincipal: resources.PrincipalLabelValue(holder)},
			Annotations: map[string]string{annotation: id}}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
		if _, err := client.CoordinationV1().Leases("deer-flow").Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	old(ownership.User, "u-gone", "alice")   // unused for the retention: freed
	old(ownership.User, "u-live", "")        // alice's live sandbox uses it: its marker goes
	old(ownership.Thread, "t-gone", "alice") // freed
	if _, err := m.Reap(as(ctx, "alice")); err != nil {
		t.Fatalf("reap: %v", err)
	}
	want := map[string]string{"u-live": "alice", "t-live": "alice"}
	if diff := cmp.Diff(want, leaseHolders(t, client)); diff != "" {
		t.Errorf("Leases after the reap (-want +got):\n%s", diff)
	}
	for _, f := range []ownership.Field{ownership.User, ownership.Thread} {
		for _, id := range []string{"u-live", "t-live", "u-gone", "t-gone"} {
			name := ownership.UnusedPrefix + ownership.LeaseName(f, id)[len(ownership.LeasePrefix):]
			if _, err := client.CoordinationV1().Leases("deer-flow").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("marker of %s %s: %v, want none", f, id, err)
			}
		}
	}
	taken := ownerSpec("bob1")
	taken.UserID, taken.ThreadID = "u-gone", "t-gone"
	if _, err := m.Create(as(ctx, "bob"), taken, 0); err != nil {
		t.Errorf("bob's create of the freed ids: %v", err)
	}
}
