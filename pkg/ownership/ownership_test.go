package ownership

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

const (
	ns       = "deer-flow"
	aliceKey = "alice-key-0123456789abcdef"
	bobKey   = "bob-key-0123456789abcdef"
	opsKey   = "ops-key-0123456789abcdef"
	oneKey   = "the-default-key-0123456789"
)

// twoPrincipals is a configuration with alice, bob and default (and an
// administrator, ops): ownership is enforced.
var twoPrincipals = map[string]string{
	"K8S_NAMESPACE":        ns,
	"PROVISIONER_API_KEY":  oneKey,
	"PROVISIONER_API_KEYS": "alice=" + aliceKey + ",bob=" + bobKey + ",ops=" + opsKey,
	"PROVISIONER_ADMINS":   "ops",
}

func registry(t *testing.T, env map[string]string, objs ...runtime.Object) (*Registry, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset(objs...)
	cfg := configtest.Load(t, env)
	return New(cfg.Namespace, &cfg.AuthConfig, 0, client), client
}

func caller(p string) api.Caller { return api.Caller{Principal: p, Admin: p == "ops"} }

// result is a Check's answer as the tests compare it: the error's kind
// (-1: none) and its detail.
type result struct {
	Kind   api.Kind
	Detail string
}

// check is a create's claim (Claim), the call that decides.
func check(r *Registry, c api.Caller, user, thread string) result {
	err := r.Claim(context.Background(), c, user, thread)
	if err == nil {
		return result{Kind: -1}
	}
	return result{Kind: api.KindOf(err), Detail: api.DetailOf(err)}
}

func ok() result { return result{Kind: -1} }

func forbidden(detail string) result { return result{Kind: api.KindForbidden, Detail: detail} }

// TestCheck runs creates' checks in order, each against the ownership the
// earlier ones recorded.
func TestCheck(t *testing.T) {
	type step struct {
		who, user, thread string
		want              result
	}
	otherUser := `user_id "u1" belongs to another principal; a principal may use only its own user and thread ids, so choose another user_id`
	otherThread := `thread_id "t1" belongs to another principal; a principal may use only its own user and thread ids, so choose another thread_id`
	sendUser := `user_id "default", what a create without user_id gets, belongs to the principal "default" (PROVISIONER_API_KEY); send a user_id of your own`
	cases := []struct {
		name  string
		steps []step
	}{
		{"first use claims, the owner uses again", []step{
			{"alice", "u1", "t1", ok()},
			{"alice", "u1", "t1", ok()},
			{"alice", "u1", "t2", ok()},
		}},
		{"another principal's user is refused, naming user_id", []step{
			{"alice", "u1", "t1", ok()},
			{"bob", "u1", "tb", forbidden(otherUser)},
		}},
		{"another principal's thread is refused, naming thread_id", []step{
			{"alice", "u1", "t1", ok()},
			{"bob", "ub", "t1", forbidden(otherThread)},
		}},
		{"a refused user claims no thread", []step{
			{"alice", "u1", "t1", ok()},
			{"bob", "u1", "t9", forbidden(otherUser)},
			{"alice", "u2", "t9", ok()},
		}},
		{"the user default is principal default's, without a Lease", []step{
			{"default", "default", "t1", ok()},
			{"alice", "default", "ta", forbidden(sendUser)},
		}},
		{"an administrator uses any id and claims none", []step{
			{"alice", "u1", "t1", ok()},
			{"ops", "u1", "t1", ok()},
			{"ops", "default", "t2", ok()},
			{"ops", "u3", "t3", ok()},
			{"bob", "u3", "t3", ok()},
		}},
		{"ids are case-sensitive, each its own Lease", []step{
			{"alice", "u1", "t1", ok()},
			{"bob", "U1", "T1", ok()},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := registry(t, twoPrincipals)
			var got, want []result
			for _, s := range tc.steps {
				got = append(got, check(r, caller(s.who), s.user, s.thread))
				want = append(want, s.want)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("answers (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCheckSurvivesTheCache: a replica that never saw an id (a cold one,
// or another) finds its owner in the Lease, not in its memory.
func TestCheckSurvivesTheCache(t *testing.T) {
	r1, client := registry(t, twoPrincipals)
	if got := check(r1, caller("alice"), "u1", "t1"); got != ok() {
		t.Fatalf("alice's first use: %+v", got)
	}
	cfg2 := configtest.Load(t, twoPrincipals)
	r2 := New(cfg2.Namespace, &cfg2.AuthConfig, 0, client)
	if got := check(r2, caller("bob"), "u1", "tb"); got.Kind != api.KindForbidden {
		t.Errorf("bob on another replica: %+v, want KindForbidden", got)
	}
	lease, err := client.CoordinationV1().Leases(ns).Get(context.Background(), LeaseName(User, "u1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LeaseName(User, "u1"), Namespace: ns,
			Labels: map[string]string{keys.LabelManagedBy: keys.ManagedByValue, keys.LabelOwns: keys.OwnsUser,
				keys.LabelPrincipal: resources.PrincipalLabelValue("alice")},
			Annotations: map[string]string{keys.AnnotationUserID: "u1"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr("alice")},
	}
	lease.TypeMeta, lease.ManagedFields = metav1.TypeMeta{}, nil // the fake's own additions
	if diff := cmp.Diff(want, lease); diff != "" {
		t.Errorf("the Lease (-want +got):\n%s", diff)
	}
}

func ptr(s string) *string { return &s }

// TestSinglePrincipalRecordsNothing: with DeerFlow's single key every id
// is that principal's; no Lease is read or written, so a create costs the
// API server exactly what it did.
func TestSinglePrincipalRecordsNothing(t *testing.T) {
	r, client := registry(t, map[string]string{"K8S_NAMESPACE": ns, "PROVISIONER_API_KEY": oneKey})
	for _, u := range []string{"default", "u1"} {
		if got := check(r, caller("default"), u, "t1"); got != ok() {
			t.Errorf("user %s: %+v", u, got)
		}
	}
	if a := client.Actions(); len(a) != 0 {
		t.Errorf("API calls with a single principal: %v, want none", a)
	}
}

// TestRaceHasOneWinner: principals racing for one fresh id, each on its
// own replica (no shared cache): exactly one is let through, and every
// other is refused naming the field. Run with -race.
func TestRaceHasOneWinner(t *testing.T) {
	const racers = 8
	var keyList []string
	for i := range racers {
		keyList = append(keyList, fmt.Sprintf("p%d=key-of-p%d-0123456789abcdef", i, i))
	}
	cfg := configtest.Load(t, map[string]string{"K8S_NAMESPACE": ns, "PROVISIONER_API_KEYS": strings.Join(keyList, ",")})
	for round := range 20 {
		client := fake.NewClientset()
		var wg sync.WaitGroup
		results := make([]error, racers)
		for i := range racers {
			wg.Go(func() {
				p := fmt.Sprintf("p%d", i)
				results[i] = New(cfg.Namespace, &cfg.AuthConfig, 0, client).Claim(context.Background(), caller(p), "race-user", fmt.Sprintf("thread-%d-%s", round, p))
			})
		}
		wg.Wait()
		won := 0
		for _, err := range results {
			switch {
			case err == nil:
				won++
			case api.KindOf(err) != api.KindForbidden || !strings.Contains(api.DetailOf(err), "user_id"):
				t.Errorf("round %d: a loser got %v, want KindForbidden naming user_id", round, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d winners, want exactly 1", round, won)
		}
	}
}

// TestLostCreateReadsTheWinner: a create that read "absent" and then lost
// the Create to another principal's (AlreadyExists) reads the winner's
// Lease and is refused; it never takes the id.
func TestLostCreateReadsTheWinner(t *testing.T) {
	won := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName(User, "u1"), Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr("bob")}}
	r, client := registry(t, twoPrincipals, won)
	// alice's first read comes before bob's Create (answered absent).
	var first atomic.Bool
	client.PrependReactor("get", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() == won.Name && !first.Swap(true) {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, won.Name)
		}
		return false, nil, nil
	})
	if got := check(r, caller("alice"), "u1", "t1"); got.Kind != api.KindForbidden || !strings.Contains(got.Detail, "user_id") {
		t.Errorf("alice after losing the Create: %+v, want KindForbidden naming user_id", got)
	}
	var verbs []string
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "leases" {
			verbs = append(verbs, a.GetVerb())
		}
	}
	if diff := cmp.Diff([]string{"get", "create", "get"}, verbs); diff != "" {
		t.Errorf("Lease calls (-want +got):\n%s", diff)
	}
	l, err := client.CoordinationV1().Leases(ns).Get(context.Background(), won.Name, metav1.GetOptions{})
	if err != nil || *l.Spec.HolderIdentity != "bob" {
		t.Errorf("the Lease after the race: %v, %v; want bob's", l, err)
	}
}

// TestLiveSandboxesKeepTheirOwner: at the upgrade, an id that live
// sandboxes already use belongs to the principal of the oldest of them
// (default when it records none), not to whoever names it first.
func TestLiveSandboxesKeepTheirOwner(t *testing.T) {
	svc := func(name, user, thread, principal string, age time.Duration) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			CreationTimestamp: metav1.NewTime(time.Now().Add(-age)),
			Labels:            map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelUser: user, keys.LabelThread: thread}}}
		if principal != "" {
			s.Annotations = map[string]string{keys.AnnotationPrincipal: principal}
		}
		return s
	}
	cases := []struct {
		name                string
		svcs                []runtime.Object
		who, user, thread   string
		want                result
		wantUser, wantThrea string
	}{
		{name: "a legacy sandbox's user is default's", svcs: []runtime.Object{svc("s1", "u1", "t1", "", time.Hour)},
			who: "alice", user: "u1", thread: "ta",
			want:     forbidden(`user_id "u1" belongs to another principal; a principal may use only its own user and thread ids, so choose another user_id`),
			wantUser: "default"},
		{name: "the oldest sandbox's principal wins", svcs: []runtime.Object{svc("s1", "u1", "t1", "bob", time.Minute), svc("s2", "u1", "t2", "alice", time.Hour)},
			who: "alice", user: "u1", thread: "t2", want: ok(), wantUser: "alice", wantThrea: "alice"},
		{name: "a thread in bob's live sandbox is bob's", svcs: []runtime.Object{svc("s1", "ub", "t1", "bob", time.Hour)},
			who: "alice", user: "ua", thread: "t1",
			want:     forbidden(`thread_id "t1" belongs to another principal; a principal may use only its own user and thread ids, so choose another thread_id`),
			wantUser: "alice", wantThrea: "bob"},
		{name: "an id no sandbox uses is the claimant's", svcs: []runtime.Object{svc("s1", "ub", "tb", "bob", time.Hour)},
			who: "alice", user: "ua", thread: "ta", want: ok(), wantUser: "alice", wantThrea: "alice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, client := registry(t, twoPrincipals, tc.svcs...)
			if diff := cmp.Diff(tc.want, check(r, caller(tc.who), tc.user, tc.thread)); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
			holder := func(f Field, id string) string {
				l, err := client.CoordinationV1().Leases(ns).Get(context.Background(), LeaseName(f, id), metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return ""
				}
				if err != nil {
					t.Fatal(err)
				}
				return *l.Spec.HolderIdentity
			}
			got := []string{holder(User, tc.user), holder(Thread, tc.thread)}
			if diff := cmp.Diff([]string{tc.wantUser, tc.wantThrea}, got); diff != "" {
				t.Errorf("recorded owners of the user and the thread (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCheckFailsClosed: when the owner cannot be read or recorded, the
// create is refused with the API server's kind (never let through), and
// nothing is cached, so the next create asks again.
func TestCheckFailsClosed(t *testing.T) {
	cases := []struct {
		name     string
		verb     string
		err      error
		wantKind api.Kind
	}{
		{"get unavailable", "get", apierrors.NewServiceUnavailable("down"), api.KindUnavailable},
		{"create unavailable", "create", apierrors.NewServiceUnavailable("down"), api.KindUnavailable},
		{"no RBAC for Leases", "create", apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "x", errors.New("rbac")), api.KindInternal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, client := registry(t, twoPrincipals)
			failing := true
			client.PrependReactor(tc.verb, "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
				if failing {
					return true, nil, tc.err
				}
				return false, nil, nil
			})
			got := check(r, caller("alice"), "u1", "t1")
			if got.Kind != tc.wantKind || !strings.Contains(got.Detail, "owner of a user_id") {
				t.Errorf("got %+v, want kind %v naming what it tried", got, tc.wantKind)
			}
			failing = false
			if got := check(r, caller("alice"), "u1", "t1"); got != ok() {
				t.Errorf("once the API server answers: %+v", got)
			}
		})
	}
}

// TestHolderlessLeaseRefuses: a Lease an operator wrote without a holder
// names no owner: every principal is refused until it does.
func TestHolderlessLeaseRefuses(t *testing.T) {
	bare := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName(User, "u1"), Namespace: ns}}
	r, _ := registry(t, twoPrincipals, bare)
	got := check(r, caller("alice"), "u1", "t1")
	if got.Kind != api.KindInternal || !strings.Contains(got.Detail, "holderIdentity") {
		t.Errorf("got %+v, want KindInternal naming holderIdentity", got)
	}
}

func TestLeaseName(t *testing.T) {
	got := []string{LeaseName(User, "u1"), LeaseName(Thread, "u1"), LeaseName(User, strings.Repeat("_", 64))}
	// Written out (printf %s u1 | sha256sum | cut -c1-40), so that the
	// docs' shell recipe and any operator's tooling stay right.
	want := []string{
		"sandbox-owner-u-bb82030dbc2bcaba32a90bf2e207a84a856fc5f0",
		"sandbox-owner-t-bb82030dbc2bcaba32a90bf2e207a84a856fc5f0",
		"sandbox-owner-u-89ec7e9081cd930b3d5ebc6befd97e8a3e50ef8e",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	for _, n := range got {
		if len(n) > 63 {
			t.Errorf("%s is longer than a DNS label", n)
		}
	}
}
