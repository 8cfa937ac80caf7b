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
		// One extra mount on each kind of root: the requester's thread, its
		// user tree, and a shared directory under the base.
		`{"sandbox_id":"m1","thread_id":"t1","user_id":"u1","extra_mounts":[{"host_path":"/.deer-flow/threads/t1/acp-workspace","container_path":"/mnt/acp-workspace","read_only":false},{"host_path":"/.deer-flow/users/u1/lark/config","container_path":"/mnt/integrations/lark-cli/config","read_only":false},{"host_path":"/.deer-flow/shared-data/sets","container_path":"/mnt/integrations/lark-cli/data","read_only":false}]}`,
		`{"sandbox_id":"m2","thread_id":"t2","user_id":"u2","provision_lark_cli_broker":true,"extra_mounts":[{"host_path":"/.deer-flow/users/u2/threads/t2/lark","container_path":"/mnt/integrations/lark-cli/config","read_only":false}]}`,
	} {
		f.Add([]byte(seed))
	}
	cfg, pvc := fuzzConfig(f), fuzzPVCConfig(f)
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
		s, err := req.Validate(cfg.Objects(), created)
		if err != nil {
			if api.KindOf(err) != api.KindInvalid || api.DetailOf(err) == "" {
				t.Fatalf("validation error without kind or detail: %v", err)
			}
			return
		}
		checkInvariants(t, s, BuildPod(cfg.Objects(), s))
		if len(s.Env) > 0 {
			secret := EnvSecret(cfg.Objects(), s, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: ServiceName(s.ID), UID: "u"}})
			if msgs := validation.IsDNS1123Subdomain(secret.Name); len(msgs) > 0 {
				t.Fatalf("env Secret name %q: %v", secret.Name, msgs)
			}
			for k := range secret.Data {
				if msgs := validation.IsConfigMapKey(k); len(msgs) > 0 {
					t.Fatalf("env Secret key %q: %v", k, msgs)
				}
			}
		}
		checkMounts(t, cfg, s, BuildPod(cfg.Objects(), s))
		checkMounts(t, pvc, s, BuildPod(pvc.Objects(), s))
		svc := BuildService(cfg.Objects(), s, PodOwnerRef(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: PodName(s.ID), UID: "u"}}))
		if msgs := validation.IsDNS1123Label(svc.Name); len(msgs) > 0 {
			t.Fatalf("Service name %q: %v", svc.Name, msgs)
		}
	})
}

func checkInvariants(t *testing.T, s api.Spec, pod *corev1.Pod) {
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
			if names[e.Name] || len(validation.IsEnvVarName(e.Name)) > 0 {
				t.Fatalf("container %s: env %s is repeated or an invalid name", c.Name, e.Name)
			}
			names[e.Name] = true
			// A request's variable is a reference to its own key in the
			// sandbox's own env Secret, never a value; nothing else is a
			// reference.
			_, requested := s.Env[e.Name]
			own := e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == EnvSecretName(s.ID) &&
				e.ValueFrom.SecretKeyRef.Key == e.Name && e.Value == "" && e.ValueFrom.FieldRef == nil &&
				e.ValueFrom.ResourceFieldRef == nil && e.ValueFrom.ConfigMapKeyRef == nil && e.ValueFrom.FileKeyRef == nil
			if requested && c.Name == containerName && !own || !(requested && c.Name == containerName) && e.ValueFrom != nil {
				t.Fatalf("container %s: env %s is %+v; want a request's variable by reference to %s and nothing else by reference", c.Name, e.Name, e, EnvSecretName(s.ID))
			}
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

// checkMounts checks where every mount of pod leads on the node, whatever
// its volume is named: each hostPath volume is absolute, clean and strictly
// under the base; a per-user or per-thread one is exactly the requester's
// own tree (<base>/users/<user>, THREADS_HOST_PATH/<thread>), and any other
// is a shared root one level under the base, which neither is nor holds
// <base>/users or THREADS_HOST_PATH, and is mounted read-only; a subPath,
// joined to its volume, stays in that volume. On DeerFlow's user-data claim
// (PVC mode) the same holds of the subPaths: under deer-flow/, the
// requester's own user and thread trees writable, nothing else.
func checkMounts(t *testing.T, cfg *config.Config, s api.Spec, pod *corev1.Pod) {
	t.Helper()
	base, threads := cfg.HostBaseDir, cfg.ThreadsHostPath
	users := path.Join(base, "users")
	under := func(p, dir string) bool { return strings.HasPrefix(p, dir+"/") }
	// owner says whose tree a path under the base is: "user" or "thread"
	// with the owning id, or "" for a shared directory.
	owner := func(p string) (kind, id string) {
		if rest, ok := strings.CutPrefix(p, threads+"/"); ok {
			id, _, _ = strings.Cut(rest, "/")
			return "thread", id
		}
		if rest, ok := strings.CutPrefix(p, users+"/"); ok {
			seg := strings.Split(rest, "/")
			if len(seg) >= 3 && seg[1] == "threads" && seg[2] != s.ThreadID {
				return "thread", seg[2]
			}
			return "user", seg[0]
		}
		return "", ""
	}
	mine := func(kind, id string) bool {
		return (kind == "user" && id == s.UserID) || (kind == "thread" && id == s.ThreadID)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
		hp := v.HostPath
		if hp == nil {
			continue
		}
		p := hp.Path
		switch {
		case !path.IsAbs(p) || path.Clean(p) != p || !under(p, base):
			t.Fatalf("hostPath volume %s at %q is not an absolute, clean path under %s", v.Name, p, base)
		case under(p, threads) && p != path.Join(threads, s.ThreadID):
			t.Fatalf("hostPath volume %s at %q is not the requester's thread root %s", v.Name, p, path.Join(threads, s.ThreadID))
		case under(p, users) && p != path.Join(users, s.UserID):
			t.Fatalf("hostPath volume %s at %q is not the requester's user root %s", v.Name, p, path.Join(users, s.UserID))
		case !under(p, threads) && !under(p, users) && (path.Dir(p) != base || p == users || p == threads || under(threads, p)):
			t.Fatalf("hostPath volume %s at %q is no shared root one level under %s beside users and threads", v.Name, p, base)
		}
	}
	all := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, c := range all {
		for _, m := range c.VolumeMounts {
			v := volumes[m.Name]
			switch {
			case v.HostPath != nil:
				full := path.Join(v.HostPath.Path, m.SubPath)
				if full != v.HostPath.Path && !under(full, v.HostPath.Path) {
					t.Fatalf("container %s: %s's subPath %q leaves its volume %q", c.Name, m.MountPath, m.SubPath, v.HostPath.Path)
				}
				if kind, _ := owner(v.HostPath.Path); kind == "" && !m.ReadOnly {
					t.Fatalf("container %s: %s mounts the shared %q writable", c.Name, m.MountPath, full)
				}
			case v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == cfg.UserdataPVCName:
				rel, ok := strings.CutPrefix(path.Clean(m.SubPath), claimPrefix+"/")
				if !ok || path.Clean(m.SubPath) != m.SubPath {
					t.Fatalf("container %s: %s's subPath %q on the user-data claim is not a clean path under %s/", c.Name, m.MountPath, m.SubPath, claimPrefix)
				}
				hp := path.Join(base, rel)
				switch kind, id := owner(hp); {
				case kind != "" && !mine(kind, id):
					t.Fatalf("container %s: %s's subPath %q on the user-data claim is another %s's", c.Name, m.MountPath, m.SubPath, kind)
				case kind == "" && (!m.ReadOnly || hp == users || hp == threads || under(threads, hp)):
					t.Fatalf("container %s: %s's subPath %q on the user-data claim is shared and writable, or holds every tenant's", c.Name, m.MountPath, m.SubPath)
				}
			}
		}
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

// fuzzPVCConfig is fuzzConfig in PVC mode: DeerFlow's user-data claim.
func fuzzPVCConfig(f *testing.F) *config.Config {
	f.Helper()
	c := fuzzConfig(f)
	c.UserdataPVCName = "deer-flow-user-data"
	return c
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
