package resources

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestPoolShape pins which creates may take a pooled Pod: those whose own
// Pod would differ from it only in what a claim writes (id, owner,
// lifetimes). Anything a request adds to the Pod sends it the cold way.
func TestPoolShape(t *testing.T) {
	cfg := testConfig(t, map[string]string{"LARK_CLI_INIT_IMAGE": "lark-init:1", "LARK_CLI_BROKER_IMAGE": "lark-broker:1"})
	pt := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "warm", Labels: map[string]string{keys.LabelTemplate: "true"},
			Annotations: map[string]string{keys.TemplatePoolSize: "2", keys.TemplateDeerFlowMounts: "false"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "sandbox:1"}}}},
	}
	tmpl, err := template.FromPodTemplate(pt, cfg.Objects())
	if err != nil {
		t.Fatal(err)
	}
	pool := PoolPodTemplate(cfg.Objects(), PoolSpec(cfg.Objects(), tmpl)).Labels[keys.LabelPoolHash]
	tests := []struct {
		name     string
		req      api.CreateRequest
		poolable bool
	}{
		{"the template alone", api.CreateRequest{}, true},
		{"another user and thread", api.CreateRequest{UserID: ptr.To("alice"), ThreadID: ptr.To("t-9")}, true},
		{"own lifetimes (written by the claim)", api.CreateRequest{IdleTimeoutSeconds: ptr.To[int64](60), MaxLifetimeSeconds: ptr.To[int64](600)}, true},
		{"legacy skills, which a template without DeerFlow's mounts has none of", api.CreateRequest{IncludeLegacySkills: true}, true},
		{"max_shell_sessions", api.CreateRequest{MaxShellSessions: ptr.To(4)}, false},
		// A running Pod's env cannot change: a request with env (by
		// reference to its own Secret) is made cold.
		{"env", api.CreateRequest{Env: api.Env{"API_KEY": "sk-1"}}, false},
		{"extra mounts", api.CreateRequest{ExtraMounts: []api.ExtraMount{{HostPath: "/.deer-flow/users/default/x", ContainerPath: "/mnt/acp-workspace"}}}, false},
		{"other cpu", api.CreateRequest{CPU: "2"}, false},
		{"other memory", api.CreateRequest{Memory: "2Gi"}, false},
		{"the template's cpu, asked for", api.CreateRequest{CPU: cfg.CPULimit}, true},
		{"lark runtime", api.CreateRequest{ProvisionLarkCLIRuntime: true}, false},
		{"lark broker", api.CreateRequest{ProvisionLarkCLIBroker: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.SandboxID, tt.req.Template = "abc123", "warm"
			s, err := tt.req.Validate(cfg.Objects(), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			s = WithTemplate(cfg.Objects(), s, tmpl)
			got := PoolPodTemplate(cfg.Objects(), s).Labels[keys.LabelPoolHash] == pool
			if got != tt.poolable {
				t.Errorf("poolable = %v, want %v", got, tt.poolable)
			}
		})
	}
}

// TestE2BCreatesTakePooledPods: an E2B create differs from its template's
// pooled Pod in what a claim writes (metadata) and what the router gives
// the agent later (its token's hash), so it may take one.
func TestE2BCreatesTakePooledPods(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_ENVD_IMAGE": "envd:1"})
	pt := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "base", Labels: map[string]string{keys.LabelTemplate: "true"},
			Annotations: map[string]string{keys.TemplatePoolSize: "2", keys.TemplateDeerFlowMounts: "false", keys.TemplateEnvd: "true"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "sandbox:1"}}}},
	}
	tmpl, err := template.FromPodTemplate(pt, cfg.Objects())
	if err != nil {
		t.Fatal(err)
	}
	pooled := PoolPodTemplate(cfg.Objects(), PoolSpec(cfg.Objects(), tmpl))
	s, err := api.CreateRequest{SandboxID: "e2bsandbox", Template: "base", UserID: ptr.To("e2b-1"), ThreadID: ptr.To("e2b-1")}.Validate(cfg.Objects(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s = WithTemplate(cfg.Objects(), s, tmpl)
	s.EnvdTokenHash, s.Metadata = strings.Repeat("ab", 32), map[string]string{"run": "r1"}
	if got := PoolPodTemplate(cfg.Objects(), s).Labels[keys.LabelPoolHash]; got != pooled.Labels[keys.LabelPoolHash] {
		t.Errorf("an E2B create's shape %s is not its pool's %s", got, pooled.Labels[keys.LabelPoolHash])
	}
	for _, e := range pooled.Spec.Containers[0].Env {
		if e.Name == AgentTokenHashEnv && e.Value != "" {
			t.Errorf("a pooled Pod's agent has a token hash %q; want none (the router gives it one)", e.Value)
		}
	}
	if pooled.Labels[keys.LabelEnvd] != "true" {
		t.Errorf("a pooled E2B Pod lacks %s (the router's policy selects it once claimed)", keys.LabelEnvd)
	}
}

// TestClaimedPodIsASandbox: a claimed Pod keeps its pool name and is still
// found as its sandbox's Pod; an unclaimed one is no sandbox at all.
func TestClaimedPodIsASandbox(t *testing.T) {
	pooled := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-pool-warm-x7k2p",
		Labels: map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelPool: "warm"}}}
	if id := PodID(pooled); id != "" {
		t.Errorf("unclaimed pooled Pod is sandbox %q; want none", id)
	}
	claimed := pooled.DeepCopy()
	delete(claimed.Labels, keys.LabelPool)
	claimed.Labels[keys.LabelID], claimed.Labels[keys.LabelPooled] = "abc123", "true"
	if id := PodID(claimed); id != "abc123" {
		t.Errorf("claimed Pod is sandbox %q; want abc123", id)
	}
	// A Pod of another name that only says it has an id is not one.
	other := claimed.DeepCopy()
	delete(other.Labels, keys.LabelPooled)
	if id := PodID(other); id != "" {
		t.Errorf("a Pod named %s labelled with an id is sandbox %q; want none", other.Name, id)
	}
}
