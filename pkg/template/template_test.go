package template

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// python is the kind of template the issue describes: a sidecar, an NFS
// volume, imagePullSecrets and a node selector.
func python() *corev1.PodTemplate {
	return &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "python", ResourceVersion: "7", Labels: map[string]string{keys.LabelTemplate: "true"},
			Annotations: map[string]string{keys.TemplateIdleTimeout: "30m", keys.TemplatePort: "8080"}},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"team": "data"}},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{
					{Name: "sandbox", Image: "registry.example/python-sandbox:3.12", Resources: corev1.ResourceRequirements{
						Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi"), "nvidia.com/gpu": resource.MustParse("1")}}},
					{Name: "proxy", Image: "registry.example/egress-proxy:1", Resources: corev1.ResourceRequirements{
						Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}}},
				},
				Volumes:          []corev1.Volume{{Name: "datasets", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.example", Path: "/datasets", ReadOnly: true}}}},
				ImagePullSecrets: []corev1.LocalObjectReference{{Name: "registry-creds"}},
				NodeSelector:     map[string]string{"pool": "sandboxes"},
			},
		},
	}
}

func TestFromPodTemplateAccepts(t *testing.T) {
	pt := python()
	got, err := FromPodTemplate(pt, testConfig(t).Objects())
	if err != nil {
		t.Fatal(err)
	}
	mem := resource.MustParse("2Gi")
	want := &Template{Name: "python", ResourceVersion: "7", Kind: KindPod, IdleTimeout: 30 * time.Minute, IdleAction: IdleDelete,
		PausedTimeout: 24 * time.Hour, Port: 8080, DeerFlowMounts: true, MemoryLimit: &mem, Pod: pt.Template}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// The template is a copy: editing the object later does not change it.
	pt.Template.Spec.Containers[0].Image = "other"
	if got.Pod.Spec.Containers[0].Image != "registry.example/python-sandbox:3.12" {
		t.Error("the template aliases the PodTemplate it was read from")
	}
}

func TestFromPodTemplateRefuses(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*corev1.PodTemplate)
		field  string
	}{
		{"privileged sidecar", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[1].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		}, "template.spec.containers[1].securityContext.privileged"},
		{"host network", func(p *corev1.PodTemplate) { p.Template.Spec.HostNetwork = true }, "template.spec.hostNetwork/hostPID/hostIPC"},
		{"host path", func(p *corev1.PodTemplate) {
			p.Template.Spec.Volumes = append(p.Template.Spec.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}, "template.spec.volumes[1].hostPath"},
		{"capability off the list", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}}
		}, "template.spec.containers[0].securityContext.capabilities.add"},
		{"init container escalates", func(p *corev1.PodTemplate) {
			p.Template.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "x", SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(true)}}}
		}, "template.spec.initContainers[0].securityContext.allowPrivilegeEscalation"},
		{"token", func(p *corev1.PodTemplate) { p.Template.Spec.AutomountServiceAccountToken = ptr.To(true) }, "template.spec.automountServiceAccountToken"},
		{"service account", func(p *corev1.PodTemplate) { p.Template.Spec.ServiceAccountName = "admin" }, "template.spec.serviceAccountName"},
		{"host port", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 80}}
		}, "template.spec.containers[0].ports[0].hostPort"},
		{"host users", func(p *corev1.PodTemplate) { p.Template.Spec.HostUsers = ptr.To(true) }, "template.spec.hostUsers"},
		{"root", func(p *corev1.PodTemplate) {
			p.Template.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](0)}
		}, "template.spec.securityContext.runAsUser"},
		{"unconfined", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
		}, "template.spec.containers[0].securityContext.seccompProfile"},
		{"no sandbox container", func(p *corev1.PodTemplate) { p.Template.Spec.Containers[0].Name = "main" }, "template.spec.containers"},
		{"bad kind", func(p *corev1.PodTemplate) { p.Annotations[keys.TemplateKind] = "Deployment" }, "metadata.annotations[" + keys.TemplateKind + "]"},
		{"lifetime over the maximum", func(p *corev1.PodTemplate) { p.Annotations[keys.TemplateMaxLifetime] = "480h" }, "metadata.annotations[" + keys.TemplateMaxLifetime + "]"},
		{"port the NetworkPolicy does not admit", func(p *corev1.PodTemplate) { p.Annotations[keys.TemplatePort] = "9000" }, "metadata.annotations[" + keys.TemplatePort + "]"},
		{"unknown setting", func(p *corev1.PodTemplate) { p.Annotations[keys.Prefix+"kinds"] = "Pod" }, "metadata.annotations[" + keys.Prefix + "kinds]"},
		{"pause on a bare Pod", func(p *corev1.PodTemplate) { p.Annotations[keys.TemplateIdleAction] = IdlePause }, "metadata.annotations[" + keys.TemplateIdleAction + "]"},
		{"label the backend's ingress selects", func(p *corev1.PodTemplate) {
			p.Template.Labels["app.kubernetes.io/name"] = "deer-flow-backend"
		}, "template.metadata.labels[app.kubernetes.io/name]"},
		{"label of the sandbox identity", func(p *corev1.PodTemplate) { p.Template.Labels["sandbox-id"] = "other" }, "template.metadata.labels[sandbox-id]"},
		{"apparmor unconfined", func(p *corev1.PodTemplate) {
			p.Template.Annotations = map[string]string{"container.apparmor.security.beta.kubernetes.io/sandbox": "unconfined"}
		}, "template.metadata.annotations[container.apparmor.security.beta.kubernetes.io/sandbox]"},
		{"projected token", func(p *corev1.PodTemplate) {
			p.Template.Spec.Volumes = append(p.Template.Spec.Volumes, corev1.Volume{Name: "tok", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "t"}}}}}})
		}, "template.spec.volumes[1].projected.sources[0]"},
		{"gitRepo volume", func(p *corev1.PodTemplate) {
			p.Template.Spec.Volumes = append(p.Template.Spec.Volumes, corev1.Volume{Name: "g", VolumeSource: corev1.VolumeSource{GitRepo: &corev1.GitRepoVolumeSource{Repository: "x"}}})
		}, "template.spec.volumes[1].gitRepo"},
		{"volume name the provisioner uses", func(p *corev1.PodTemplate) { p.Template.Spec.Volumes[0].Name = "host-user" }, "template.spec.volumes[0].name"},
		{"mount over DeerFlow's data", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[1].VolumeMounts = []corev1.VolumeMount{{Name: "datasets", MountPath: "/mnt/user-data/x"}}
		}, "template.spec.containers[1].volumeMounts[0].mountPath"},
		{"field the provisioner controls", func(p *corev1.PodTemplate) { p.Template.Spec.ActiveDeadlineSeconds = ptr.To[int64](1) }, "template.spec.activeDeadlineSeconds"},
		{"dns to another resolver", func(p *corev1.PodTemplate) { p.Template.Spec.DNSPolicy = corev1.DNSDefault }, "template.spec.dnsPolicy"},
		{"a runtime class where SANDBOX_RUNTIME_CLASS names none", func(p *corev1.PodTemplate) { p.Template.Spec.RuntimeClassName = ptr.To("kata") }, "template.spec.runtimeClassName"},
		{"probe sent to another host", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Host: "169.254.169.254"}}}
		}, "template.spec.containers[0].startupProbe"},
		{"lifecycle hook", func(p *corev1.PodTemplate) { p.Template.Spec.Containers[1].Lifecycle = &corev1.Lifecycle{} }, "template.spec.containers[1].lifecycle"},
		{"memory over the bound", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("64Gi")
		}, "template.spec.containers[0].resources.limits.memory"},
		{"secret volume", func(p *corev1.PodTemplate) {
			p.Template.Spec.Volumes = append(p.Template.Spec.Volumes, corev1.Volume{Name: "keys", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sandbox-provisioner"}}})
		}, "template.spec.volumes[1].secret"},
		{"projected secret", func(p *corev1.PodTemplate) {
			p.Template.Spec.Volumes = append(p.Template.Spec.Volumes, corev1.Volume{Name: "keys", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "c"}}},
					{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "sandbox-provisioner"}}}}}}})
		}, "template.spec.volumes[1].projected.sources[1].secret"},
		{"envFrom a Secret", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "sandbox-provisioner"}}}}
		}, "template.spec.containers[0].envFrom"},
		{"envFrom a ConfigMap", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[1].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "c"}}}}
		}, "template.spec.containers[1].envFrom"},
		{"env from a Secret key", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[1].Env = []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "sandbox-provisioner"}, Key: "api-key"}}}}
		}, "template.spec.containers[1].env[1].valueFrom.secretKeyRef"},
		{"sidecar without a memory limit", func(p *corev1.PodTemplate) {
			delete(p.Template.Spec.Containers[1].Resources.Limits, corev1.ResourceMemory)
		}, "template.spec.containers[1].resources.limits.memory"},
		{"sidecar over the cpu maximum", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[1].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("5")
		}, "template.spec.containers[1].resources.limits.cpu"},
		{"sidecars over the memory maximum together", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[1].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("5Gi")
			c := *p.Template.Spec.Containers[1].DeepCopy()
			c.Name = "proxy2"
			p.Template.Spec.Containers = append(p.Template.Spec.Containers, c)
		}, "template.spec.containers[2].resources.limits.memory"},
		{"init container without limits", func(p *corev1.PodTemplate) {
			p.Template.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "x"}}
		}, "template.spec.initContainers[0].resources.limits.cpu"},
		{"priority class off the list", func(p *corev1.PodTemplate) { p.Template.Spec.PriorityClassName = "system-node-critical" }, "template.spec.priorityClassName"},
		{"toleration off the list", func(p *corev1.PodTemplate) {
			p.Template.Spec.Tolerations = []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		}, "template.spec.tolerations[0]"},
		{"toleration of every taint", func(p *corev1.PodTemplate) {
			p.Template.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		}, "template.spec.tolerations[0]"},
		{"kata runtime annotation", func(p *corev1.PodTemplate) {
			p.Template.Annotations = map[string]string{"io.katacontainers.config.hypervisor.kernel_params": "init=/bin/sh"}
		}, "template.metadata.annotations[io.katacontainers.config.hypervisor.kernel_params]"},
		{"bookkeeping annotation", func(p *corev1.PodTemplate) {
			p.Template.Annotations = map[string]string{"sandbox.deerflow.dev/expires-at": "2999-01-01T00:00:00Z"}
		}, "template.metadata.annotations[sandbox.deerflow.dev/expires-at]"},
		{"cpu request", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
		}, "template.spec.containers[0].resources.requests.cpu"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pt := python()
			tt.mutate(pt)
			_, err := FromPodTemplate(pt, testConfig(t).Objects())
			var te *Error
			if !errors.As(err, &te) {
				t.Fatalf("error %v, want a template error", err)
			}
			if diff := cmp.Diff(Error{Template: "python", Field: tt.field}, Error{Template: te.Template, Field: te.Field}); diff != "" {
				t.Errorf("(-want +got):\n%s\n(%v)", diff, err)
			}
		})
	}
}

// TestFromPodTemplateAllowLists: what the operator allow-lists (and nothing
// wider) a template may use: tolerations, priority classes, annotations.
func TestFromPodTemplateAllowLists(t *testing.T) {
	t.Setenv("SANDBOX_TOLERATIONS", "sandboxes:NoSchedule")
	t.Setenv("SANDBOX_TEMPLATE_TOLERATIONS", "nvidia.com/gpu:NoSchedule,pool=python:NoExecute")
	t.Setenv("SANDBOX_TEMPLATE_PRIORITY_CLASSES", "sandbox-low")
	t.Setenv("SANDBOX_TEMPLATE_ANNOTATIONS", "example.com/*,kubectl.kubernetes.io/default-container")
	cfg := testConfig(t)
	tol := func(key string, op corev1.TolerationOperator, value string, effect corev1.TaintEffect) corev1.Toleration {
		return corev1.Toleration{Key: key, Operator: op, Value: value, Effect: effect}
	}
	tests := []struct {
		name   string
		mutate func(*corev1.PodTemplate)
		ok     bool
	}{
		{"operator's toleration", func(p *corev1.PodTemplate) {
			p.Template.Spec.Tolerations = []corev1.Toleration{tol("sandboxes", corev1.TolerationOpExists, "", corev1.TaintEffectNoSchedule)}
		}, true},
		{"template toleration, narrowed to a value", func(p *corev1.PodTemplate) {
			p.Template.Spec.Tolerations = []corev1.Toleration{tol("nvidia.com/gpu", corev1.TolerationOpEqual, "a100", corev1.TaintEffectNoSchedule)}
		}, true},
		{"the value listed", func(p *corev1.PodTemplate) {
			p.Template.Spec.Tolerations = []corev1.Toleration{tol("pool", "", "python", corev1.TaintEffectNoExecute)}
		}, true},
		{"another value", func(p *corev1.PodTemplate) {
			p.Template.Spec.Tolerations = []corev1.Toleration{tol("pool", corev1.TolerationOpEqual, "gpu", corev1.TaintEffectNoExecute)}
		}, false},
		{"any value where one is listed", func(p *corev1.PodTemplate) {
			p.Template.Spec.Tolerations = []corev1.Toleration{tol("pool", corev1.TolerationOpExists, "", corev1.TaintEffectNoExecute)}
		}, false},
		{"another effect", func(p *corev1.PodTemplate) {
			p.Template.Spec.Tolerations = []corev1.Toleration{tol("nvidia.com/gpu", corev1.TolerationOpExists, "", corev1.TaintEffectNoExecute)}
		}, false},
		{"every effect", func(p *corev1.PodTemplate) {
			p.Template.Spec.Tolerations = []corev1.Toleration{tol("nvidia.com/gpu", corev1.TolerationOpExists, "", "")}
		}, false},
		{"listed priority class", func(p *corev1.PodTemplate) { p.Template.Spec.PriorityClassName = "sandbox-low" }, true},
		{"other priority class", func(p *corev1.PodTemplate) { p.Template.Spec.PriorityClassName = "sandbox-high" }, false},
		{"annotation under a listed prefix", func(p *corev1.PodTemplate) { p.Template.Annotations = map[string]string{"example.com/team": "data"} }, true},
		{"listed annotation", func(p *corev1.PodTemplate) {
			p.Template.Annotations = map[string]string{"kubectl.kubernetes.io/default-container": "sandbox"}
		}, true},
		{"annotation beside the list", func(p *corev1.PodTemplate) {
			p.Template.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": "now"}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pt := python()
			tt.mutate(pt)
			_, err := FromPodTemplate(pt, cfg.Objects())
			if (err == nil) != tt.ok {
				t.Errorf("FromPodTemplate: %v, want accepted %v", err, tt.ok)
			}
		})
	}
}

// TestEnvdSetting: sandbox.deerflow.dev/envd puts the agent into the
// template's sandboxes, when the operator has set its image.
func TestEnvdSetting(t *testing.T) {
	tests := []struct {
		name, value, image string
		want               bool
		refused            string // in the error; "" for none
	}{
		{"unset", "", "registry.example/envd:1", false, ""},
		{"on", "true", "registry.example/envd:1", true, ""},
		{"off", "false", "", false, ""},
		{"not a bool", "yes", "registry.example/envd:1", false, `"yes": want true or false`},
		{"on without the agent's image", "true", "", false, "SANDBOX_ENVD_IMAGE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("SANDBOX_ENVD_IMAGE", tt.image)
			pt := python()
			if tt.value != "" {
				pt.Annotations[keys.TemplateEnvd] = tt.value
			}
			got, err := FromPodTemplate(pt, testConfig(t).Objects())
			if tt.refused != "" {
				var te *Error
				if !errors.As(err, &te) || te.Field != "metadata.annotations["+keys.TemplateEnvd+"]" || !strings.Contains(te.Reason, tt.refused) {
					t.Fatalf("error %v; want one on %s saying %q", err, keys.TemplateEnvd, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Envd != tt.want || Summarize(got).Envd != tt.want {
				t.Errorf("Envd %v (summary %v), want %v", got.Envd, Summarize(got).Envd, tt.want)
			}
		})
	}
}

// TestAliasesSetting: sandbox.deerflow.dev/aliases gives a template other
// names for E2B's API, trimmed, in order, without repeats; a name that is
// no DNS label, or the template's own, refuses the template on that field.
func TestAliasesSetting(t *testing.T) {
	tests := []struct {
		name, value string
		want        []string
		refused     string // in the error; "" for none
	}{
		{"unset", "", nil, ""},
		{"two, trimmed, one repeated", " code-interpreter-v1, base-v2 ,code-interpreter-v1,", []string{"code-interpreter-v1", "base-v2"}, ""},
		{"no DNS label", "Code_Interpreter", nil, `"Code_Interpreter" is no template name`},
		{"its own name", "python", nil, `"python" is the template's own name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pt := python()
			if tt.value != "" {
				pt.Annotations[keys.TemplateAliases] = tt.value
			}
			got, err := FromPodTemplate(pt, testConfig(t).Objects())
			if tt.refused != "" {
				var te *Error
				if !errors.As(err, &te) || te.Field != "metadata.annotations["+keys.TemplateAliases+"]" || !strings.Contains(te.Reason, tt.refused) {
					t.Fatalf("error %v; want one on %s saying %q", err, keys.TemplateAliases, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got.Aliases); diff != "" {
				t.Errorf("aliases (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, Summarize(got).Aliases); diff != "" {
				t.Errorf("the summary's aliases (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPoolSetting(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		size        int
		err         string // in PoolError; "" for none
	}{
		{"none", nil, 0, ""},
		{"pooled", map[string]string{keys.TemplatePoolSize: "3", keys.TemplateDeerFlowMounts: "false"}, 3, ""},
		{"zero", map[string]string{keys.TemplatePoolSize: "0"}, 0, ""},
		{"at the cap", map[string]string{keys.TemplatePoolSize: "10", keys.TemplateDeerFlowMounts: "false"}, 10, ""},
		{"above the cap", map[string]string{keys.TemplatePoolSize: "11", keys.TemplateDeerFlowMounts: "false"}, 0, "11 is above the operator's cap SANDBOX_MAX_POOL_SIZE=10"},
		{"negative", map[string]string{keys.TemplatePoolSize: "-1", keys.TemplateDeerFlowMounts: "false"}, 0, `"-1": want a whole number from 0 to 10`},
		{"not a number", map[string]string{keys.TemplatePoolSize: "many", keys.TemplateDeerFlowMounts: "false"}, 0, `"many": want a whole number from 0 to 10`},
		{"per-request data", map[string]string{keys.TemplatePoolSize: "2"}, 0, "a pool on a template whose Pods need per-request data"},
		{"ReplicaSet kind", map[string]string{keys.TemplatePoolSize: "2", keys.TemplateDeerFlowMounts: "false", keys.TemplateKind: KindReplicaSet}, 0, "a pool serves templates of"},
		{"the E2B agent", map[string]string{keys.TemplatePoolSize: "2", keys.TemplateDeerFlowMounts: "false", keys.TemplateEnvd: "true"}, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("SANDBOX_ENVD_IMAGE", "registry.example/envd:1") // the E2B row needs it
			pt := python()
			for k, v := range tt.annotations {
				pt.Annotations[k] = v
			}
			got, err := FromPodTemplate(pt, testConfig(t).Objects())
			if err != nil {
				t.Fatalf("a pool setting refused the template itself: %v", err)
			}
			if got.PoolSize != tt.size {
				t.Errorf("PoolSize %d, want %d", got.PoolSize, tt.size)
			}
			if tt.err == "" && got.PoolError != "" || !strings.Contains(got.PoolError, tt.err) {
				t.Errorf("PoolError %q, want one containing %q", got.PoolError, tt.err)
			}
			if tt.err != "" && !strings.Contains(got.PoolError, "creates with this template start cold") {
				t.Errorf("PoolError %q does not say the template still serves creates", got.PoolError)
			}
		})
	}
}
