package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// patchPreconditions makes the fake clientset judge a patch's
// metadata.uid and metadata.resourceVersion as the API server does (the
// fake applies any patch): a UID that is not the object's is refused as a
// change of an immutable field (422), a resourceVersion that is not its
// own as a conflict (409).
func patchPreconditions(client *fake.Clientset, resource string) {
	client.PrependReactor("patch", resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		var patch struct {
			Metadata struct {
				UID             types.UID `json:"uid"`
				ResourceVersion string    `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(p.GetPatch(), &patch); err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		obj, err := client.Tracker().Get(a.GetResource(), a.GetNamespace(), p.GetName())
		if err != nil {
			return true, nil, err
		}
		live := obj.(metav1.Object)
		gk := a.GetResource().GroupResource()
		switch {
		case patch.Metadata.UID != "" && patch.Metadata.UID != live.GetUID():
			return true, nil, apierrors.NewInvalid(appsv1.SchemeGroupVersion.WithKind("ReplicaSet").GroupKind(), p.GetName(), field.ErrorList{
				field.Invalid(field.NewPath("metadata", "uid"), patch.Metadata.UID, "field is immutable")})
		case patch.Metadata.ResourceVersion != "" && patch.Metadata.ResourceVersion != live.GetResourceVersion():
			return true, nil, apierrors.NewConflict(gk, p.GetName(), nil)
		}
		return false, nil, nil
	})
}

// TestPauseAndResumeNeverActOnAReplicaSetMadeAgain: pause and resume patch
// the ReplicaSet they found with its UID, so when it is deleted and created
// again under the same name between their read and their patch (a reactor
// swaps it), the new one is left as it is and the caller gets a conflict
// to retry; without the swap, both do their work.
func TestPauseAndResumeNeverActOnAReplicaSetMadeAgain(t *testing.T) {
	type result struct {
		Kind     api.Kind // -1: no error
		Replicas int32    // of the ReplicaSet there after the call
		UID      types.UID
	}
	tests := []struct {
		name   string
		paused bool // the ReplicaSet found
		swap   bool // another one replaces it before the patch
		op     func(m *Manager, ctx context.Context, id string) error
		want   result
	}{
		{name: "pause", op: pause, want: result{Kind: -1, Replicas: 0, UID: "rs-1"}},
		{name: "pause, the ReplicaSet made again meanwhile", swap: true, op: pause, want: result{Kind: api.KindConflict, Replicas: 1, UID: "rs-2"}},
		{name: "resume", paused: true, op: resume, want: result{Kind: -1, Replicas: 1, UID: "rs-1"}},
		{name: "resume, the ReplicaSet made again meanwhile", paused: true, swap: true, op: resume, want: result{Kind: api.KindConflict, Replicas: 0, UID: "rs-2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, s, rs, svc := aliceReplicaSet(t)
			rs.ResourceVersion = "10"
			if tc.paused {
				rs.Spec.Replicas = ptr.To(int32(0))
			}
			client := fake.NewClientset(rs, svc)
			rsGVR := appsv1.SchemeGroupVersion.WithResource("replicasets")
			patchPreconditions(client, "replicasets")
			if tc.swap {
				swapped := false
				client.PrependReactor("patch", "replicasets", func(k8stesting.Action) (bool, runtime.Object, error) {
					if !swapped {
						swapped = true
						again := rs.DeepCopy()
						again.UID, again.ResourceVersion = "rs-2", "20"
						again.Spec.Replicas = ptr.To(map[bool]int32{true: 0, false: 1}[tc.paused])
						if err := client.Tracker().Delete(rsGVR, rs.Namespace, rs.Name); err != nil {
							t.Fatal(err)
						}
						if err := client.Tracker().Add(again); err != nil {
							t.Fatal(err)
						}
					}
					return false, nil, nil
				})
			}
			m := NewManager(cfg, client)
			err := tc.op(m, api.WithCaller(context.Background(), s.Caller), s.ID)
			got := result{Kind: -1}
			if err != nil {
				got.Kind = api.KindOf(err)
			}
			after, gerr := client.AppsV1().ReplicaSets(cfg.Namespace).Get(context.Background(), rs.Name, metav1.GetOptions{})
			if gerr != nil {
				t.Fatal(gerr)
			}
			got.Replicas, got.UID = ptr.Deref(after.Spec.Replicas, -1), after.UID
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\nerror: %v", diff, err)
			}
		})
	}
}

// aliceReplicaSet is alice's ReplicaSet sandbox rs1 (UID rs-1) and its
// Service, as a create writes them.
func aliceReplicaSet(t *testing.T) (*config.Config, api.Spec, *appsv1.ReplicaSet, *corev1.Service) {
	t.Helper()
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	s := ownerSpec("rs1")
	s.Caller = api.Caller{Principal: "alice"}
	rs := resources.BuildReplicaSet(cfg.Objects(), s)
	rs.UID = "rs-1"
	return cfg, s, rs, resources.BuildService(cfg.Objects(), s, resources.ReplicaSetOwnerRef(rs))
}

func pause(m *Manager, ctx context.Context, id string) error {
	_, err := m.Pause(ctx, id)
	return err
}

func resume(m *Manager, ctx context.Context, id string) error {
	_, err := m.Resume(ctx, id, 0)
	return err
}

// TestDestroyStopsEveryPodOfItsReplicaSet: a destroy answered 200 leaves
// no Pod of the ReplicaSet running, including one its controller made
// after the destroy read the sandbox (a create or resume answered without
// waiting for it): the fake has no garbage collector, as the real one may
// come late. A Pod that carries the labels but that the ReplicaSet does not
// control stays.
func TestDestroyStopsEveryPodOfItsReplicaSet(t *testing.T) {
	tests := []struct {
		name      string
		before    bool // the controller made the Pod before the destroy's read
		otherOwns bool // another ReplicaSet controls the Pod
		wantLeft  []string
	}{
		{name: "made before the read", before: true, wantLeft: []string{}},
		{name: "made between the read and the delete", wantLeft: []string{}},
		{name: "controlled by another ReplicaSet", otherOwns: true, wantLeft: []string{"sandbox-rs1-x7k2q"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, s, rs, svc := aliceReplicaSet(t)
			pod := &corev1.Pod{ObjectMeta: *rs.Spec.Template.ObjectMeta.DeepCopy(), Spec: *rs.Spec.Template.Spec.DeepCopy()}
			pod.Name, pod.Namespace, pod.UID = "sandbox-rs1-x7k2q", cfg.Namespace, "pod-1"
			owner := rs
			if tc.otherOwns {
				owner = rs.DeepCopy()
				owner.UID = "rs-0"
			}
			pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(owner, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}
			client := fake.NewClientset(rs, svc)
			if tc.before || tc.otherOwns {
				if err := client.Tracker().Add(pod); err != nil {
					t.Fatal(err)
				}
			}
			var added error = errors.New("the ReplicaSet was never deleted")
			client.PrependReactor("delete", "replicasets", func(k8stesting.Action) (bool, runtime.Object, error) {
				added = nil
				if !tc.before && !tc.otherOwns {
					added = client.Tracker().Add(pod) // the fake drops a reactor's error when unhandled
				}
				return false, nil, nil
			})
			m := NewManager(cfg, client)
			if err := m.Destroy(api.WithCaller(context.Background(), s.Caller), s.ID); err != nil {
				t.Fatal(err)
			}
			if added != nil {
				t.Fatalf("the Pod made between the read and the delete: %v", added)
			}
			l, err := client.CoreV1().Pods(cfg.Namespace).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			left := []string{}
			for _, p := range l.Items {
				left = append(left, p.Name)
			}
			if diff := cmp.Diff(tc.wantLeft, left); diff != "" {
				t.Errorf("Pods left after the destroy (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPauseAnswersOnceItsPodIsGoing: a pause answers only once the
// ReplicaSet's controller has taken the sandbox's Pod away, so the next
// request finds the sandbox paused (and wakes it) rather than reaching a
// Pod about to be cut. The fake has no controller: a reactor deletes the
// Pod a while after the pause's watch starts, or never, and then the pause
// answers at its bound, paused all the same.
func TestPauseAnswersOnceItsPodIsGoing(t *testing.T) {
	defer func(d time.Duration) { drainWait = d }(drainWait)
	drainWait = 3 * time.Second
	// The fake answers no watch-list (a watch that streams the list first),
	// which client-go's reflector now tries first; the real API server does.
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, false)
	tests := []struct {
		name        string
		deleteAfter time.Duration // 0: never
	}{
		{name: "deleted by its controller 300ms into the watch", deleteAfter: 300 * time.Millisecond},
		{name: "never deleted: the bound"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, s, rs, svc := aliceReplicaSet(t)
			pod := &corev1.Pod{ObjectMeta: *rs.Spec.Template.ObjectMeta.DeepCopy(), Spec: *rs.Spec.Template.Spec.DeepCopy()}
			pod.Name, pod.Namespace, pod.UID = "sandbox-rs1-x7k2q", cfg.Namespace, "pod-1"
			pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}
			client := fake.NewClientset(rs, svc, pod)
			deleted := make(chan time.Time, 1)
			var once sync.Once
			client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
				if tc.deleteAfter > 0 {
					once.Do(func() {
						time.AfterFunc(tc.deleteAfter, func() {
							// The fake deletes at once where the API server
							// marks the Pod first: either way no live Pod.
							// The time is taken before the delete, which the
							// pause may answer before this goroutine goes on.
							at := time.Now()
							if err := client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), pod.Namespace, pod.Name); err != nil {
								t.Error(err)
							}
							deleted <- at
						})
					})
				}
				return false, nil, nil
			})
			m := NewManager(cfg, client)
			start := time.Now()
			sb, err := m.Pause(api.WithCaller(context.Background(), s.Caller), s.ID)
			answered := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			if sb.Status != api.StatusPaused {
				t.Errorf("status %q, want %q", sb.Status, api.StatusPaused)
			}
			took := answered.Sub(start)
			if tc.deleteAfter == 0 {
				if took < drainWait {
					t.Errorf("the pause answered after %s with its Pod still live, before its bound %s", took, drainWait)
				}
				return
			}
			select {
			case at := <-deleted:
				if took >= drainWait {
					t.Errorf("the pause answered at its bound %s, not once its Pod went", took)
				}
				if answered.Before(at) {
					t.Errorf("the pause answered %s before its Pod went", at.Sub(answered))
				}
			case <-time.After(drainWait):
				t.Errorf("the pause answered after %s, and its Pod was never deleted", took)
			}
		})
	}
}
