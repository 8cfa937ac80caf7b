package sandbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func slice(svc string, endpoints ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-x1", Namespace: "deer-flow", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   endpoints,
	}
}

func endpointOf(uid types.UID, addrs ...string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: addrs, TargetRef: &corev1.ObjectReference{Kind: "Pod", UID: uid}}
}

// TestCreateAnswersOnceItsNameResolves: in Headless mode a create that asks
// for no wait is answered only once an EndpointSlice of its Service lists
// its Pod's address, since cluster DNS caches the NXDOMAIN of an earlier
// lookup; in ClusterIP mode (a virtual IP the name always resolves to) it
// is answered at once, with no watch of slices. Client-go's fake clientset
// stands in for the API server, and the test writes the slices that the
// EndpointSlice controller would (the real one: test/knative).
func TestCreateAnswersOnceItsNameResolves(t *testing.T) {
	for _, mode := range []string{"Headless", "ClusterIP"} {
		t.Run(mode, func(t *testing.T) {
			client := fake.NewClientset()
			watching := make(chan struct{}, 1)
			client.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
				select {
				case watching <- struct{}{}:
				default:
				}
				return false, nil, nil
			})
			m := NewManager(testConfig(t, map[string]string{"SANDBOX_SERVICE_TYPE": mode, "SANDBOX_NETWORK_POLICY_ENSURE": "true"}), client)
			// Not the bound that ends the wait here: the slice does.
			m.nameWait = time.Minute
			ctx, cancel := context.WithTimeout(api.WithCaller(context.Background(), api.Caller{Principal: "default"}), 30*time.Second)
			defer cancel()
			type answer struct {
				sb  api.Sandbox
				err error
			}
			answered := make(chan answer, 1)
			go func() {
				sb, err := m.Create(ctx, api.Spec{ID: "new1", UserID: "u", ThreadID: "t", IdleTimeout: time.Hour, MaxLifetime: time.Hour}, 0)
				answered <- answer{sb, err}
			}()
			if mode != "Headless" {
				a := <-answered
				if a.err != nil || a.sb.URL == "" {
					t.Fatalf("create: %+v, %v", a.sb, a.err)
				}
				for _, act := range client.Actions() {
					if act.GetResource().Resource == "endpointslices" {
						t.Errorf("%s mode: the create made a %s of EndpointSlices; want none", mode, act.GetVerb())
					}
				}
				return
			}
			select {
			case <-watching:
			case a := <-answered:
				t.Fatalf("answered (%+v, %v) before watching the Service's EndpointSlices", a.sb, a.err)
			}
			pod, err := client.CoreV1().Pods("deer-flow").Get(ctx, resources.PodName("new1"), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			slices := client.DiscoveryV1().EndpointSlices("deer-flow")
			// Neither another Service's slice nor one without the Pod's
			// address lets the name resolve.
			for _, s := range []*discoveryv1.EndpointSlice{
				slice(resources.ServiceName("other"), endpointOf(pod.UID, "10.88.0.7")),
				func() *discoveryv1.EndpointSlice {
					s := slice(resources.ServiceName("new1"))
					s.Name += "-empty"
					return s
				}(),
			} {
				if _, err := slices.Create(ctx, s, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case a := <-answered:
				t.Fatalf("answered (%+v, %v) before a slice of its Service listed its Pod", a.sb, a.err)
			case <-time.After(200 * time.Millisecond):
			}
			if _, err := slices.Create(ctx, slice(resources.ServiceName("new1"), endpointOf(pod.UID, "10.88.0.5")), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			select {
			case a := <-answered:
				if a.err != nil || a.sb.URL != "http://sandbox-new1-svc.deer-flow.svc.cluster.local:8080" {
					t.Fatalf("create: %+v, %v", a.sb, a.err)
				}
			case <-ctx.Done():
				t.Fatal("no answer after the slice listed the Pod's address")
			}
		})
	}
}

// TestNameWaitFallsBackOrGivesUp: a watch the API server ends (its
// starting version too old) is followed by one list, which may already
// show the slice; a Role without endpointslices ends the wait at once, so
// creates are answered as before rather than after the bound. Client-go's
// fake clientset stands in for the API server, with its errors injected.
func TestNameWaitFallsBackOrGivesUp(t *testing.T) {
	forbidden := apierrors.NewForbidden(discoveryv1.Resource("endpointslices"), "", errors.New("injected: the Role grants nothing on endpointslices"))
	tests := []struct {
		name string
		// writeSlice: by the first watch of slices (which the test's
		// reactor then ends) a slice lists the new Pod, for the list to find.
		writeSlice bool
		watchErr   error
		listErr    error
	}{
		{name: "the watch ends, the list shows the slice", writeSlice: true},
		{name: "the Role refuses the watch", watchErr: forbidden},
		{name: "the watch ends, the Role refuses the list", listErr: forbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			var watches atomic.Int32
			client.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
				watches.Add(1)
				if tt.watchErr != nil {
					return true, nil, tt.watchErr
				}
				if tt.writeSlice {
					pod, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), "deer-flow", resources.PodName("new1"))
					if err != nil {
						return true, nil, err
					}
					s := slice(resources.ServiceName("new1"), endpointOf(pod.(*corev1.Pod).UID, "10.88.0.5"))
					if err := client.Tracker().Add(s); err != nil {
						return true, nil, err
					}
				}
				w := watch.NewRaceFreeFake()
				w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired})
				return true, w, nil
			})
			client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
				return tt.listErr != nil, nil, tt.listErr
			})
			m := NewManager(testConfig(t, map[string]string{"SANDBOX_SERVICE_TYPE": "Headless", "SANDBOX_NETWORK_POLICY_ENSURE": "true"}), client)
			m.nameWait = time.Minute // far beyond the test's patience: only the fallback or the refusal ends it
			ctx, cancel := context.WithTimeout(api.WithCaller(context.Background(), api.Caller{Principal: "default"}), 30*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := m.Create(ctx, api.Spec{ID: "new1", UserID: "u", ThreadID: "t", IdleTimeout: time.Hour, MaxLifetime: time.Hour}, 0)
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("create: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no answer within 10 s: the wait for the name neither fell back to a list nor gave up")
			}
			// One watch: the list that follows it found the slice, or a
			// refusal ended the wait; no second watch was needed.
			if n := watches.Load(); n != 1 {
				t.Errorf("%d watches of EndpointSlices, want 1", n)
			}
		})
	}
}
