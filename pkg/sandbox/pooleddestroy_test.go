package sandbox

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/token"
)

// TestDestroyOfAPendingClaim: a destroy that meets a pooled create between
// its two writes (the Service, owned by the pooled Pod it is about to
// claim; then the claim's conditional patch of that Pod) leaves no Pod of
// the id standing without its Service, whenever the claim's writes land:
// such a Pod is a sandbox the quota does not count and no get finds. The
// destroy takes the pooled Pod as read (of its delete and the claim's
// patch, both conditional on the same version, one lands) and removes the
// Service as read (a claim that handed it to another pooled Pod meanwhile
// is judged again). Before this, a destroy that had waited 3 s removed the
// Service alone, and a claim landing after that stood uncounted (the first
// "lands as" row). The fake clientset stands in for the API server; the
// claim's writes are made on its tracker, as they would land.
func TestDestroyOfAPendingClaim(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	const id = "pending1"
	alice := api.Caller{Principal: "alice"}
	const podA, podB = "sandbox-pool-python-aaaaa", "sandbox-pool-python-bbbbb"
	type outcome struct {
		Err     api.Kind // the destroy's error kind, 0 for none
		Pods    []string // the Pods standing after it
		Service bool     // the id's Service stands
	}
	tests := []struct {
		name string
		// before, made on the tracker before the destroy; during, when the
		// destroy sends its first delete of the Pod named (or, absent, of
		// anything), before that delete is applied; after, 300 ms into the
		// destroy.
		before, after func(c *claimWrites)
		during        func(c *claimWrites, deleting string)
		want          outcome
		// unwaited: the destroy reads the id's Service once per round, not
		// every 20 ms for claimLands (a claim that has landed is not waited for).
		unwaited bool
	}{
		{name: "the claim lands while the destroy waits: both go",
			after: func(c *claimWrites) { c.claim(podA, id) },
			want:  outcome{Pods: []string{podB}}},
		{name: "the claim never lands (its replica stopped): its Service and the pooled Pod it named go",
			want: outcome{Pods: []string{podB}}},
		{name: "the claim lands as the destroy gives up waiting: the claimed Pod goes with its Service",
			during: func(c *claimWrites, _ string) { c.claim(podA, id) },
			want:   outcome{Pods: []string{podB}}},
		{name: "the claim hands its Service to another pooled Pod and claims it as the destroy removes the first: both go",
			during: func(c *claimWrites, deleting string) {
				if deleting == podA {
					c.handOver(podB)
					c.claim(podB, id)
				}
			},
			want: outcome{}},
		{name: "the pooled Pod was claimed by another sandbox: that sandbox stays, the Service of the id goes",
			before: func(c *claimWrites) { c.claim(podA, "other1") },
			want:   outcome{Pods: []string{podA, podB}}},
		// A destroy cut between its two deletes: the claimed Pod is going,
		// its Service stays. The retry finds no claim to wait for.
		{name: "the claim landed and its Pod is terminating: the Service goes at once",
			before: func(c *claimWrites) {
				c.claim(podA, id)
				c.bump(podsResource, podA, func(o metav1.Object) { o.SetDeletionTimestamp(&metav1.Time{Time: time.Now()}) })
			},
			want: outcome{Pods: []string{podA, podB}}, unwaited: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			bump := apiServerWrites(t, client)
			m := NewManager(cfg, client)
			bg := context.Background()
			for _, name := range []string{podA, podB} {
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "deer-flow", UID: types.UID("uid-" + name),
					Labels: map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelManagedBy: keys.ManagedByValue, keys.LabelPool: "python"}}}
				if _, err := client.CoreV1().Pods("deer-flow").Create(bg, pod, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// The pooled create's Service, made before its claim.
			s := ownerSpec(id)
			s.Caller, s.Token = alice, token.New()
			svc := resources.BuildService(cfg.Objects(), s, resources.PodOwnerRef(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podA, UID: "uid-" + podA}}))
			resources.RecordPrincipal(&svc.ObjectMeta, s)
			if _, err := client.CoreV1().Services("deer-flow").Create(bg, svc, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			c := &claimWrites{t: t, bump: bump, s: s}
			if tc.before != nil {
				tc.before(c)
			}
			var once sync.Once
			if tc.during != nil {
				client.PrependReactor("delete", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
					name := a.(k8stesting.DeleteAction).GetName()
					if name == podA || a.GetResource().Resource == "services" {
						once.Do(func() { tc.during(c, name) })
					}
					return false, nil, nil
				})
			}
			racer := make(chan struct{})
			go func() {
				defer close(racer)
				if tc.after != nil {
					time.Sleep(300 * time.Millisecond)
					tc.after(c)
				}
			}()
			ctx, cancel := context.WithTimeout(api.WithCaller(bg, alice), 8*time.Second)
			defer cancel()
			err := m.Destroy(ctx, id)
			<-racer

			got := outcome{Err: domainKind(t, err)}
			pods, err := client.CoreV1().Pods("deer-flow").List(bg, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pods.Items {
				got.Pods = append(got.Pods, p.Name)
			}
			sort.Strings(got.Pods)
			kept, err := client.CoreV1().Services("deer-flow").Get(bg, resources.ServiceName(id), metav1.GetOptions{})
			got.Service = err == nil
			if reads := serviceReads(client, resources.ServiceName(id)); tc.unwaited && reads > 2 {
				t.Errorf("the destroy read Service %s %d times: it waited for a claim that had landed", resources.ServiceName(id), reads)
			}
			// A Pod already being deleted stands for no one (fetchObjects
			// treats it as gone, and the kubelet removes it); the fake keeps
			// the one the terminating row sets up.
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil && resources.PodID(&p) == id && (!got.Service || resources.OwnerUID(kept.OwnerReferences) != p.UID) {
					t.Errorf("Pod %s of sandbox %s stands without its Service: the quota does not count it", p.Name, id)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("after the destroy (-want +got):\n%s", diff)
			}
		})
	}
}

// serviceReads counts the gets of Service name the client has answered.
func serviceReads(client *fake.Clientset, name string) int {
	n := 0
	for _, a := range client.Actions() {
		if g, ok := a.(k8stesting.GetAction); ok && a.GetVerb() == "get" && a.GetResource().Resource == "services" && g.GetName() == name {
			n++
		}
	}
	return n
}

// claimWrites makes a pooled create's writes on the fake's tracker, as
// they would land on the API server (each bumps the resourceVersion).
type claimWrites struct {
	t    *testing.T
	bump func(schema.GroupVersionResource, string, func(metav1.Object))
	s    api.Spec
}

var (
	podsResource     = corev1.SchemeGroupVersion.WithResource("pods")
	servicesResource = corev1.SchemeGroupVersion.WithResource("services")
)

// claim is the claim's patch of a pooled Pod for sandbox id: the pool's
// label goes, the sandbox's labels and principal come.
func (c *claimWrites) claim(pod, id string) {
	s := c.s
	s.ID = id
	if id != c.s.ID {
		s.Caller = api.Caller{Principal: "bob"}
	}
	c.bump(podsResource, pod, func(o metav1.Object) {
		meta := metav1.ObjectMeta{Labels: resources.Labels(s), Annotations: resources.Annotations(s)}
		resources.RecordPrincipal(&meta, s)
		meta.Labels[keys.LabelPooled] = "true"
		meta.Labels[keys.LabelToken] = s.Token
		o.SetLabels(meta.Labels)
		o.SetAnnotations(meta.Annotations)
	})
}

// handOver is a claim handing its Service to another pooled Pod, after
// losing the first.
func (c *claimWrites) handOver(pod string) {
	c.bump(servicesResource, resources.ServiceName(c.s.ID), func(o metav1.Object) {
		o.SetOwnerReferences([]metav1.OwnerReference{resources.PodOwnerRef(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, UID: types.UID("uid-" + pod)}})})
	})
}
