package sandbox

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/token"
)

// The tests here use client-go's fake clientset as a stand-in for the API
// server, with apiServerWrites for what the fake lacks (resourceVersions,
// delete preconditions). They are issue 29's attacks and faults, each
// against the object graph it leaves.

var tokenPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// objectsLeft names every Pod and Service in the namespace.
func objectsLeft(t *testing.T, client *fake.Clientset) []string {
	t.Helper()
	var out []string
	pods, err := client.CoreV1().Pods("deer-flow").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		out = append(out, "Pod "+p.Name)
	}
	svcs, err := client.CoreV1().Services("deer-flow").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		out = append(out, "Service "+s.Name)
	}
	return out
}

// halfMade writes alice's Pod of id with no Service, as a create that
// failed after its Pod left it, made age ago; edit, when set, changes it
// first (a claimed Pod's name and mark).
func halfMade(t *testing.T, client *fake.Clientset, cfg *config.Config, id string, age time.Duration, edit func(*corev1.Pod)) {
	t.Helper()
	s := ownerSpec(id)
	s.Caller, s.Token = api.Caller{Principal: "alice"}, token.New()
	s.Now = time.Now().Add(-age) // its created-at: when its create ran
	pod := resources.BuildPodFor(cfg.Objects(), s)
	pod.CreationTimestamp = metav1.NewTime(time.Now().Add(-age))
	if edit != nil {
		edit(pod)
	}
	if _, err := client.CoreV1().Pods("deer-flow").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestServiceSelectsItsWorkloadsToken: a new sandbox's Pod carries a random
// token and its Service selects the id and that token; creating it again
// keeps both. A sandbox from before tokens (an id-only selector) gets one on
// its next create, and its Service keeps its node port.
func TestServiceSelectsItsWorkloadsToken(t *testing.T) {
	client := fake.NewClientset()
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	m := NewManager(cfg, client)
	ctx := api.WithCaller(context.Background(), api.Caller{Principal: "alice"})
	s := ownerSpec("tok1")
	for round := 0; round < 2; round++ {
		if _, err := m.Create(ctx, s, 0); err != nil {
			t.Fatal(err)
		}
		pod, err := client.CoreV1().Pods("deer-flow").Get(ctx, resources.PodName(s.ID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc, err := client.CoreV1().Services("deer-flow").Get(ctx, resources.ServiceName(s.ID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		token := pod.Labels[keys.LabelToken]
		if !tokenPattern.MatchString(token) {
			t.Fatalf("round %d: the Pod's token %q is not 32 hex digits", round, token)
		}
		if diff := cmp.Diff(map[string]string{keys.LabelID: s.ID, keys.LabelToken: token, keys.LabelPod: resources.PodName(s.ID)}, svc.Spec.Selector); diff != "" {
			t.Errorf("round %d: the Service's selector (-want +got):\n%s", round, diff)
		}
	}

	// From before tokens: the Pod has none, the Service selects the id.
	old := ownerSpec("old1")
	old.Caller = api.Caller{Principal: "alice"}
	pod, err := client.CoreV1().Pods("deer-flow").Create(ctx, resources.BuildPodFor(cfg.Objects(), old), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.UID = "old-pod"
	if pod, err = client.CoreV1().Pods("deer-flow").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := resources.BuildService(cfg.Objects(), old, resources.PodOwnerRef(pod))
	svc.Spec.Ports[0].NodePort = 31234
	if _, err := client.CoreV1().Services("deer-flow").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := svc.Spec.Selector; len(got) != 1 {
		t.Fatalf("the stand-in for an old Service selects %v, want the id alone", got)
	}
	if _, err := m.Create(ctx, old, 0); err != nil {
		t.Fatal(err)
	}
	pod, err = client.CoreV1().Pods("deer-flow").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err = client.CoreV1().Services("deer-flow").Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := pod.Labels[keys.LabelToken]
	if !tokenPattern.MatchString(token) {
		t.Fatalf("the old Pod's token after its next create: %q", token)
	}
	if diff := cmp.Diff(resources.ServiceSelector(old.ID, token), svc.Spec.Selector); diff != "" {
		t.Errorf("the old Service's selector after its next create (-want +got):\n%s", diff)
	}
	if svc.Spec.Ports[0].NodePort != 31234 {
		t.Errorf("the old Service's node port changed to %d", svc.Spec.Ports[0].NodePort)
	}
}

// TestStrayPodNeverTakesAClaimedSandbox is issue 29's third attack: alice
// holds a sandbox claimed from a pool; bob's create of the same id, given
// up by its client, left a bare Pod sandbox-<id>. Alice still gets her
// sandbox; bob gets 404, never her URL, and his destroy removes his stray
// Pod and nothing of hers.
func TestStrayPodNeverTakesAClaimedSandbox(t *testing.T) {
	client := fake.NewClientset()
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	m := NewManager(cfg, client)
	bg := context.Background()
	alice := api.WithCaller(bg, api.Caller{Principal: "alice"})
	bob := api.WithCaller(bg, api.Caller{Principal: "bob"})

	hers := ownerSpec("px")
	hers.Caller, hers.Token = api.Caller{Principal: "alice"}, token.New()
	claimed := resources.BuildPodFor(cfg.Objects(), hers)
	claimed.Name, claimed.UID, claimed.CreationTimestamp = "sandbox-pool-python-x7k2q", "claimed", metav1.Now()
	claimed.Labels[keys.LabelPooled] = "true"
	if _, err := client.CoreV1().Pods("deer-flow").Create(bg, claimed, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := resources.BuildService(cfg.Objects(), hers, resources.PodOwnerRef(claimed))
	svc.Spec.Ports[0].NodePort = 31001 // as the API server allocates it
	if _, err := client.CoreV1().Services("deer-flow").Create(bg, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	his := ownerSpec("px")
	his.Caller, his.Token = api.Caller{Principal: "bob"}, token.New()
	stray := resources.BuildPodFor(cfg.Objects(), his)
	stray.UID, stray.CreationTimestamp = "stray", metav1.Now()
	if _, err := client.CoreV1().Pods("deer-flow").Create(bg, stray, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	sb, err := m.Get(alice, "px", 0)
	if err != nil {
		t.Fatalf("alice's get of her claimed sandbox beside bob's stray Pod: %v", err)
	}
	if sb.URL == "" {
		t.Errorf("alice's sandbox has no URL: %+v", sb)
	}
	if got, err := m.Get(bob, "px", 0); api.KindOf(err) != api.KindNotFound {
		t.Errorf("bob's get of alice's sandbox: %+v, %v; want not found", got, err)
	}
	if err := m.Destroy(bob, "px"); err != nil {
		t.Fatalf("bob's destroy: %v", err)
	}
	want := []string{"Pod " + claimed.Name, "Service " + resources.ServiceName("px")}
	if diff := cmp.Diff(want, objectsLeft(t, client)); diff != "" {
		t.Errorf("after bob's destroy (-want +got):\n%s", diff)
	}
	if _, err := m.Get(alice, "px", 0); err != nil {
		t.Errorf("alice's get after bob's destroy: %v", err)
	}
}

// TestCreateWithoutItsAnswerLeavesNothing: a create whose client goes away
// after its last write, or whose Pod create fails without saying whether it
// was written (a 5xx after the write), leaves no object, also when the cut
// write lands only after the first read back (it is read again once it
// must have landed); one refused by the API server (a 4xx) wrote nothing
// to undo, and a Pod of the name that is not this create's (another token)
// stays.
func TestCreateWithoutItsAnswerLeavesNothing(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	pods := corev1.SchemeGroupVersion.WithResource("pods")
	s := ownerSpec("gone1")
	s.Caller = api.Caller{Principal: "alice"}
	tests := []struct {
		name string
		// react stands in for the API server's answer to the Pod's or the
		// Service's create (nil: the create goes through).
		pod, svc func(e faultEnv, a k8stesting.Action) (bool, runtime.Object, error)
		// landsLate: the Pod's cut create reaches the store only once the
		// first read of the Pod has answered (not found).
		landsLate bool
		want      []string
		wantKind  api.Kind
	}{
		{name: "the client goes away after the Service is written", svc: func(e faultEnv, a k8stesting.Action) (bool, runtime.Object, error) {
			e.cancel()
			return false, nil, nil
		}, wantKind: api.KindUnavailable},
		{name: "the Pod is written and the API server answers 500", pod: func(e faultEnv, a k8stesting.Action) (bool, runtime.Object, error) {
			if err := e.client.Tracker().Create(pods, a.(k8stesting.CreateAction).GetObject(), "deer-flow"); err != nil {
				return true, nil, err
			}
			return true, nil, apierrors.NewInternalError(errInjected)
		}, wantKind: api.KindUnavailable},
		{name: "the Pod is written and the client times out", pod: func(e faultEnv, a k8stesting.Action) (bool, runtime.Object, error) {
			if err := e.client.Tracker().Create(pods, a.(k8stesting.CreateAction).GetObject(), "deer-flow"); err != nil {
				return true, nil, err
			}
			return true, nil, context.DeadlineExceeded
		}, wantKind: api.KindTimeout},
		{name: "the client times out and the Pod lands after the first read", pod: func(faultEnv, k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, context.DeadlineExceeded
		}, landsLate: true, wantKind: api.KindTimeout},
		{name: "another's Pod of the name appears and the API server answers 500", pod: func(e faultEnv, a k8stesting.Action) (bool, runtime.Object, error) {
			other := a.(k8stesting.CreateAction).GetObject().DeepCopyObject().(*corev1.Pod)
			other.Labels[keys.LabelToken] = token.New()
			if err := e.client.Tracker().Create(pods, other, "deer-flow"); err != nil {
				return true, nil, err
			}
			return true, nil, apierrors.NewInternalError(errInjected)
		}, want: []string{"Pod " + resources.PodName(s.ID)}, wantKind: api.KindUnavailable},
		{name: "the API server refuses the Pod", pod: func(e faultEnv, a k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(pods.GroupResource(), resources.PodName(s.ID), errInjected)
		}, wantKind: api.KindInternal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			ctx, cancel := context.WithTimeout(api.WithCaller(context.Background(), s.Caller), 10*time.Second)
			defer cancel()
			e := faultEnv{bump: apiServerWrites(t, client), client: client, cancel: cancel}
			if tc.pod != nil {
				client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) { return tc.pod(e, a) })
			}
			if tc.svc != nil {
				client.PrependReactor("create", "services", func(a k8stesting.Action) (bool, runtime.Object, error) { return tc.svc(e, a) })
			}
			landed := func() bool { return true }
			if tc.landsLate {
				landed = landsAfterFirstRead(t, client, "pods")
			}
			m := NewManager(cfg, client)
			m.rm.Lands = 10 * time.Millisecond
			_, err := m.Create(ctx, s, 0)
			if !landed() {
				t.Error("the cut Pod never landed: the row tests nothing")
			}
			if err == nil {
				t.Fatal("the create answered 200")
			}
			if got := api.KindOf(err); got != tc.wantKind {
				t.Errorf("error kind %v, want %v: %v", got, tc.wantKind, err)
			}
			if diff := cmp.Diff(tc.want, objectsLeft(t, client)); diff != "" {
				t.Errorf("objects left (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLeftoversGoOnTheNextCreateDestroyOrReap: a Pod that a failed create
// left (named by no Service, older than any undo) is no sandbox: get
// answers 404 even to its own principal, and the next create of its id
// (by anyone), a destroy (by anyone) or a reap removes it.
func TestLeftoversGoOnTheNextCreateDestroyOrReap(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	bg := context.Background()
	alice := api.WithCaller(bg, api.Caller{Principal: "alice"})
	bob := api.WithCaller(bg, api.Caller{Principal: "bob"})
	tests := []struct {
		name string
		act  func(m *Manager) error
		want []string
	}{
		{name: "another principal creates the id", act: func(m *Manager) error {
			s := ownerSpec("left1")
			s.UserID = "bobs-user"
			_, err := m.Create(bob, s, 0)
			return err
		}, want: []string{"Pod " + resources.PodName("left1"), "Service " + resources.ServiceName("left1")}},
		{name: "another principal destroys the id", act: func(m *Manager) error { return m.Destroy(bob, "left1") }},
		{name: "its principal destroys the id", act: func(m *Manager) error { return m.Destroy(alice, "left1") }},
		{name: "a reap", act: func(m *Manager) error {
			r, err := m.Reap(bob)
			if err == nil && r.Count != 0 {
				t.Errorf("bob's reap answered alice's leftover: %+v", r)
			}
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			apiServerWrites(t, client)
			m := NewManager(cfg, client)
			halfMade(t, client, cfg, "left1", 10*time.Minute, nil)
			if _, err := m.Get(alice, "left1", 0); api.KindOf(err) != api.KindNotFound {
				t.Errorf("alice's get of her leftover: %v; want not found", err)
			}
			if err := tc.act(m); err != nil {
				t.Fatal(err)
			}
			left := objectsLeft(t, client)
			if diff := cmp.Diff(tc.want, left); diff != "" {
				t.Errorf("objects left (-want +got):\n%s", diff)
			}
			if len(left) > 0 {
				p, err := client.CoreV1().Pods("deer-flow").Get(bg, resources.PodName("left1"), metav1.GetOptions{})
				if err != nil || p.Annotations[keys.AnnotationPrincipal] != "bob" {
					t.Errorf("the Pod left is not bob's new sandbox: %v %v", p.Annotations, err)
				}
			}
		})
	}
}

// TestRepairCounts: a create that finds its own half-made sandbox (a Pod
// without a Service) and makes it whole counts for the quota as a new
// sandbox does; over the limit, it is refused and the half-made Pod goes.
func TestRepairCounts(t *testing.T) {
	client := fake.NewClientset()
	apiServerWrites(t, client)
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true", "MAX_SANDBOXES": "1"})
	m := NewManager(cfg, client)
	bg := context.Background()
	alice := api.WithCaller(bg, api.Caller{Principal: "alice"})
	if _, err := m.Create(alice, ownerSpec("whole1"), 0); err != nil {
		t.Fatal(err)
	}
	halfMade(t, client, cfg, "half1", 0, nil)
	if _, err := m.Create(alice, ownerSpec("half1"), 0); api.KindOf(err) != api.KindQuota {
		t.Fatalf("the repair over the limit: %v; want a quota refusal", err)
	}
	want := []string{"Pod " + resources.PodName("whole1"), "Service " + resources.ServiceName("whole1")}
	if diff := cmp.Diff(want, objectsLeft(t, client)); diff != "" {
		t.Errorf("objects left (-want +got):\n%s", diff)
	}
}

// TestClaimedPodWithoutItsServiceIsFound: a Pod claimed from a pool keeps
// its pool's name, so with its Service gone (a destroy that failed between
// its two deletes, or raced the claim) only its labels find it: get
// answers 404, and its principal's destroy, or a reap, removes it.
func TestClaimedPodWithoutItsServiceIsFound(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	bg := context.Background()
	alice := api.WithCaller(bg, api.Caller{Principal: "alice"})
	for _, tc := range []struct {
		name string
		act  func(m *Manager) error
	}{
		{"its principal destroys the id", func(m *Manager) error { return m.Destroy(alice, "lost1") }},
		{"a reap", func(m *Manager) error { _, err := m.Reap(alice); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			apiServerWrites(t, client)
			m := NewManager(cfg, client)
			halfMade(t, client, cfg, "lost1", 10*time.Minute, func(p *corev1.Pod) {
				p.Name, p.Labels[keys.LabelPooled] = "sandbox-pool-python-q8v4z", "true" // claimed from a pool
			})
			if _, err := m.Get(alice, "lost1", 0); api.KindOf(err) != api.KindNotFound {
				t.Errorf("get of a claimed Pod without its Service: %v; want not found", err)
			}
			if err := tc.act(m); err != nil {
				t.Fatal(err)
			}
			if left := objectsLeft(t, client); len(left) != 0 {
				t.Errorf("left: %v", left)
			}
		})
	}
}

// TestLegacySandboxIsNoLeftover: a sandbox DeerFlow's provisioner made (a
// Pod and a Service that names no owner, no principal) is whole, however
// old: another principal's create of its id is refused and removes
// nothing.
func TestLegacySandboxIsNoLeftover(t *testing.T) {
	client := fake.NewClientset()
	apiServerWrites(t, client)
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	m := NewManager(cfg, client)
	bg := context.Background()
	s := ownerSpec("legacy1")
	pod := resources.BuildPod(cfg.Objects(), s)
	pod.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Hour))
	if _, err := client.CoreV1().Pods("deer-flow").Create(bg, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := resources.BuildService(cfg.Objects(), s, metav1.OwnerReference{})
	svc.OwnerReferences = nil
	if _, err := client.CoreV1().Services("deer-flow").Create(bg, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := ownerSpec("legacy1")
	other.UserID = "bobs-user"
	if _, err := m.Create(api.WithCaller(bg, api.Caller{Principal: "bob"}), other, 0); api.KindOf(err) != api.KindConflict {
		t.Errorf("bob's create of a legacy sandbox's id: %v; want a conflict", err)
	}
	want := []string{"Pod " + resources.PodName("legacy1"), "Service " + resources.ServiceName("legacy1")}
	if diff := cmp.Diff(want, objectsLeft(t, client)); diff != "" {
		t.Errorf("objects left (-want +got):\n%s", diff)
	}
}

// TestLeftoverSlotGoesWithWhatItsCreateWrote: a slot left by a create that
// failed and could not undo (its workload may have been written: it was
// kept so the quota counts it) is, once older than any create could be,
// removed by the next create of its id that cannot use it (another kind,
// another user or principal), and with it the workload that create wrote
// (the one of the slot's kind carrying its token). The new sandbox's
// Service says the kind it is bound to. (The soak found a Pod bound to a
// ReplicaSet's leftover slot, still labelled for a ReplicaSet, and that
// ReplicaSet left running uncounted.)
func TestLeftoverSlotGoesWithWhatItsCreateWrote(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	bg := context.Background()
	id := "slotleft1"
	leftover := func(t *testing.T, client *fake.Clientset, kind string, written bool) {
		t.Helper()
		s := ownerSpec(id)
		s.Caller, s.Token = api.Caller{Principal: "alice"}, token.New()
		slot := resources.Slot(cfg.Objects(), s, kind)
		slot.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Hour))
		if _, err := client.CoreV1().Services("deer-flow").Create(bg, slot, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if !written {
			return
		}
		var err error
		if kind == "ReplicaSet" {
			_, err = client.AppsV1().ReplicaSets("deer-flow").Create(bg, resources.BuildReplicaSet(cfg.Objects(), s), metav1.CreateOptions{})
		} else {
			_, err = client.CoreV1().Pods("deer-flow").Create(bg, resources.BuildPodFor(cfg.Objects(), s), metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	type outcome struct {
		ReplicaSets   int
		PodPrincipal  string
		Chain         string // which of the Service and the Pod owns the other (chain)
		ServiceLabel  string // its workload label
		SelectsThePod bool
	}
	tests := []struct {
		name    string
		kind    string
		written bool
		caller  string
		user    string
	}{
		{name: "a ReplicaSet's slot with its ReplicaSet; alice creates a Pod sandbox", kind: "ReplicaSet", written: true, caller: "alice"},
		{name: "a ReplicaSet's slot, nothing written; alice creates a Pod sandbox", kind: "ReplicaSet", caller: "alice"},
		{name: "alice's Pod slot with its Pod; bob creates the id", kind: "Pod", written: true, caller: "bob", user: "bobs-user"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			apiServerWrites(t, client)
			m := NewManager(cfg, client)
			leftover(t, client, tc.kind, tc.written)
			s := ownerSpec(id)
			if tc.user != "" {
				s.UserID = tc.user
			}
			if _, err := m.Create(api.WithCaller(bg, api.Caller{Principal: tc.caller}), s, 0); err != nil {
				t.Fatal(err)
			}
			rss, err := client.AppsV1().ReplicaSets("deer-flow").List(bg, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pod, perr := client.CoreV1().Pods("deer-flow").Get(bg, resources.PodName(id), metav1.GetOptions{})
			svc, serr := client.CoreV1().Services("deer-flow").Get(bg, resources.ServiceName(id), metav1.GetOptions{})
			if perr != nil || serr != nil {
				t.Fatal(perr, serr)
			}
			got := outcome{ReplicaSets: len(rss.Items), PodPrincipal: pod.Annotations[keys.AnnotationPrincipal],
				ServiceLabel: svc.Labels[keys.LabelWorkload], SelectsThePod: resources.Names(svc, pod)}
			got.Chain = chain(svc, pod)
			want := outcome{PodPrincipal: tc.caller, Chain: "Service owns Pod", SelectsThePod: true}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("after the create (-want +got):\n%s", diff)
			}
		})
	}
}
