package sandbox

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

var errInjected = errors.New("injected")

// apiServerWrites makes the fake clientset keep resourceVersions as the API
// server does, increasing like etcd's revision from 100 on every create
// (the fake keeps none), and judge a delete's UID and resourceVersion
// preconditions (the fake ignores them). bump stands for any other write to
// a stored object: it gives it the next resourceVersion.
func apiServerWrites(t *testing.T, client *fake.Clientset) (bump func(gvr schema.GroupVersionResource, name string, mutate func(metav1.Object))) {
	var rv atomic.Int64
	rv.Store(100)
	client.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if o, err := meta.Accessor(a.(k8stesting.CreateAction).GetObject()); err == nil {
			o.SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
			if o.GetUID() == "" {
				o.SetUID(types.UID("uid-" + o.GetName() + "-" + o.GetResourceVersion()))
			}
		}
		return false, nil, nil
	})
	client.PrependReactor("delete", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.DeleteAction)
		pre := d.GetDeleteOptions().Preconditions
		if pre == nil {
			return false, nil, nil
		}
		obj, err := client.Tracker().Get(a.GetResource(), a.GetNamespace(), d.GetName())
		if err != nil {
			return true, nil, err
		}
		live, _ := meta.Accessor(obj)
		if (pre.UID != nil && *pre.UID != live.GetUID()) || (pre.ResourceVersion != nil && *pre.ResourceVersion != live.GetResourceVersion()) {
			return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), d.GetName(), nil)
		}
		return false, nil, nil
	})
	return func(gvr schema.GroupVersionResource, name string, mutate func(metav1.Object)) {
		obj, err := client.Tracker().Get(gvr, "deer-flow", name)
		if err != nil {
			t.Fatal(err)
		}
		obj = obj.DeepCopyObject()
		o, _ := meta.Accessor(obj)
		o.SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
		if mutate != nil {
			mutate(o)
		}
		if err := client.Tracker().Update(gvr, obj, "deer-flow"); err != nil {
			t.Fatal(err)
		}
	}
}

// faultEnv is what a fault injected into a create can act on.
type faultEnv struct {
	bump   func(schema.GroupVersionResource, string, func(metav1.Object))
	client *fake.Clientset
	cancel context.CancelFunc // the request's: its client goes away
	action k8stesting.Action  // the call the fault replaces
}

func (e *faultEnv) inject(f func(faultEnv) error) error { return f(*e) }

// land stores the object of the create the fault replaces, as the API
// server does before an answer that is lost, and returns err.
func (e faultEnv) land(gvr schema.GroupVersionResource, err error) error {
	obj := e.action.(k8stesting.CreateAction).GetObject()
	if o, aerr := meta.Accessor(obj); aerr == nil && o.GetUID() == "" {
		o.SetUID(types.UID("uid-landed-" + o.GetName()))
	}
	if cerr := e.client.Tracker().Create(gvr, obj, "deer-flow"); cerr != nil {
		return cerr
	}
	return err
}

// contextClient is the fake clientset with one thing of a real client: a
// Pod's delete under a context that has ended fails, as its HTTP request
// would (the fake ignores contexts).
type contextClient struct{ *fake.Clientset }

func (c contextClient) CoreV1() typedcorev1.CoreV1Interface {
	return contextCore{c.Clientset.CoreV1()}
}

type contextCore struct{ typedcorev1.CoreV1Interface }

func (c contextCore) Pods(ns string) typedcorev1.PodInterface {
	return contextPods{c.CoreV1Interface.Pods(ns)}
}

type contextPods struct{ typedcorev1.PodInterface }

func (p contextPods) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return p.PodInterface.Delete(ctx, name, opts)
}

// landsAfterFirstRead makes a create of resource that a reactor added
// before fails (its request cut) reach the store all the same, once the
// first read of resource after it has answered "not found": as the API
// server's does when etcd commits the write after that read. landed
// reports whether it has.
func landsAfterFirstRead(t *testing.T, client *fake.Clientset, resource string) (landed func() bool) {
	gvr := corev1.SchemeGroupVersion.WithResource(resource)
	var cut atomic.Pointer[runtime.Object]
	client.PrependReactor("create", resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(k8stesting.CreateAction).GetObject()
		cut.Store(&obj)
		return false, nil, nil // the reactor added before fails it
	})
	client.PrependReactor("get", resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := cut.Swap(nil)
		if p == nil {
			return false, nil, nil
		}
		if err := client.Tracker().Create(gvr, *p, "deer-flow"); err != nil {
			t.Error(err)
		}
		return true, nil, apierrors.NewNotFound(gvr.GroupResource(), a.(k8stesting.GetAction).GetName())
	})
	return func() bool { return cut.Load() == nil }
}

// TestCreateLeavesNothingWhenItsWritesFail fails the slot's create (the
// Service, written first), its read after the create found one, or the
// Pod's create, the last write (the Pod owns the slot from its create:
// nothing binds them after it): the create answers the failure (503, to
// retry) and leaves no object it wrote, also when its client went away
// meanwhile (the undo does not run under the request's context) and when
// the Pod's create landed though its answer was lost (the undo reads it
// back). When another create of the id answered with that Pod meanwhile
// (it owns its Service, so the sandbox is whole as soon as it lands: the
// other's reuse moved its activity mark), the sandbox is left alone, its
// slot with it.
func TestCreateLeavesNothingWhenItsWritesFail(t *testing.T) {
	pods, svcs := corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithResource("services")
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	s := ownerSpec("svcfail1")
	s.Caller = api.Caller{Principal: "alice"}
	type result struct {
		Kind api.Kind
		Left []string
	}
	tests := []struct {
		name string
		on   string // the verb the fault replaces: the slot's create, or the Pod's
		// resource: "services" (the slot) when empty, or "pods"
		resource string
		// inject runs in place of that call and says what the create gets.
		inject  func(e faultEnv) error
		failGet bool // the Service's read fails too
		// landsLate: the slot's cut create reaches the store only once the
		// first read of the Service has answered (not found).
		landsLate bool
		want      result
	}{
		{name: "the slot's create fails", on: "create", inject: func(faultEnv) error {
			return apierrors.NewInternalError(errInjected)
		}, want: result{Kind: api.KindUnavailable}},
		{name: "the Service exists and its read fails", on: "create", inject: func(faultEnv) error {
			return apierrors.NewAlreadyExists(svcs.GroupResource(), resources.ServiceName(s.ID))
		}, failGet: true, want: result{Kind: api.KindUnavailable}},
		{name: "the client goes away during the slot's create", on: "create", inject: func(e faultEnv) error {
			e.cancel()
			return context.Canceled
		}, want: result{Kind: api.KindUnavailable}},
		{name: "the client goes away during the slot's create, which lands after the first read", on: "create", inject: func(e faultEnv) error {
			e.cancel()
			return context.Canceled
		}, landsLate: true, want: result{Kind: api.KindUnavailable}},
		// The Pod's create is the last write (it owns the slot from its
		// create: no bind follows).
		{name: "the Pod's create fails", on: "create", resource: "pods", inject: func(faultEnv) error {
			return apierrors.NewInternalError(errInjected)
		}, want: result{Kind: api.KindUnavailable}},
		{name: "the client goes away during the Pod's create", on: "create", resource: "pods", inject: func(e faultEnv) error {
			e.cancel()
			return context.Canceled
		}, want: result{Kind: api.KindUnavailable}},
		{name: "the Pod's create lands and its answer is lost", on: "create", resource: "pods", inject: func(e faultEnv) error {
			return e.land(pods, apierrors.NewInternalError(errInjected))
		}, want: result{Kind: api.KindUnavailable}},
		{name: "the Pod's create lands, its answer is lost, and another create answered with it meanwhile", on: "create", resource: "pods", inject: func(e faultEnv) error {
			err := e.land(pods, apierrors.NewInternalError(errInjected))
			// The other create's reuse: the Pod is young, so the activity mark moves.
			e.bump(pods, resources.PodName(s.ID), func(o metav1.Object) {
				a := o.GetAnnotations()
				a[keys.AnnotationLastActivity] = time.Now().UTC().Format(time.RFC3339Nano)
				o.SetAnnotations(a)
			})
			return err
		}, want: result{Kind: api.KindUnavailable, Left: []string{"Pod " + resources.PodName(s.ID), "Service " + resources.ServiceName(s.ID)}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			ctx, cancel := context.WithTimeout(api.WithCaller(context.Background(), s.Caller), 10*time.Second)
			defer cancel()
			e := &faultEnv{bump: apiServerWrites(t, client), client: client, cancel: cancel}
			resource := tc.resource
			if resource == "" {
				resource = "services"
			}
			client.PrependReactor(tc.on, resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
				e.action = a
				return true, nil, e.inject(tc.inject)
			})
			landed := func() bool { return true }
			if tc.landsLate {
				landed = landsAfterFirstRead(t, client, "services")
			}
			if tc.failGet {
				client.PrependReactor("get", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewServiceUnavailable("injected")
				})
			}
			m := NewManager(cfg, contextClient{client})
			m.rm.Lands = 10 * time.Millisecond
			_, err := m.Create(ctx, s, 0)
			if !landed() {
				t.Error("the cut slot never landed: the row tests nothing")
			}
			got := result{Kind: -1}
			if err != nil {
				got.Kind = api.KindOf(err)
			}
			got.Left = standing(t, client)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("the create's error kind and the objects left (-want +got):\n%s\nerror: %v", diff, err)
			}
		})
	}
}

// TestRacingCreateKeepsWhatItAnswered: a create that lost the race for an
// id (its Service create met the winner's: errOtherKind) answers with the
// winner's sandbox, and marks it as any create marks what it finds, so
// that the winner's undo (its client gone after its last write) spares
// the sandbox the loser answered for. Without that answer the undo removes
// it, as it should. The fake clientset stands in for the API server,
// with its resourceVersions (apiServerWrites, and a bump on each patch).
func TestRacingCreateKeepsWhatItAnswered(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	for _, tc := range []struct {
		name     string
		answered bool // a racing create answered with the sandbox
		want     []string
	}{
		{"no other create answered for it", false, nil},
		{"a racing create answered with it", true, []string{"Pod " + resources.PodName("race1"), "Service " + resources.ServiceName("race1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			bump := apiServerWrites(t, client)
			client.PrependReactor("patch", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
				bump(a.GetResource(), a.(k8stesting.PatchAction).GetName(), nil)
				return false, nil, nil
			})
			s := ownerSpec("race1")
			s.Caller = api.Caller{Principal: "alice"}
			ctx := api.WithCaller(context.Background(), s.Caller)
			m := NewManager(cfg, client)
			if _, err := m.Create(ctx, s, 0); err != nil {
				t.Fatal(err)
			}
			// What the winner wrote, as it last saw it.
			f, err := m.fetch(ctx, s.ID)
			if err != nil || f.pod == nil || f.svc == nil {
				t.Fatalf("the winner's sandbox: %+v, %v", f, err)
			}
			if tc.answered {
				if _, err := m.reuseOtherKind(ctx, s); err != nil {
					t.Fatal(err)
				}
			}
			m.undoMade(ctx, made{found: f})
			if diff := cmp.Diff(tc.want, standing(t, client)); diff != "" {
				t.Errorf("left after the winner's undo (-want +got):\n%s", diff)
			}
		})
	}
}

// standing names the Pods and Services in client's store ("Pod x",
// "Service y"), Pods first.
func standing(t *testing.T, client *fake.Clientset) []string {
	t.Helper()
	pods, perr := client.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), "deer-flow")
	svcs, serr := client.Tracker().List(corev1.SchemeGroupVersion.WithResource("services"), corev1.SchemeGroupVersion.WithKind("Service"), "deer-flow")
	if perr != nil || serr != nil {
		t.Fatal(perr, serr)
	}
	var out []string
	for _, p := range pods.(*corev1.PodList).Items {
		out = append(out, "Pod "+p.Name)
	}
	for _, s := range svcs.(*corev1.ServiceList).Items {
		out = append(out, "Service "+s.Name)
	}
	return out
}

// TestUndoReadsAgainAfterAStatusWrite: a create whose client went away
// after its Pod's create (its last write) undoes it; a write to the Pod
// that lands before the undo's delete (the scheduler's, the kubelet's
// status) makes that delete, which carries the version the create got, a
// conflict: the undo reads the Pod again and, its activity mark unmoved,
// removes it at its new version, then the slot.
func TestUndoReadsAgainAfterAStatusWrite(t *testing.T) {
	pods := corev1.SchemeGroupVersion.WithResource("pods")
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	s := ownerSpec("statuswrite1")
	s.Caller = api.Caller{Principal: "alice"}
	client := fake.NewClientset()
	bump := apiServerWrites(t, client)
	ctx, cancel := context.WithTimeout(api.WithCaller(context.Background(), s.Caller), 10*time.Second)
	defer cancel()
	client.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		cancel() // the client goes away; the create goes on to the store
		return false, nil, nil
	})
	var bumped, deletes atomic.Int32
	client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		deletes.Add(1)
		if bumped.CompareAndSwap(0, 1) {
			bump(pods, a.(k8stesting.DeleteAction).GetName(), nil) // the status write
		}
		return false, nil, nil
	})
	m := NewManager(cfg, contextClient{client})
	_, err := m.Create(ctx, s, 0)
	if api.KindOf(err) != api.KindUnavailable {
		t.Errorf("the create answered %v, want a 503 (its client went away)", err)
	}
	if left := standing(t, client); len(left) != 0 || deletes.Load() < 2 {
		t.Errorf("left %v after %d Pod deletes; want nothing, the first delete refused (a conflict) and a second one", left, deletes.Load())
	}
}
