package resources

import (
	"maps"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/api/apitest"
	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
)

var created = apitest.Created

// testConfig is the configuration the environment gives, with env set first.
var testConfig = configtest.Load

func testSpec() api.Spec { return apitest.Spec() }

func wantLabels() map[string]string {
	return map[string]string{
		"app": "deer-flow-sandbox", "sandbox-id": "0123456789abcdef",
		"app.kubernetes.io/name": "deer-flow", "app.kubernetes.io/component": "sandbox",
		"app.kubernetes.io/managed-by": "deerflow-sandbox-provisioner",
		"sandbox.deerflow.dev/user":    "user-1", "sandbox.deerflow.dev/thread": "t1",
	}
}

// wantPodLabels are a bare Pod's: the sandbox's, and its own name, which
// its Service selects (ServicePin).
func wantPodLabels() map[string]string {
	l := wantLabels()
	l["sandbox.deerflow.dev/pod"] = "sandbox-0123456789abcdef"
	return l
}

func wantAnnotations() map[string]string {
	return map[string]string{
		"sandbox.deerflow.dev/user-id": "user-1", "sandbox.deerflow.dev/thread-id": "t1",
		"sandbox.deerflow.dev/created-at":           "2026-01-02T03:04:05Z",
		"sandbox.deerflow.dev/last-activity":        "2026-01-02T03:04:05Z",
		"sandbox.deerflow.dev/idle-timeout-seconds": "3600",
		"sandbox.deerflow.dev/max-lifetime-seconds": "86400",
		"sandbox.deerflow.dev/expires-at":           "2026-01-02T04:04:05Z",
	}
}

// Host-path mode roots each mount at the narrowest directory that holds it
// (see hostRootOf): the user's tree, the thread's directory, or the shared
// directory under the base; the rest is a subPath.
var (
	userRoot = corev1.Volume{Name: "host-user", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
		Path: "/.deer-flow/users/user-1", Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}}
	threadRoot = corev1.Volume{Name: "host-thread", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
		Path: "/.deer-flow/threads/t1", Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}}
	// The name carries the first 8 hex digits of sha256("/.deer-flow/skills_view").
	skillsViewRoot = corev1.Volume{Name: "host-shared-skills-view-fa5d0ede", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
		Path: "/.deer-flow/skills_view", Type: ptr.To(corev1.HostPathDirectory)}}}
)

// hostVolumes are host-path mode's volumes for DeerFlow's built-in mounts.
func hostVolumes() []corev1.Volume { return []corev1.Volume{skillsViewRoot, userRoot, threadRoot} }

// hostMounts are DeerFlow's built-in mounts in host-path mode: all three
// skills directories, read-only, and the thread's user data.
func hostMounts() []corev1.VolumeMount {
	return []corev1.VolumeMount{
		{Name: skillsViewRoot.Name, MountPath: "/mnt/skills/public", SubPath: "public", ReadOnly: true},
		{Name: "host-user", MountPath: "/mnt/skills/custom", SubPath: "skills_view/custom", ReadOnly: true},
		{Name: "host-user", MountPath: "/mnt/skills/legacy", SubPath: "skills_view/legacy", ReadOnly: true},
		{Name: "host-thread", MountPath: "/mnt/user-data", SubPath: "user-data"},
	}
}

// wantPod is DeerFlow's Pod with our hardening, for the given volumes.
func wantPod(volumes []corev1.Volume, mounts []corev1.VolumeMount, env []corev1.EnvVar) *corev1.Pod {
	// No initial delays: the startup probe every second, with five
	// minutes of failures allowed, gates the other two.
	probe := func(period, failures, delay int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/v1/sandbox", Port: intstr.FromInt32(8080), Scheme: corev1.URISchemeHTTP}},
			InitialDelaySeconds: delay, PeriodSeconds: period, TimeoutSeconds: 3, FailureThreshold: failures, SuccessThreshold: 1,
		}
	}
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox-0123456789abcdef", Namespace: "deer-flow", Labels: wantPodLabels(), Annotations: wantAnnotations()},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "sandbox", Image: "sandbox:1", ImagePullPolicy: corev1.PullIfNotPresent,
				Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Env:            env,
				ReadinessProbe: probe(1, 3, 0), LivenessProbe: probe(10, 3, 300),
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("1Gi"), corev1.ResourceEphemeralStorage: resource.MustParse("500Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi"), corev1.ResourceEphemeralStorage: resource.MustParse("500Mi")},
				},
				VolumeMounts: mounts,
				SecurityContext: &corev1.SecurityContext{
					Privileged: ptr.To(false), AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"},
						Add: []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID"}},
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
			Volumes:                       volumes,
			RestartPolicy:                 corev1.RestartPolicyAlways,
			ActiveDeadlineSeconds:         ptr.To(int64(86400)),
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(10)),
			HostUsers:                     ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				RunAsNonRoot:   ptr.To(true), RunAsUser: ptr.To(int64(1000)), RunAsGroup: ptr.To(int64(1000)),
			},
		},
	}
}

func TestBuildPod(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		spec func(*api.Spec)
		want *corev1.Pod
	}{{
		name: "host-path mode",
		want: wantPod(hostVolumes(), hostMounts(), nil),
	}, {
		name: "host-path mode, legacy skills, extra mounts replacing the built-in custom skills",
		spec: func(s *api.Spec) {
			s.IncludeLegacySkills = true
			s.MaxShellSessions = 4
			s.Mounts = []api.Mount{
				{HostPath: "/.deer-flow/users/user-1/threads/t1/acp-workspace", ContainerPath: "/mnt/acp-workspace", ReadOnly: true},
				{HostPath: "/.deer-flow/users/user-1/skills_view/custom", ContainerPath: "/mnt/skills/custom", ReadOnly: true},
			}
		},
		want: func() *corev1.Pod {
			p := wantPod(hostVolumes(), append(hostMounts(),
				corev1.VolumeMount{Name: "host-user", MountPath: "/mnt/acp-workspace", SubPath: "threads/t1/acp-workspace", ReadOnly: true},
			), []corev1.EnvVar{{Name: "MAX_SHELL_SESSIONS", Value: "4"}})
			p.Annotations["sandbox.deerflow.dev/max-shell-sessions"] = "4"
			return p
		}(),
	}, {
		name: "a shared path asked read-write is mounted read-only: no sandbox may poison every user's skills",
		spec: func(s *api.Spec) {
			s.Mounts = []api.Mount{
				{HostPath: "/.deer-flow/skills_view/public/evil", ContainerPath: "/mnt/skills/integrations", ReadOnly: false},
				{HostPath: "/.deer-flow/users/user-1/threads/t1/acp-workspace", ContainerPath: "/mnt/acp-workspace", ReadOnly: false},
			}
		},
		want: wantPod(hostVolumes(), append(hostMounts(),
			corev1.VolumeMount{Name: skillsViewRoot.Name, MountPath: "/mnt/skills/integrations", SubPath: "public/evil", ReadOnly: true},
			corev1.VolumeMount{Name: "host-user", MountPath: "/mnt/acp-workspace", SubPath: "threads/t1/acp-workspace"},
		), nil),
	}, {
		name: "request env after MAX_SHELL_SESSIONS, in name order, each by reference to the sandbox's env Secret, no value",
		spec: func(s *api.Spec) {
			s.MaxShellSessions = 2
			s.Env = map[string]string{"ZED": "last", "API_KEY": "sk-$(HOME)$$x", "EMPTY": ""}
		},
		want: func() *corev1.Pod {
			ref := func(name string) corev1.EnvVar {
				return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "sandbox-0123456789abcdef-env"}, Key: name}}}
			}
			p := wantPod(hostVolumes(), hostMounts(), []corev1.EnvVar{
				{Name: "MAX_SHELL_SESSIONS", Value: "2"},
				ref("API_KEY"),
				ref("EMPTY"),
				ref("ZED"),
			})
			p.Annotations["sandbox.deerflow.dev/max-shell-sessions"] = "2"
			return p
		}(),
	}, {
		name: "PVC mode",
		env:  map[string]string{"SKILLS_PVC_NAME": "skills", "USERDATA_PVC_NAME": "home", "SKILLS_PVC_SUBPATH_TEMPLATE": "skills/{user_id}/{thread_id}"},
		spec: func(s *api.Spec) {
			s.Mounts = []api.Mount{{HostPath: "/.deer-flow/users/user-1/threads/t1/acp-workspace", ContainerPath: "/mnt/acp-workspace", ReadOnly: true}}
		},
		want: wantPod(
			[]corev1.Volume{
				{Name: "skills", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "skills", ReadOnly: true}}},
				{Name: "user-data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "home"}}},
			},
			[]corev1.VolumeMount{
				{Name: "skills", MountPath: "/mnt/skills", SubPath: "skills/user-1/t1", ReadOnly: true},
				{Name: "user-data", MountPath: "/mnt/user-data", SubPath: "deer-flow/users/user-1/threads/t1/user-data"},
				{Name: "user-data", MountPath: "/mnt/acp-workspace", SubPath: "deer-flow/users/user-1/threads/t1/acp-workspace", ReadOnly: true},
			}, nil),
	}, {
		name: "runtime class, node selector, tolerations, other user, read-only root",
		env: map[string]string{"SANDBOX_RUNTIME_CLASS": "gvisor", "SANDBOX_NODE_SELECTOR": "pool:sandbox",
			"SANDBOX_TOLERATIONS": "sandbox=true:NoSchedule", "SANDBOX_RUN_AS_USER": "2000", "SANDBOX_READ_ONLY_ROOT_FS": "true",
			"SANDBOX_CAPABILITIES_ADD": ""},
		want: func() *corev1.Pod {
			p := wantPod(
				append(hostVolumes(), corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}),
				append(hostMounts(), corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"}), nil)
			p.Spec.RuntimeClassName = ptr.To("gvisor")
			p.Spec.NodeSelector = map[string]string{"pool": "sandbox"}
			p.Spec.Tolerations = []corev1.Toleration{{Key: "sandbox", Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
			p.Spec.SecurityContext.RunAsUser = ptr.To(int64(2000))
			p.Spec.SecurityContext.RunAsGroup = ptr.To(int64(2000))
			sc := p.Spec.Containers[0].SecurityContext
			sc.ReadOnlyRootFilesystem = ptr.To(true)
			sc.Capabilities.Add = nil
			return p
		}(),
	}, {
		name: "the image's user, host users, memory request below the limit",
		env: map[string]string{"SANDBOX_RUN_AS_NON_ROOT": "false", "SANDBOX_RUN_AS_USER": "-1", "SANDBOX_USER_NAMESPACE": "false",
			"SANDBOX_MEMORY_REQUEST_EQUALS_LIMIT": "false"},
		want: func() *corev1.Pod {
			p := wantPod(hostVolumes(), hostMounts(), nil)
			p.Spec.HostUsers = nil
			p.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
			p.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory] = resource.MustParse("256Mi")
			return p
		}(),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"SANDBOX_IMAGE": "sandbox:1"}
			for k, v := range tc.env {
				env[k] = v
			}
			cfg := testConfig(t, env)
			s := testSpec()
			if tc.spec != nil {
				tc.spec(&s)
			}
			if diff := cmp.Diff(tc.want, BuildPod(cfg.Objects(), s)); diff != "" {
				t.Errorf("BuildPod (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildService(t *testing.T) {
	podOwner := PodOwnerRef(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-0123456789abcdef", UID: "uid-1"}})
	if diff := cmp.Diff(metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "sandbox-0123456789abcdef", UID: "uid-1", BlockOwnerDeletion: ptr.To(false)}, podOwner); diff != "" {
		t.Errorf("PodOwnerRef (-want +got):\n%s", diff)
	}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-0123456789abcdef", UID: "uid-2"}}
	rsOwner := ReplicaSetOwnerRef(rs)
	want := func(typ corev1.ServiceType, owner metav1.OwnerReference, extra map[string]string) *corev1.Service {
		l := wantLabels()
		maps.Copy(l, extra)
		return &corev1.Service{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Name: "sandbox-0123456789abcdef-svc", Namespace: "deer-flow", Labels: l, OwnerReferences: []metav1.OwnerReference{owner}},
			Spec: corev1.ServiceSpec{
				Type:     typ,
				Selector: map[string]string{"sandbox-id": "0123456789abcdef"},
				Ports:    []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
			},
		}
	}
	tests := []struct {
		name  string
		env   map[string]string
		owner metav1.OwnerReference
		want  *corev1.Service
	}{{
		name:  "NodePort",
		owner: podOwner,
		want:  want(corev1.ServiceTypeNodePort, podOwner, nil),
	}, {
		name:  "ClusterIP",
		env:   map[string]string{"SANDBOX_SERVICE_TYPE": "ClusterIP"},
		owner: podOwner,
		want:  want(corev1.ServiceTypeClusterIP, podOwner, nil),
	}, {
		// No virtual IP: the API server allocates none (BenchmarkScale).
		// The name lists the Pod before Ready: cluster DNS caches a denial.
		name:  "Headless",
		env:   map[string]string{"SANDBOX_SERVICE_TYPE": "Headless"},
		owner: podOwner,
		want: func() *corev1.Service {
			s := want(corev1.ServiceTypeClusterIP, podOwner, nil)
			s.Spec.ClusterIP = corev1.ClusterIPNone
			s.Spec.PublishNotReadyAddresses = true
			return s
		}(),
	}, {
		// The quota's quick count finds ReplicaSet sandboxes by this label.
		name:  "owned by a ReplicaSet",
		owner: rsOwner,
		want:  want(corev1.ServiceTypeNodePort, rsOwner, map[string]string{"sandbox.deerflow.dev/workload": "replicaset"}),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, tc.env)
			if diff := cmp.Diff(tc.want, BuildService(cfg.Objects(), testSpec(), tc.owner)); diff != "" {
				t.Errorf("BuildService (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildNetworkPolicy(t *testing.T) {
	dns := networkingv1.NetworkPolicyEgressRule{
		To: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
		}},
		Ports: []networkingv1.NetworkPolicyPort{
			{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))},
			{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(53))},
		},
	}
	internet := networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{
		{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{
			"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10",
			"169.254.169.254/32", "169.254.170.2/32", "100.100.100.200/32", "168.63.129.16/32"}}},
		{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: []string{"fc00::/7", "fe80::/10", "fd00:ec2::254/128"}}},
	}, Ports: []networkingv1.NetworkPolicyPort{ // every port but DNS's
		{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(1)), EndPort: ptr.To[int32](52)},
		{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(54)), EndPort: ptr.To[int32](65535)},
		{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(1)), EndPort: ptr.To[int32](52)},
		{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(54)), EndPort: ptr.To[int32](65535)},
	}}
	// The shared policy: no rule at all, in or out, whatever the settings:
	// it admits no one, so a pooled Pod (which no principal owns) answers
	// no one, and an isolated sandbox (which no mode's policy selects)
	// reaches nothing. Each principal's own policy admits its backends,
	// each mode's policy gives its egress.
	labels := map[string]string{"app.kubernetes.io/name": "deer-flow", "app.kubernetes.io/component": "sandbox", "app.kubernetes.io/managed-by": "deerflow-sandbox-provisioner"}
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: "deer-flow", Labels: labels}
	}
	shared := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: meta("deer-flow-sandbox-isolation"),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "deer-flow-sandbox"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
	// A mode's policy selects its label, and, for the deployment's default
	// mode, sandboxes with no mode label (made before modes).
	labelled := func(mode string) metav1.LabelSelector {
		return metav1.LabelSelector{MatchLabels: map[string]string{"app": "deer-flow-sandbox", "sandbox.deerflow.dev/egress": mode}}
	}
	byDefault := func(others ...string) metav1.LabelSelector {
		return metav1.LabelSelector{MatchLabels: map[string]string{"app": "deer-flow-sandbox"},
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "sandbox.deerflow.dev/egress", Operator: metav1.LabelSelectorOpNotIn, Values: others}}}
	}
	modePolicy := func(name string, sel metav1.LabelSelector, egress ...networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{
			TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}, ObjectMeta: meta(name),
			Spec: networkingv1.NetworkPolicySpec{PodSelector: sel, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}, Egress: egress},
		}
	}
	proxy := networkingv1.NetworkPolicyEgressRule{
		To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "sandbox-egress-proxy"}}}},
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(3128))}},
	}
	tests := []struct {
		name string
		env  map[string]string
		want []*networkingv1.NetworkPolicy
	}{{
		name: "default: open by default (DNS, internet without private or metadata ranges); allowlist to the proxy alone",
		want: []*networkingv1.NetworkPolicy{shared,
			modePolicy("deer-flow-sandbox-isolation-egress-open", byDefault("isolated", "allowlist"), dns, internet),
			modePolicy("deer-flow-sandbox-isolation-egress-allowlist", labelled("allowlist"), proxy)},
	}, {
		name: "node addresses and principals' sources stay out of the shared policies",
		env:  map[string]string{"SANDBOX_INGRESS_NODE_CIDRS": "192.168.1.10/32", "PROVISIONER_PRINCIPAL_INGRESS": "alice=cidr:203.0.113.0/24"},
		want: []*networkingv1.NetworkPolicy{shared,
			modePolicy("deer-flow-sandbox-isolation-egress-open", byDefault("isolated", "allowlist"), dns, internet),
			modePolicy("deer-flow-sandbox-isolation-egress-allowlist", labelled("allowlist"), proxy)},
	}, {
		name: "deny-all, the old name of isolated: a sandbox from before modes stays without egress",
		env:  map[string]string{"SANDBOX_EGRESS_MODE": "deny-all"},
		want: []*networkingv1.NetworkPolicy{shared,
			modePolicy("deer-flow-sandbox-isolation-egress-open", labelled("open"), dns, internet),
			modePolicy("deer-flow-sandbox-isolation-egress-allowlist", labelled("allowlist"), proxy)},
	}, {
		name: "allowlist by default, another proxy port",
		env:  map[string]string{"SANDBOX_EGRESS_MODE": "allowlist", "SANDBOX_EGRESS_PROXY_PORT": "8888"},
		want: []*networkingv1.NetworkPolicy{shared,
			modePolicy("deer-flow-sandbox-isolation-egress-open", labelled("open"), dns, internet),
			modePolicy("deer-flow-sandbox-isolation-egress-allowlist", byDefault("open", "isolated"), networkingv1.NetworkPolicyEgressRule{
				To: proxy.To, Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(8888))}}})},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, SharedPolicies(testConfig(t, tc.env).Objects())); diff != "" {
				t.Errorf("SharedPolicies (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBuildIngressPolicy: each principal's sandboxes (the Pods carrying its
// label) admit its own sources alone, on the sandbox port; the sources come
// from PROVISIONER_PRINCIPAL_INGRESS, or, without an entry, from the backend
// settings when there is one principal (as before principals had sources),
// a service account's own namespace, or nowhere (fail closed).
func TestBuildIngressPolicy(t *testing.T) {
	port := intstr.FromInt32(8080)
	backend := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "deer-flow-backend"}}}
	cidr := func(c string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: c}}
	}
	policy := func(principal string, from ...networkingv1.NetworkPolicyPeer) *networkingv1.NetworkPolicy {
		np := &networkingv1.NetworkPolicy{
			TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: "deer-flow-sandbox-isolation-" + PrincipalLabelValue(principal), Namespace: "deer-flow",
				Labels: map[string]string{"app.kubernetes.io/name": "deer-flow", "app.kubernetes.io/component": "sandbox-ingress",
					"app.kubernetes.io/managed-by": "deerflow-sandbox-provisioner", "sandbox.deerflow.dev/principal": PrincipalLabelValue(principal)},
				Annotations: map[string]string{"sandbox.deerflow.dev/principal": principal}},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "deer-flow-sandbox", "sandbox.deerflow.dev/principal": PrincipalLabelValue(principal)}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			},
		}
		if len(from) > 0 {
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: from, Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: &port}}}}
		}
		return np
	}
	twoKeys := map[string]string{"PROVISIONER_API_KEY": "0123456789abcdef0123", "PROVISIONER_API_KEYS": "alice=abcdef0123456789abcd,bob=bcdef0123456789abcde",
		"PROVISIONER_PRINCIPAL_INGRESS": "alice=pods:tenant=alice|cidr:203.0.113.0/24;bob=pods:app=bob-backend@team=b"}
	tests := []struct {
		name      string
		env       map[string]string
		principal string
		want      *networkingv1.NetworkPolicy
	}{{
		name: "one principal: the backend, as before principals had sources", principal: "default",
		want: policy("default", backend),
	}, {
		name: "one principal in NodePort mode: and the named node addresses", principal: "default",
		env:  map[string]string{"SANDBOX_INGRESS_NODE_CIDRS": "192.168.1.10/32,fd00::10/128"},
		want: policy("default", backend, cidr("192.168.1.10/32"), cidr("fd00::10/128")),
	}, {
		name: "one principal in ClusterIP mode: never node addresses", principal: "default",
		env:  map[string]string{"SANDBOX_SERVICE_TYPE": "ClusterIP", "SANDBOX_INGRESS_NODE_CIDRS": "192.168.1.10/32"},
		want: policy("default", backend),
	}, {
		name: "one principal in Headless mode: never node addresses", principal: "default",
		env:  map[string]string{"SANDBOX_SERVICE_TYPE": "Headless", "SANDBOX_INGRESS_NODE_CIDRS": "192.168.1.10/32"},
		want: policy("default", backend),
	}, {
		name: "many principals: alice's own sources", principal: "alice", env: twoKeys,
		want: policy("alice", networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "alice"}}}, cidr("203.0.113.0/24")),
	}, {
		name: "many principals: bob's backend in the namespaces he names", principal: "bob", env: twoKeys,
		want: policy("bob", networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "bob-backend"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "b"}}}),
	}, {
		name: "many principals: default keeps DeerFlow's backend", principal: "default", env: twoKeys,
		want: policy("default", backend),
	}, {
		name: "many principals: a key without sources is reached by no one", principal: "carol",
		env:  map[string]string{"PROVISIONER_API_KEYS": "alice=abcdef0123456789abcd,carol=cdef0123456789abcdef"},
		want: policy("carol"),
	}, {
		name: "many principals: a service account's backend in its own namespace", principal: "system:serviceaccount:team-c:agent",
		env: map[string]string{"PROVISIONER_API_KEYS": "alice=abcdef0123456789abcd", "AUTH_TOKEN_AUDIENCE": "sandbox-provisioner",
			"AUTH_ALLOWED_SUBJECTS": "system:serviceaccount:team-c:agent"},
		want: policy("system:serviceaccount:team-c:agent", networkingv1.NetworkPolicyPeer{
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "deer-flow-backend"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "team-c"}}}),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, tc.env)
			got := BuildIngressPolicy(cfg.Objects(), tc.principal, cfg.IngressSources(tc.principal, cfg.MultiplePrincipals()))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("BuildIngressPolicy (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBuildLegacyIngressPolicy: the sandboxes DeerFlow's provisioner made
// (no principal recorded) are "default"'s, and a pooled Pod, which records
// none until it is claimed, is never among them.
func TestBuildLegacyIngressPolicy(t *testing.T) {
	cfg := testConfig(t, nil)
	got := BuildLegacyIngressPolicy(cfg.Objects(), cfg.IngressSources("default", false))
	want := metav1.LabelSelector{MatchLabels: map[string]string{"app": "deer-flow-sandbox"}, MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "sandbox.deerflow.dev/principal", Operator: metav1.LabelSelectorOpDoesNotExist},
		{Key: "sandbox.deerflow.dev/pool", Operator: metav1.LabelSelectorOpDoesNotExist},
	}}
	if diff := cmp.Diff(want, got.Spec.PodSelector); diff != "" {
		t.Errorf("the legacy policy's podSelector (-want +got):\n%s", diff)
	}
	if got.Name != "deer-flow-sandbox-isolation-legacy" || len(got.Spec.Ingress) != 1 || len(got.Spec.Ingress[0].From) != 1 {
		t.Errorf("the legacy policy %s admits %+v; want the backend alone", got.Name, got.Spec.Ingress)
	}
}

func TestLabelValue(t *testing.T) {
	if got := LabelValue("user-1"); got != "user-1" {
		t.Errorf("LabelValue(user-1) = %q, want it unchanged", got)
	}
	// Valid user and thread ids that are not valid label values get a
	// stable hash, distinct per input.
	seen := map[string]string{}
	for _, in := range []string{"_leading", "trailing-", "a_", "x234567890123456789012345678901234567890123456789012345678901234"} {
		got := LabelValue(in)
		if got == in || len(got) > 63 || got[:2] != "h-" {
			t.Errorf("LabelValue(%q) = %q, want a hashed label value", in, got)
		}
		if LabelValue(in) != got {
			t.Errorf("LabelValue(%q) is not stable", in)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("LabelValue(%q) collides with LabelValue(%q)", in, prev)
		}
		seen[got] = in
	}
}
