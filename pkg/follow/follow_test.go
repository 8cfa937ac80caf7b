package follow

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// TestListsAddress pins which EndpointSlice lets a create answer in
// Headless mode: one of its own Service that lists an address of its Pod.
func TestListsAddress(t *testing.T) {
	const pod types.UID = "pod-1"
	tests := []struct {
		name  string
		slice *discoveryv1.EndpointSlice
		pod   types.UID
		want  bool
	}{
		{"its Pod's address", slice("sandbox-a-svc", endpointOf("pod-1", "10.88.0.5")), pod, true},
		{"no endpoints yet", slice("sandbox-a-svc"), pod, false},
		{"its Pod without an address", slice("sandbox-a-svc", endpointOf("pod-1")), pod, false},
		{"another Pod's address (the one before a resume)", slice("sandbox-a-svc", endpointOf("pod-0", "10.88.0.4")), pod, false},
		{"another Service's slice", slice("sandbox-b-svc", endpointOf("pod-1", "10.88.0.5")), pod, false},
		{"any address, when the Pod is not known yet", slice("sandbox-a-svc", endpointOf("pod-9", "10.88.0.9")), "", true},
		{"an address without a Pod behind it", slice("sandbox-a-svc", discoveryv1.Endpoint{Addresses: []string{"10.88.0.5"}}), pod, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ListsAddress(tt.slice, "sandbox-a-svc", tt.pod); got != tt.want {
				t.Errorf("ListsAddress = %v, want %v", got, tt.want)
			}
		})
	}
}

func podAt(rv string, ready bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-a", Namespace: "deer-flow", UID: "pod-1", ResourceVersion: rv}}
	if ready {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	return p
}

func isReady(p *corev1.Pod) bool {
	return p == nil || slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// TestPod: follow.Pod resumes a watch the server closes from the last
// version it saw, reads the Pod afresh when its version is too old (410),
// hands a deletion over as nil, and ends at once on a watch refused.
// Stand-in: the fake clientset, whose watches are scripted here; the
// e2e tests follow real Pods.
func TestPod(t *testing.T) {
	type step struct {
		events []watch.Event
		close  bool // the server closes the watch after the events
	}
	tests := []struct {
		name     string
		watches  []step
		watchErr error       // every watch is refused
		stored   *corev1.Pod // what a Get reads; nil: not found
		want     *corev1.Pod
		wantRVs  []string // the version each watch started from
		wantErr  string
	}{{
		name: "closed by the server, resumed from the last version",
		watches: []step{
			{events: []watch.Event{{Type: watch.Modified, Object: podAt("11", false)}}, close: true},
			{events: []watch.Event{{Type: watch.Modified, Object: podAt("12", true)}}},
		},
		want:    podAt("12", true),
		wantRVs: []string{"10", "11"},
	}, {
		name:    "too old: read afresh, and it is ready",
		watches: []step{{events: []watch.Event{{Type: watch.Error, Object: &apierrors.NewResourceExpired("too old resource version: 10 (30)").ErrStatus}}}},
		stored:  podAt("30", true),
		want:    podAt("30", true),
		wantRVs: []string{"10"},
	}, {
		name: "too old: read afresh, not ready, watched from the read",
		watches: []step{
			{events: []watch.Event{{Type: watch.Error, Object: &apierrors.NewResourceExpired("too old").ErrStatus}}},
			{events: []watch.Event{{Type: watch.Modified, Object: podAt("31", true)}}},
		},
		stored:  podAt("30", false),
		want:    podAt("31", true),
		wantRVs: []string{"10", "30"},
	}, {
		name:    "too old, and the Pod is gone",
		watches: []step{{events: []watch.Event{{Type: watch.Error, Object: &apierrors.NewResourceExpired("too old").ErrStatus}}}},
		want:    nil,
		wantRVs: []string{"10"},
	}, {
		name:    "deleted",
		watches: []step{{events: []watch.Event{{Type: watch.Deleted, Object: podAt("11", false)}}}},
		want:    nil,
		wantRVs: []string{"10"},
	}, {
		name:    "another Pod of the name is not this one",
		watches: []step{{events: []watch.Event{{Type: watch.Modified, Object: func() *corev1.Pod { p := podAt("11", true); p.UID = "pod-2"; return p }()}, {Type: watch.Modified, Object: podAt("12", true)}}}},
		want:    podAt("12", true),
		wantRVs: []string{"10"},
	}, {
		name:     "a watch refused",
		watchErr: apierrors.NewForbidden(corev1.Resource("pods"), "", errors.New("no watch")),
		want:     podAt("10", false),
		wantRVs:  []string{"10"},
		wantErr:  "watch the sandbox Pod",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tt.stored != nil {
				if err := client.Tracker().Add(tt.stored); err != nil {
					t.Fatal(err)
				}
			}
			var rvs []string
			client.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
				n := len(rvs)
				rvs = append(rvs, a.(k8stesting.WatchAction).GetWatchRestrictions().ResourceVersion)
				if tt.watchErr != nil {
					return true, nil, tt.watchErr
				}
				w := watch.NewFakeWithChanSize(len(tt.watches[min(n, len(tt.watches)-1)].events), false)
				if n >= len(tt.watches) {
					return true, w, nil // no more: the wait's ctx ends it
				}
				for _, ev := range tt.watches[n].events {
					w.Action(ev.Type, ev.Object)
				}
				if tt.watches[n].close {
					w.Stop()
				}
				return true, w, nil
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got, err := Pod(ctx, client.CoreV1().Pods("deer-flow"), podAt("10", false), isReady)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && !strings.Contains(gotErr, tt.wantErr) {
				t.Fatalf("Pod() error = %v, want %q", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Pod() (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantRVs, rvs); diff != "" {
				t.Errorf("watches started from (-want +got):\n%s", diff)
			}
		})
	}
}
