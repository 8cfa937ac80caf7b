package ownership

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// ownedLease is a Lease the function recorded for holder, as Claim makes it.
func ownedLease(f Field, id, holder string) *coordinationv1.Lease {
	l := (&Registry{namespace: ns}).lease(f, id, holder)
	l.UID = types.UID("uid-lease-" + id)
	return l
}

// unusedSince is the marker of ownedLease(f, id), made age ago.
func unusedSince(f Field, id string, age time.Duration) *coordinationv1.Lease {
	m := (&Registry{namespace: ns}).marker(strings.TrimPrefix(LeaseName(f, id), LeasePrefix))
	m.UID = types.UID("uid-marker-" + id)
	m.CreationTimestamp = metav1.NewTime(time.Now().Add(-age))
	return m
}

// TestCheckWritesNothing (issue 45, finding 3): the check a create makes
// before it writes anything refuses another principal's ids (403) and a
// new id past the principal's bound (429), and writes no Lease whatever it
// answers: only Claim, after the quota, records ids.
func TestCheckWritesNothing(t *testing.T) {
	aliceOwns := []runtime.Object{ownedLease(User, "ua", "alice"), ownedLease(Thread, "ta", "alice")}
	bobOwns := []runtime.Object{ownedLease(User, "ub", "bob"), ownedLease(Thread, "tb", "bob"), ownedLease(Thread, "tb2", "bob")}
	operators := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName(User, "uo"), Namespace: ns,
		Labels: map[string]string{keys.LabelManagedBy: keys.ManagedByValue, keys.LabelOwns: keys.OwnsUser}}, // no principal label
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr("alice")}}
	atBound := `alice owns 2 user and thread ids, the limit of MAX_OWNED_IDS_PER_PRINCIPAL; reuse an id of yours, or wait until ids no sandbox has used for 30 days are freed (or raise the limit)`
	cases := []struct {
		name              string
		maxIDs            int
		objs              []runtime.Object
		who, user, thread string
		want              result
	}{
		{name: "new ids, no bound", objs: aliceOwns, who: "alice", user: "u1", thread: "t1", want: ok()},
		{name: "new ids within the bound", maxIDs: 4, objs: aliceOwns, who: "alice", user: "u1", thread: "t1", want: ok()},
		{name: "one new id past the bound", maxIDs: 2, objs: aliceOwns, who: "alice", user: "ua", thread: "t1",
			want: result{Kind: api.KindQuota, Detail: atBound}},
		{name: "two new ids past the bound", maxIDs: 3, objs: aliceOwns, who: "alice", user: "u1", thread: "t1",
			want: result{Kind: api.KindQuota, Detail: atBound}},
		{name: "at the bound, ids of her own go on", maxIDs: 2, objs: aliceOwns, who: "alice", user: "ua", thread: "ta", want: ok()},
		{name: "another principal's Leases do not count", maxIDs: 2, objs: append(slices.Clone(aliceOwns[:1]), bobOwns...), who: "alice", user: "ua", thread: "t1", want: ok()},
		{name: "an operator's record does not count", maxIDs: 2, objs: []runtime.Object{aliceOwns[0], operators}, who: "alice", user: "ua", thread: "t1", want: ok()},
		{name: "another principal's user", maxIDs: 10, objs: bobOwns, who: "alice", user: "ub", thread: "t1",
			want: forbidden(`user_id "ub" belongs to another principal; a principal may use only its own user and thread ids, so choose another user_id`)},
		{name: "another principal's thread", objs: bobOwns, who: "alice", user: "u1", thread: "tb",
			want: forbidden(`thread_id "tb" belongs to another principal; a principal may use only its own user and thread ids, so choose another thread_id`)},
		{name: "an administrator past any bound", maxIDs: 1, objs: aliceOwns, who: "ops", user: "u9", thread: "t9", want: ok()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, client := registry(t, twoPrincipals, tc.objs...)
			r.maxIDs = tc.maxIDs
			err := r.Check(context.Background(), caller(tc.who), tc.user, tc.thread)
			got := ok()
			if err != nil {
				got = result{Kind: api.KindOf(err), Detail: api.DetailOf(err)}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
			for _, a := range client.Actions() {
				if a.GetResource().Resource == "leases" && a.GetVerb() != "get" && a.GetVerb() != "list" {
					t.Errorf("Check wrote: %s %s", a.GetVerb(), a.GetResource().Resource)
				}
			}
		})
	}
}

// TestReclaim (issue 45, finding 3): the reap frees the Lease of an id no
// sandbox has used for Retention, counted from the first reap that found
// it unused (its marker); a use in between starts the wait again. An
// operator's own record (no principal label) is kept, and a marker whose
// Lease is gone goes.
func TestReclaim(t *testing.T) {
	long := Retention + time.Hour
	cases := []struct {
		name       string
		objs       []runtime.Object
		usedUsers  []string
		wantFreed  int
		wantLeases []string
	}{
		{name: "used: kept, no marker", objs: []runtime.Object{ownedLease(User, "u1", "alice")}, usedUsers: []string{"u1"},
			wantLeases: []string{LeaseName(User, "u1")}},
		{name: "used again: the wait starts over", objs: []runtime.Object{ownedLease(User, "u1", "alice"), unusedSince(User, "u1", long)}, usedUsers: []string{"u1"},
			wantLeases: []string{LeaseName(User, "u1")}},
		{name: "first found unused: marked", objs: []runtime.Object{ownedLease(User, "u1", "alice")},
			wantLeases: []string{LeaseName(User, "u1"), UnusedPrefix + "u-" + strings.TrimPrefix(LeaseName(User, "u1"), LeasePrefix+"u-")}},
		{name: "unused, not for long enough", objs: []runtime.Object{ownedLease(User, "u1", "alice"), unusedSince(User, "u1", Retention-time.Hour)},
			wantLeases: []string{LeaseName(User, "u1"), unusedSince(User, "u1", 0).Name}},
		{name: "unused for the retention: freed", objs: []runtime.Object{ownedLease(User, "u1", "alice"), unusedSince(User, "u1", long),
			ownedLease(Thread, "t1", "bob")}, usedUsers: []string{"u2"}, wantFreed: 1,
			wantLeases: []string{LeaseName(Thread, "t1"), unusedSince(Thread, "t1", 0).Name}},
		{name: "a long id, used by its label's hash", objs: []runtime.Object{ownedLease(User, strings.Repeat("x", 70), "alice"), unusedSince(User, strings.Repeat("x", 70), long)},
			usedUsers: []string{strings.Repeat("x", 70)}, wantLeases: []string{LeaseName(User, strings.Repeat("x", 70))}},
		{name: "an operator's record is kept", objs: []runtime.Object{
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName(User, "u1"), Namespace: ns,
				Labels:      map[string]string{keys.LabelManagedBy: keys.ManagedByValue, keys.LabelOwns: keys.OwnsUser},
				Annotations: map[string]string{keys.AnnotationUserID: "u1"}}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr("default")}}},
			wantLeases: []string{LeaseName(User, "u1")}},
		{name: "a marker without its Lease goes", objs: []runtime.Object{unusedSince(User, "u1", time.Hour)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, client := registry(t, twoPrincipals, tc.objs...)
			snap, err := r.Snapshot(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			users := sets.New[string]()
			for _, u := range tc.usedUsers {
				users.Insert(resources.LabelValue(u))
			}
			freed, err := r.Reclaim(context.Background(), snap, func(f Field, v string) bool { return f == User && users.Has(v) })
			if err != nil {
				t.Fatal(err)
			}
			if freed != tc.wantFreed {
				t.Errorf("freed %d, want %d", freed, tc.wantFreed)
			}
			l, err := client.CoordinationV1().Leases(ns).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, x := range l.Items {
				names = append(names, x.Name)
			}
			slices.Sort(names)
			slices.Sort(tc.wantLeases)
			if diff := cmp.Diff(tc.wantLeases, names); diff != "" {
				t.Errorf("Leases left (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFreedIDIsTheNextClaimants: once the reap frees an id, another
// principal's create may claim it; ownership is off with one principal,
// and the reap then lists no Lease.
func TestFreedIDIsTheNextClaimants(t *testing.T) {
	r, _ := registry(t, twoPrincipals, ownedLease(User, "u1", "alice"), unusedSince(User, "u1", Retention+time.Hour))
	if got := check(r, caller("bob"), "u1", "tb"); got.Kind != api.KindForbidden {
		t.Fatalf("bob before the reap: %+v, want KindForbidden", got)
	}
	snap, err := r.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reclaim(context.Background(), snap, func(Field, string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if got := check(r, caller("bob"), "u1", "tb"); got != ok() {
		t.Errorf("bob after the reap freed u1: %+v, want ok", got)
	}

	single, client := registry(t, map[string]string{"K8S_NAMESPACE": ns, "PROVISIONER_API_KEY": oneKey, "PROVISIONER_API_KEYS": "", "PROVISIONER_ADMINS": ""})
	if snap, err := single.Snapshot(context.Background()); snap != nil || err != nil || len(client.Actions()) != 0 {
		t.Errorf("one principal: Snapshot %v, %v after %v; want nil and no API call", snap, err, client.Actions())
	}
}
