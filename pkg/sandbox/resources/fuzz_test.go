package resources

import (
	"fmt"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzCreateRequest decodes and validates arbitrary bodies. Whatever it
// accepts must build objects that keep our safety invariants; test/e2e replays
// this corpus against the real API server to check it accepts them too.
func FuzzCreateRequest(f *testing.F) {
	for _, seed := range []string{
		`{"sandbox_id":"0123456789abcdef","thread_id":"t1","user_id":"user-1","include_legacy_skills":true,"provision_lark_cli_runtime":true,"provision_lark_cli_broker":false,"extra_mounts":[{"host_path":"/.deer-flow/users/user-1/threads/t1/acp-workspace","container_path":"/mnt/acp-workspace","read_only":true},{"host_path":"/.deer-flow/users/user-1/skills_view/custom","container_path":"/mnt/skills/custom","read_only":true}]}`,
		`{"sandbox_id":"abcd1234","thread_id":null,"user_id":"user-1","include_legacy_skills":true}`,
		`{"sandbox_id":"a","max_shell_sessions":8,"cpu":"500m","memory":"512Mi","idle_timeout_seconds":30}`,
		`{"sandbox_id":"x","extra_mounts":[{"host_path":"/.deer-flow/../etc","container_path":"/mnt/acp-workspace"}]}`,
		`{"sandbox_id":"UPPER"}`, `[]`, `{`, ``,
		`{"sandbox_id":"e1","max_shell_sessions":2,"env":{"OPENAI_API_KEY":"sk-1","A_B":"$(PATH) $$ ü","EMPTY":""}}`,
		`{"sandbox_id":"e2","env":{"T":{"valueFrom":{"secretKeyRef":{"name":"s","key":"k"}}}}}`,
		`{"sandbox_id":"e3","env":{"KUBERNETES_PORT":"1","x":"y"}}`,
	} {
		f.Add([]byte(seed))
	}
	cfg := fuzzConfig(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		// Go's fuzzer has no per-input timeout: a slow input would stall it
		// silently, so crash loudly and let it record the input.
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				panic(fmt.Sprintf("one input took over 5s: %q", body))
			}
		}()
		req, err := api.DecodeCreateRequest(body)
		if err != nil {
			if k := api.KindOf(err); k != api.KindMalformed && k != api.KindInvalid {
				t.Fatalf("decode error of kind %v: %v", k, err)
			}
			return
		}
		s, err := req.Validate(cfg, created)
		if err != nil {
			if api.KindOf(err) != api.KindInvalid || api.DetailOf(err) == "" {
				t.Fatalf("validation error without kind or detail: %v", err)
			}
			return
		}
		checkInvariants(t, cfg.HostBaseDir, s, BuildPod(cfg, s))
		svc := BuildService(cfg, s, PodOwnerRef(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: PodName(s.ID), UID: "u"}}))
		if msgs := validation.IsDNS1123Label(svc.Name); len(msgs) > 0 {
			t.Fatalf("Service name %q: %v", svc.Name, msgs)
		}
	})
}

func checkInvariants(t *testing.T, base string, s api.Spec, pod *corev1.Pod) {
	t.Helper()
	if msgs := validation.IsDNS1123Label(pod.Name); len(msgs) > 0 {
		t.Fatalf("Pod name %q: %v", pod.Name, msgs)
	}
	for k, v := range pod.Labels {
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			t.Fatalf("label %s=%q: %v", k, v, msgs)
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		if _, dup := volumes[v.Name]; dup {
			t.Fatalf("volume %s twice", v.Name)
		}
		volumes[v.Name] = v
		if hp := v.HostPath; hp != nil {
			if !path.IsAbs(hp.Path) || path.Clean(hp.Path) != hp.Path {
				t.Fatalf("host path %q is not absolute and clean", hp.Path)
			}
			if strings.HasPrefix(v.Name, "extra-") && !strings.HasPrefix(hp.Path, base+"/") {
				t.Fatalf("extra mount host path %q escapes %s", hp.Path, base)
			}
		}
	}
	for _, c := range pod.Spec.Containers {
		seen := map[string]bool{}
		for _, m := range c.VolumeMounts {
			if seen[m.MountPath] {
				t.Fatalf("container %s mounts %s twice", c.Name, m.MountPath)
			}
			seen[m.MountPath] = true
			if _, ok := volumes[m.Name]; !ok {
				t.Fatalf("mount of unknown volume %s", m.Name)
			}
			if strings.Contains(m.SubPath, "..") || path.IsAbs(m.SubPath) {
				t.Fatalf("sub-path %q escapes its volume", m.SubPath)
			}
		}
		if sc := c.SecurityContext; sc == nil || *sc.AllowPrivilegeEscalation || *sc.Privileged {
			t.Fatalf("container %s is not hardened", c.Name)
		}
		names := map[string]bool{}
		for _, e := range c.Env {
			if e.ValueFrom != nil || names[e.Name] || len(validation.IsEnvVarName(e.Name)) > 0 {
				t.Fatalf("container %s: env %s is a reference, repeated or an invalid name", c.Name, e.Name)
			}
			names[e.Name] = true
		}
	}
	for name := range s.Env {
		if api.ReservedEnv(name) != "" {
			t.Fatalf("reserved env name %s accepted", name)
		}
	}
	if *pod.Spec.ActiveDeadlineSeconds < 1 {
		t.Fatalf("activeDeadlineSeconds %d", *pod.Spec.ActiveDeadlineSeconds)
	}
}

func FuzzValidateID(f *testing.F) {
	for _, seed := range []string{"0123456789abcdef", "abcd1234", "a", "a-b", "-a", "a-", "A", "a.b", "a/b", "..", "", strings.Repeat("a", 52)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if err := api.ValidateID(id); err != nil {
			return
		}
		for _, name := range []string{PodName(id), ServiceName(id)} {
			if msgs := validation.IsDNS1123Label(name); len(msgs) > 0 {
				t.Fatalf("accepted id %q gives invalid name %q: %v", id, name, msgs)
			}
		}
		if msgs := validation.IsValidLabelValue(id); len(msgs) > 0 {
			t.Fatalf("accepted id %q is not a label value: %v", id, msgs)
		}
	})
}

// fuzzConfig turns lark images on, so the fuzzer reaches the init container
// and sidecar code too.
func fuzzConfig(f *testing.F) *config.Config {
	f.Helper()
	c, err := config.Load()
	if err != nil {
		f.Fatal(err)
	}
	c.LarkCLIInitImage, c.LarkCLIBrokerImage = "lark-init:1", "lark-broker:1"
	return c
}
