package resources

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path"
	"testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

// contractFile is our copy of DeerFlow's recorded requests; the steering
// repository's shared/contract holds the original, and when it is beside
// this checkout the test checks the copy is still the same.
const (
	contractFile   = "../../../test/e2e/testdata/deerflow-client-requests.jsonl"
	contractSource = "../../../../shared/contract/deerflow-client-requests.jsonl"
)

// recordedCreates returns the bodies of the creates DeerFlow's backend sent,
// in order: the ordinary create (thread t1, user user-1, legacy skills, the
// Lark runtime, the acp-workspace and custom-skills extra mounts), then the
// anonymous one (thread_id null).
func recordedCreates(t *testing.T) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile(contractFile)
	if err != nil {
		t.Fatal(err)
	}
	if original, err := os.ReadFile(contractSource); err == nil && !bytes.Equal(original, raw) {
		t.Fatalf("%s differs from %s: copy it again", contractFile, contractSource)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Method, Path string
			Body         map[string]any
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		if line.Method == "POST" && line.Path == "/api/sandboxes" {
			out = append(out, line.Body)
		}
	}
	if len(out) != 2 {
		t.Fatalf("%s holds %d creates, want DeerFlow's 2", contractFile, len(out))
	}
	return out
}

// sees describes what each mount of a container shows, independent of how
// the Pod names its volumes: "host <path on the node> ro|rw", "claim
// <claim> <path on the claim> ro|rw" or "emptyDir <volume> ro|rw" (an
// emptyDir is known by its volume, which is what containers share).
func sees(t *testing.T, pod *corev1.Pod, container string) map[string]string {
	t.Helper()
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	var c *corev1.Container
	for _, each := range allContainers(pod) {
		if each.Name == container {
			c = &each
		}
	}
	if c == nil {
		t.Fatalf("the Pod has no container %q", container)
	}
	out := map[string]string{}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			t.Fatalf("%s mounts volume %q, which the Pod lacks", container, m.Name)
		}
		mode := "rw"
		var what string
		switch {
		case v.HostPath != nil:
			what = "host " + path.Join(v.HostPath.Path, m.SubPath)
		case v.PersistentVolumeClaim != nil:
			what = "claim " + v.PersistentVolumeClaim.ClaimName + " " + m.SubPath
			if v.PersistentVolumeClaim.ReadOnly {
				mode = "ro"
			}
		case v.EmptyDir != nil:
			what = "emptyDir " + v.Name
		default:
			t.Fatalf("%s mounts %q, of a kind DeerFlow never uses", container, m.Name)
		}
		if m.ReadOnly {
			mode = "ro"
		}
		if _, dup := out[m.MountPath]; dup {
			t.Errorf("%s mounts %s twice; the API server refuses that Pod", container, m.MountPath)
		}
		out[m.MountPath] = what + " " + mode
	}
	return out
}

// allContainers are a Pod's containers and init containers.
func allContainers(pod *corev1.Pod) []corev1.Container {
	return append(append([]corev1.Container{}, pod.Spec.Containers...), pod.Spec.InitContainers...)
}

// TestMountsMatchDeerFlow builds the Pod for DeerFlow's recorded requests
// (and the Lark and legacy variants of them) in both of DeerFlow's modes and
// compares every container's mounts with what DeerFlow's provisioner
// (docker/provisioner/app.py: _build_volumes, _build_volume_mounts,
// _extra_mount_pvc_sub_path and the Lark helpers) mounts for the same
// request and settings. The expected tables are written from those rules.
//
// The one difference kept on purpose: DeerFlow mounts /mnt/skills/custom
// twice in host-path mode when the backend sends it as an extra mount (the
// API server then refuses the Pod); here it is mounted once, from the same
// directory.
func TestMountsMatchDeerFlow(t *testing.T) {
	creates := recordedCreates(t)
	ordinary, anonymous := creates[0], creates[1]
	with := func(body map[string]any, edit func(map[string]any)) map[string]any {
		c := map[string]any{}
		for k, v := range body {
			c[k] = v
		}
		edit(c)
		return c
	}
	// DeerFlow's backend sends these for a user with Lark configured
	// (aio_sandbox_provider._get_lark_cli_runtime_mounts).
	larkExtras := []any{
		map[string]any{"host_path": "/.deer-flow/users/user-1/integrations/lark-cli/config", "container_path": "/mnt/integrations/lark-cli/config", "read_only": true},
		map[string]any{"host_path": "/.deer-flow/users/user-1/integrations/lark-cli/config/locks", "container_path": "/mnt/integrations/lark-cli/config/locks", "read_only": false},
		map[string]any{"host_path": "/.deer-flow/users/user-1/integrations/lark-cli/data", "container_path": "/mnt/integrations/lark-cli/data", "read_only": false},
		map[string]any{"host_path": "/.deer-flow/integrations/lark-cli/sandbox-cli", "container_path": "/mnt/integrations/lark-cli/runtime", "read_only": true},
	}
	larkBody := func(runtime, broker bool) map[string]any {
		return with(ordinary, func(b map[string]any) {
			b["provision_lark_cli_runtime"], b["provision_lark_cli_broker"] = runtime, broker
			b["extra_mounts"] = append(append([]any{}, b["extra_mounts"].([]any)...), larkExtras...)
		})
	}
	hostMode := map[string]string{}
	pvcMode := map[string]string{"USERDATA_PVC_NAME": "deer-flow-home", "SKILLS_PVC_NAME": "deer-flow-skills"}
	plus := func(base map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range base {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	const (
		init   = "LARK_CLI_INIT_IMAGE"
		broker = "LARK_CLI_BROKER_IMAGE"
	)
	hostSkills := map[string]string{
		"/mnt/skills/public": "host /.deer-flow/skills_view/public ro",
		"/mnt/skills/custom": "host /.deer-flow/users/user-1/skills_view/custom ro",
		"/mnt/skills/legacy": "host /.deer-flow/users/user-1/skills_view/legacy ro",
	}
	merge := func(ms ...map[string]string) map[string]string {
		out := map[string]string{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	runtimeRO := map[string]string{"/mnt/integrations/lark-cli/runtime": "emptyDir lark-cli-runtime ro"}
	runtimeRW := map[string]string{"/mnt/integrations/lark-cli/runtime": "emptyDir lark-cli-runtime rw"}

	tests := []struct {
		name string
		env  map[string]string
		body map[string]any
		// want maps each container to what its mounts show.
		want map[string]map[string]string
	}{{
		name: "host-path mode, DeerFlow's ordinary create, no Lark image configured",
		env:  hostMode,
		body: ordinary,
		want: map[string]map[string]string{"sandbox": merge(hostSkills, map[string]string{
			"/mnt/user-data":     "host /.deer-flow/threads/t1/user-data rw",
			"/mnt/acp-workspace": "host /.deer-flow/users/user-1/threads/t1/acp-workspace ro",
		})},
	}, {
		name: "host-path mode, DeerFlow's ordinary create, Lark init image",
		env:  plus(hostMode, init, "lark-init:1"),
		body: ordinary,
		want: map[string]map[string]string{
			"sandbox": merge(hostSkills, runtimeRO, map[string]string{
				"/mnt/user-data":     "host /.deer-flow/threads/t1/user-data rw",
				"/mnt/acp-workspace": "host /.deer-flow/users/user-1/threads/t1/acp-workspace ro",
			}),
			"lark-cli-init": runtimeRW,
		},
	}, {
		name: "PVC mode, DeerFlow's ordinary create, Lark init image",
		env:  plus(pvcMode, init, "lark-init:1"),
		body: ordinary,
		want: map[string]map[string]string{
			"sandbox": merge(runtimeRO, map[string]string{
				"/mnt/skills":        "claim deer-flow-skills  ro",
				"/mnt/user-data":     "claim deer-flow-home deer-flow/users/user-1/threads/t1/user-data rw",
				"/mnt/acp-workspace": "claim deer-flow-home deer-flow/users/user-1/threads/t1/acp-workspace ro",
				"/mnt/skills/custom": "claim deer-flow-home deer-flow/users/user-1/skills_view/custom ro",
			}),
			"lark-cli-init": runtimeRW,
		},
	}, {
		name: "PVC mode, skills scoped by SKILLS_PVC_SUBPATH_TEMPLATE",
		env:  plus(pvcMode, "SKILLS_PVC_SUBPATH_TEMPLATE", "deer-flow/users/{user_id}/threads/{thread_id}/skills"),
		body: ordinary,
		want: map[string]map[string]string{"sandbox": {
			"/mnt/skills":        "claim deer-flow-skills deer-flow/users/user-1/threads/t1/skills ro",
			"/mnt/user-data":     "claim deer-flow-home deer-flow/users/user-1/threads/t1/user-data rw",
			"/mnt/acp-workspace": "claim deer-flow-home deer-flow/users/user-1/threads/t1/acp-workspace ro",
			"/mnt/skills/custom": "claim deer-flow-home deer-flow/users/user-1/skills_view/custom ro",
		}},
	}, {
		name: "user data on the claim, skills from the node (no SKILLS_PVC_NAME)",
		env:  map[string]string{"USERDATA_PVC_NAME": "deer-flow-home"},
		body: ordinary,
		want: map[string]map[string]string{"sandbox": merge(hostSkills, map[string]string{
			"/mnt/user-data":     "claim deer-flow-home deer-flow/users/user-1/threads/t1/user-data rw",
			"/mnt/acp-workspace": "claim deer-flow-home deer-flow/users/user-1/threads/t1/acp-workspace ro",
			"/mnt/skills/custom": "claim deer-flow-home deer-flow/users/user-1/skills_view/custom ro",
		})},
	}, {
		name: "host-path mode, anonymous create: the thread is the sandbox id",
		env:  hostMode,
		body: anonymous,
		want: map[string]map[string]string{"sandbox": merge(hostSkills, map[string]string{
			"/mnt/user-data": "host /.deer-flow/threads/abcd1234/user-data rw",
		})},
	}, {
		name: "PVC mode, anonymous create",
		env:  pvcMode,
		body: anonymous,
		want: map[string]map[string]string{"sandbox": {
			"/mnt/skills":    "claim deer-flow-skills  ro",
			"/mnt/user-data": "claim deer-flow-home deer-flow/users/user-1/threads/abcd1234/user-data rw",
		}},
	}, {
		name: "legacy skills not asked for: DeerFlow mounts them all the same",
		env:  hostMode,
		body: with(anonymous, func(b map[string]any) { b["include_legacy_skills"] = false }),
		want: map[string]map[string]string{"sandbox": merge(hostSkills, map[string]string{
			"/mnt/user-data": "host /.deer-flow/threads/abcd1234/user-data rw",
		})},
	}, {
		name: "host-path mode, Lark credentials and runtime sent, no Lark image: all mounted in the sandbox",
		env:  hostMode,
		body: larkBody(true, false),
		want: map[string]map[string]string{"sandbox": merge(hostSkills, map[string]string{
			"/mnt/user-data":                          "host /.deer-flow/threads/t1/user-data rw",
			"/mnt/acp-workspace":                      "host /.deer-flow/users/user-1/threads/t1/acp-workspace ro",
			"/mnt/integrations/lark-cli/config":       "host /.deer-flow/users/user-1/integrations/lark-cli/config ro",
			"/mnt/integrations/lark-cli/config/locks": "host /.deer-flow/users/user-1/integrations/lark-cli/config/locks rw",
			"/mnt/integrations/lark-cli/data":         "host /.deer-flow/users/user-1/integrations/lark-cli/data rw",
			"/mnt/integrations/lark-cli/runtime":      "host /.deer-flow/integrations/lark-cli/sandbox-cli ro",
		})},
	}, {
		name: "host-path mode, Lark runtime (pattern A): the init container replaces the runtime mount",
		env:  plus(hostMode, init, "lark-init:1"),
		body: larkBody(true, false),
		want: map[string]map[string]string{
			"sandbox": merge(hostSkills, runtimeRO, map[string]string{
				"/mnt/user-data":                          "host /.deer-flow/threads/t1/user-data rw",
				"/mnt/acp-workspace":                      "host /.deer-flow/users/user-1/threads/t1/acp-workspace ro",
				"/mnt/integrations/lark-cli/config":       "host /.deer-flow/users/user-1/integrations/lark-cli/config ro",
				"/mnt/integrations/lark-cli/config/locks": "host /.deer-flow/users/user-1/integrations/lark-cli/config/locks rw",
				"/mnt/integrations/lark-cli/data":         "host /.deer-flow/users/user-1/integrations/lark-cli/data rw",
			}),
			"lark-cli-init": runtimeRW,
		},
	}, {
		name: "host-path mode, Lark broker (pattern B, over A): credentials only in the sidecar",
		env:  plus(hostMode, init, "lark-init:1", broker, "lark-broker:1"),
		body: larkBody(true, true),
		want: map[string]map[string]string{
			"sandbox": merge(hostSkills, runtimeRO, map[string]string{
				"/mnt/user-data":     "host /.deer-flow/threads/t1/user-data rw",
				"/mnt/acp-workspace": "host /.deer-flow/users/user-1/threads/t1/acp-workspace ro",
			}),
			"lark-cli-shim-init": runtimeRW,
			"lark-cli-broker": {
				"/var/lark/config":       "host /.deer-flow/users/user-1/integrations/lark-cli/config ro",
				"/var/lark/config/locks": "host /.deer-flow/users/user-1/integrations/lark-cli/config/locks rw",
				"/var/lark/data":         "host /.deer-flow/users/user-1/integrations/lark-cli/data rw",
			},
		},
	}, {
		name: "PVC mode, Lark broker",
		env:  plus(pvcMode, broker, "lark-broker:1"),
		body: larkBody(false, true),
		want: map[string]map[string]string{
			"sandbox": merge(runtimeRO, map[string]string{
				"/mnt/skills":        "claim deer-flow-skills  ro",
				"/mnt/user-data":     "claim deer-flow-home deer-flow/users/user-1/threads/t1/user-data rw",
				"/mnt/acp-workspace": "claim deer-flow-home deer-flow/users/user-1/threads/t1/acp-workspace ro",
				"/mnt/skills/custom": "claim deer-flow-home deer-flow/users/user-1/skills_view/custom ro",
			}),
			"lark-cli-shim-init": runtimeRW,
			"lark-cli-broker": {
				"/var/lark/config":       "claim deer-flow-home deer-flow/users/user-1/integrations/lark-cli/config ro",
				"/var/lark/config/locks": "claim deer-flow-home deer-flow/users/user-1/integrations/lark-cli/config/locks rw",
				"/var/lark/data":         "claim deer-flow-home deer-flow/users/user-1/integrations/lark-cli/data rw",
			},
		},
	}, {
		name: "PVC mode, Lark runtime (pattern A) with the credential mounts",
		env:  plus(pvcMode, init, "lark-init:1"),
		body: larkBody(true, false),
		want: map[string]map[string]string{
			"sandbox": merge(runtimeRO, map[string]string{
				"/mnt/skills":                             "claim deer-flow-skills  ro",
				"/mnt/user-data":                          "claim deer-flow-home deer-flow/users/user-1/threads/t1/user-data rw",
				"/mnt/acp-workspace":                      "claim deer-flow-home deer-flow/users/user-1/threads/t1/acp-workspace ro",
				"/mnt/skills/custom":                      "claim deer-flow-home deer-flow/users/user-1/skills_view/custom ro",
				"/mnt/integrations/lark-cli/config":       "claim deer-flow-home deer-flow/users/user-1/integrations/lark-cli/config ro",
				"/mnt/integrations/lark-cli/config/locks": "claim deer-flow-home deer-flow/users/user-1/integrations/lark-cli/config/locks rw",
				"/mnt/integrations/lark-cli/data":         "claim deer-flow-home deer-flow/users/user-1/integrations/lark-cli/data rw",
			}),
			"lark-cli-init": runtimeRW,
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, plus(tc.env, "SANDBOX_IMAGE", "sandbox:1"))
			raw, err := json.Marshal(tc.body)
			if err != nil {
				t.Fatal(err)
			}
			req, err := api.DecodeCreateRequest(raw)
			if err != nil {
				t.Fatal(err)
			}
			s, err := req.Validate(cfg.Objects(), created)
			if err != nil {
				t.Fatalf("DeerFlow's request refused: %v", err)
			}
			pod := BuildPod(cfg.Objects(), s)
			got := map[string]map[string]string{}
			for _, c := range allContainers(pod) {
				got[c.Name] = sees(t, pod, c.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("mounts differ from DeerFlow's (-DeerFlow +ours):\n%s", diff)
			}
		})
	}
}

// TestLarkContainersMatchDeerFlow pins the rest of what DeerFlow's Lark
// helpers set: the init containers' arguments and environment, the broker's,
// and the broker URL the sandbox's shim uses.
func TestLarkContainersMatchDeerFlow(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_IMAGE": "sandbox:1", "LARK_CLI_INIT_IMAGE": "lark-init:1",
		"LARK_CLI_BROKER_IMAGE": "lark-broker:1", "DEERFLOW_LARK_BROKER_DENY_SUBCOMMANDS": "config,auth"})
	type shape struct {
		Image string
		Args  []string
		Env   []corev1.EnvVar
	}
	build := func(runtime, broker bool) map[string]shape {
		s := testSpec()
		s.LarkCLIRuntime, s.LarkCLIBroker = runtime, broker
		out := map[string]shape{}
		for _, c := range allContainers(BuildPod(cfg.Objects(), s)) {
			out[c.Name] = shape{Image: c.Image, Args: c.Args, Env: c.Env}
		}
		return out
	}
	dest := []corev1.EnvVar{{Name: "LARK_CLI_RUNTIME_DEST", Value: "/mnt/integrations/lark-cli/runtime"}}
	for _, tc := range []struct {
		name            string
		runtime, broker bool
		want            map[string]shape
	}{{
		name: "pattern A", runtime: true,
		want: map[string]shape{"sandbox": {Image: "sandbox:1"}, "lark-cli-init": {Image: "lark-init:1", Env: dest}},
	}, {
		name: "pattern B", runtime: true, broker: true,
		want: map[string]shape{
			"sandbox":            {Image: "sandbox:1", Env: []corev1.EnvVar{{Name: "DEERFLOW_LARK_BROKER_URL", Value: "http://127.0.0.1:8788"}}},
			"lark-cli-shim-init": {Image: "lark-broker:1", Args: []string{"install-shim", "/mnt/integrations/lark-cli/runtime"}, Env: dest},
			"lark-cli-broker": {Image: "lark-broker:1", Args: []string{"serve"}, Env: []corev1.EnvVar{
				{Name: "LARKSUITE_CLI_CONFIG_DIR", Value: "/var/lark/config"},
				{Name: "LARKSUITE_CLI_DATA_DIR", Value: "/var/lark/data"},
				{Name: "DEERFLOW_LARK_BROKER_DENY_SUBCOMMANDS", Value: "config,auth"},
			}},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, build(tc.runtime, tc.broker)); diff != "" {
				t.Errorf("Lark containers (-DeerFlow +ours):\n%s", diff)
			}
		})
	}
}
