package resources

import (
	"maps"
	"regexp"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// What a sandbox made by principal alice carries.
var (
	aliceLabel      = map[string]string{"sandbox.deerflow.dev/principal": PrincipalLabelValue("alice")}
	aliceAnnotation = map[string]string{"sandbox.deerflow.dev/principal": "alice"}
)

func TestBuildPodFor(t *testing.T) {
	tests := []struct {
		name   string
		caller api.Caller
		want   *corev1.Pod
	}{{
		name: "no principal: BuildPod's Pod as it is",
		want: wantPod(hostVolumes(), hostMounts(), nil),
	}, {
		name:   "alice's: her principal in clear in an annotation, hashed in a label",
		caller: api.Caller{Principal: "alice"},
		want: func() *corev1.Pod {
			p := wantPod(hostVolumes(), hostMounts(), nil)
			maps.Copy(p.Labels, aliceLabel)
			maps.Copy(p.Annotations, aliceAnnotation)
			return p
		}(),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, map[string]string{"SANDBOX_IMAGE": "sandbox:1"})
			s := testSpec()
			s.Caller = tc.caller
			if diff := cmp.Diff(tc.want, BuildPodFor(cfg.Objects(), s)); diff != "" {
				t.Errorf("BuildPodFor (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildReplicaSet(t *testing.T) {
	// wantReplicaSet is a ReplicaSet sandbox around pod (BuildPodFor's, so
	// TestBuildPod and TestBuildPodFor pin it): the Pod template without
	// the deadline and the per-Pod lifecycle annotations, labelled as a
	// ReplicaSet's Pod; the ReplicaSet with the sandbox's labels and every
	// lifecycle annotation plus its idle action.
	wantReplicaSet := func(pod *corev1.Pod, rsAnnotations map[string]string) *appsv1.ReplicaSet {
		podLabels := maps.Clone(pod.Labels)
		podLabels["sandbox.deerflow.dev/workload"] = "replicaset"
		delete(podLabels, "sandbox.deerflow.dev/pod") // the ReplicaSet controller names its Pods
		podAnnotations := maps.Clone(pod.Annotations)
		delete(podAnnotations, "sandbox.deerflow.dev/last-activity")
		delete(podAnnotations, "sandbox.deerflow.dev/expires-at")
		spec := *pod.Spec.DeepCopy()
		spec.ActiveDeadlineSeconds = nil
		rsLabels := wantLabels()
		if p, ok := pod.Labels["sandbox.deerflow.dev/principal"]; ok {
			rsLabels["sandbox.deerflow.dev/principal"] = p
		}
		annotations := maps.Clone(pod.Annotations)
		maps.Copy(annotations, rsAnnotations)
		return &appsv1.ReplicaSet{
			TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "ReplicaSet"},
			ObjectMeta: metav1.ObjectMeta{Name: "sandbox-0123456789abcdef", Namespace: "deer-flow", Labels: rsLabels, Annotations: annotations},
			Spec: appsv1.ReplicaSetSpec{
				Replicas: ptr.To(int32(1)),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{
					"app": "deer-flow-sandbox", "sandbox-id": "0123456789abcdef", "sandbox.deerflow.dev/workload": "replicaset"}},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: podAnnotations}, Spec: spec},
			},
		}
	}
	pausing := &template.Template{Name: "desk", Kind: template.KindReplicaSet, IdleAction: template.IdlePause, PausedTimeout: 2 * time.Hour,
		Pod: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: template.ContainerName}}}}}
	tests := []struct {
		name string
		spec func(*api.Spec)
		want func(pod *corev1.Pod) *appsv1.ReplicaSet
	}{{
		name: "no template: idle sandboxes are deleted",
		want: func(pod *corev1.Pod) *appsv1.ReplicaSet {
			return wantReplicaSet(pod, map[string]string{"sandbox.deerflow.dev/idle-action": "delete"})
		},
	}, {
		name: "alice's: her principal on the ReplicaSet and its Pods",
		spec: func(s *api.Spec) { s.Caller = api.Caller{Principal: "alice"} },
		want: func(pod *corev1.Pod) *appsv1.ReplicaSet {
			if pod.Labels["sandbox.deerflow.dev/principal"] != aliceLabel["sandbox.deerflow.dev/principal"] {
				t.Fatalf("BuildPodFor's Pod carries no principal label: %v", pod.Labels)
			}
			return wantReplicaSet(pod, map[string]string{"sandbox.deerflow.dev/idle-action": "delete"})
		},
	}, {
		name: "a template that pauses idle sandboxes: the action and the paused timeout in seconds",
		spec: func(s *api.Spec) { s.Template, s.Resolved = pausing.Name, pausing },
		want: func(pod *corev1.Pod) *appsv1.ReplicaSet {
			return wantReplicaSet(pod, map[string]string{"sandbox.deerflow.dev/idle-action": "pause", "sandbox.deerflow.dev/paused-timeout-seconds": "7200"})
		},
	}, {
		name: "resume on traffic, on a template that pauses: said on the ReplicaSet alone",
		spec: func(s *api.Spec) { s.Template, s.Resolved, s.AutoResume = pausing.Name, pausing, true },
		want: func(pod *corev1.Pod) *appsv1.ReplicaSet {
			return wantReplicaSet(pod, map[string]string{"sandbox.deerflow.dev/idle-action": "pause", "sandbox.deerflow.dev/paused-timeout-seconds": "7200",
				"sandbox.deerflow.dev/auto-resume": "true"})
		},
	}, {
		name: "resume on traffic where idle sandboxes are deleted: nothing to resume",
		spec: func(s *api.Spec) { s.AutoResume = true },
		want: func(pod *corev1.Pod) *appsv1.ReplicaSet {
			return wantReplicaSet(pod, map[string]string{"sandbox.deerflow.dev/idle-action": "delete"})
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, map[string]string{"SANDBOX_IMAGE": "sandbox:1"})
			s := testSpec()
			if tc.spec != nil {
				tc.spec(&s)
			}
			want := tc.want(BuildPodFor(cfg.Objects(), s))
			if diff := cmp.Diff(want, BuildReplicaSet(cfg.Objects(), s)); diff != "" {
				t.Errorf("BuildReplicaSet (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPoolPodTemplate(t *testing.T) {
	// A pooled Pod is BuildPod's without what makes it one sandbox: no id,
	// user, thread or name (the ReplicaSet controller names it) labels, no
	// lifecycle annotations, no deadline.
	wantTemplate := func(pod *corev1.Pod) corev1.PodTemplateSpec {
		for _, k := range []string{"sandbox-id", "sandbox.deerflow.dev/user", "sandbox.deerflow.dev/thread", "sandbox.deerflow.dev/pod"} {
			delete(pod.Labels, k)
		}
		for _, k := range []string{"sandbox.deerflow.dev/user-id", "sandbox.deerflow.dev/thread-id", "sandbox.deerflow.dev/created-at",
			"sandbox.deerflow.dev/last-activity", "sandbox.deerflow.dev/idle-timeout-seconds", "sandbox.deerflow.dev/max-lifetime-seconds",
			"sandbox.deerflow.dev/expires-at"} {
			delete(pod.Annotations, k)
		}
		pod.Spec.ActiveDeadlineSeconds = nil
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels, Annotations: pod.Annotations}, Spec: pod.Spec}
	}
	hash := regexp.MustCompile(`^[0-9a-f]{16}$`)
	tests := []struct {
		name string
		spec func(*api.Spec)
		want corev1.PodTemplateSpec
	}{{
		name: "DeerFlow's Pod, unnamed",
		want: wantTemplate(wantPod(hostVolumes(), hostMounts(), nil)),
	}, {
		name: "another id and creation time: the same template, the same hash",
		spec: func(s *api.Spec) { s.ID, s.Now = "other", s.Now.Add(time.Hour) },
		want: wantTemplate(wantPod(hostVolumes(), hostMounts(), nil)),
	}}
	hashes := map[string]bool{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, map[string]string{"SANDBOX_IMAGE": "sandbox:1"})
			s := testSpec()
			if tc.spec != nil {
				tc.spec(&s)
			}
			got := PoolPodTemplate(cfg.Objects(), s)
			h := got.Labels["sandbox.deerflow.dev/pool-hash"]
			if !hash.MatchString(h) {
				t.Fatalf("pool-hash label %q is not 16 hex digits", h)
			}
			hashes[h] = true
			delete(got.Labels, "sandbox.deerflow.dev/pool-hash")
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("PoolPodTemplate (-want +got):\n%s", diff)
			}
		})
	}
	if len(hashes) != 1 {
		t.Errorf("specs that differ only in identity hash to %d shapes, want 1", len(hashes))
	}
}

// TestControlledPodsAndCurrentPod: a ReplicaSet's Pods are the live ones
// it controls by UID (not by labels, which another ReplicaSet's Pod may
// carry); its current one is the Ready one, else the newest.
func TestControlledPodsAndCurrentPod(t *testing.T) {
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-x", UID: "rs-1"}}
	other := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-x", UID: "rs-0"}}
	now := time.Now()
	pod := func(name string, owner *appsv1.ReplicaSet, age time.Duration, ready, going bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(now.Add(-age))}}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(owner, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}
		}
		if ready {
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		if going {
			p.DeletionTimestamp = ptr.To(metav1.NewTime(now))
		}
		return p
	}
	tests := []struct {
		name        string
		pods        []corev1.Pod
		wantPods    []string
		wantCurrent string
	}{
		{name: "none", wantCurrent: ""},
		{name: "the Ready one before a newer one",
			pods:     []corev1.Pod{pod("old-ready", rs, time.Minute, true, false), pod("new", rs, time.Second, false, false)},
			wantPods: []string{"old-ready", "new"}, wantCurrent: "old-ready"},
		{name: "the newest when none is Ready",
			pods:     []corev1.Pod{pod("old", rs, time.Minute, false, false), pod("new", rs, time.Second, false, false)},
			wantPods: []string{"old", "new"}, wantCurrent: "new"},
		{name: "another ReplicaSet's, an unowned and a terminating Pod are not its",
			pods: []corev1.Pod{pod("other", other, time.Second, true, false), pod("bare", nil, time.Second, true, false),
				pod("going", rs, time.Second, true, true), pod("mine", rs, time.Minute, false, false)},
			wantPods: []string{"mine"}, wantCurrent: "mine"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mine := ControlledPods(rs, tc.pods)
			var names []string
			for _, p := range mine {
				names = append(names, p.Name)
			}
			if diff := cmp.Diff(tc.wantPods, names); diff != "" {
				t.Errorf("ControlledPods (-want +got):\n%s", diff)
			}
			current := ""
			if p := CurrentPod(mine); p != nil {
				current = p.Name
			}
			if current != tc.wantCurrent {
				t.Errorf("CurrentPod = %q, want %q", current, tc.wantCurrent)
			}
		})
	}
}
