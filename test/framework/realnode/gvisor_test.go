package realnode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	nodev1 "k8s.io/api/node/v1"
	"sigs.k8s.io/yaml"

	confignode "github.com/deerflow-sandbox/provisioner/config/node"
)

// TestRuntimeClassFile: config/node's RuntimeClass is the one the node's
// handler serves, and config/kustomization.yaml leaves it out, so applying
// config/ never overwrites a managed cluster's own gvisor class.
func TestRuntimeClassFile(t *testing.T) {
	var rc nodev1.RuntimeClass
	if err := yaml.UnmarshalStrict(confignode.RuntimeClassGVisor, &rc); err != nil {
		t.Fatal(err)
	}
	if rc.Kind != "RuntimeClass" || rc.Name != GVisorRuntimeClass || rc.Handler != GVisorHandler {
		t.Errorf("config/node/runtimeclass-gvisor.yaml: %s %s with handler %s, want RuntimeClass %s with handler %s", rc.Kind, rc.Name, rc.Handler, GVisorRuntimeClass, GVisorHandler)
	}
	k, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(k), "runtimeclass-gvisor") || strings.Contains(string(k), "node/") {
		t.Errorf("config/kustomization.yaml names the RuntimeClass; it must stay out of config/")
	}
}

// TestRunscRuntimeWithoutGVisor: without runsc and its shim the node
// registers no handler and says why.
func TestRunscRuntimeWithoutGVisor(t *testing.T) {
	n := &Node{State: t.TempDir(), paths: Paths{GVisorBin: filepath.Join(t.TempDir(), "none")}}
	section, err := n.runscRuntime()
	if err != nil || section != "" {
		t.Fatalf("section %q, err %v; want none", section, err)
	}
	if n.GVisor() == nil || !strings.Contains(n.GVisor().Error(), "make node") {
		t.Errorf("GVisor() = %v, want why (make node builds it)", n.GVisor())
	}
}

// TestRunscRuntime: with both binaries the handler's section names the
// shim and a runsc.toml that picks the systrap platform and runsc itself.
func TestRunscRuntime(t *testing.T) {
	bin := t.TempDir()
	for _, f := range []string{"runsc", "containerd-shim-runsc-v1"} {
		if err := os.WriteFile(filepath.Join(bin, f), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n := &Node{State: t.TempDir(), paths: Paths{GVisorBin: bin}}
	section, err := n.runscRuntime()
	if err != nil || n.GVisor() != nil {
		t.Fatal(err, n.GVisor())
	}
	for _, want := range []string{"runtimes.runsc]", "runtime_type = 'io.containerd.runsc.v1'", filepath.Join(bin, "containerd-shim-runsc-v1"),
		"TypeUrl = 'io.containerd.runsc.v1.options'", filepath.Join(n.State, "runsc", "runsc.toml")} {
		if !strings.Contains(section, want) {
			t.Errorf("containerd's section lacks %q:\n%s", want, section)
		}
	}
	b, err := os.ReadFile(filepath.Join(n.State, "runsc", "runsc.toml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`binary_name = "` + filepath.Join(bin, "runsc") + `"`, `platform = "systrap"`, "network = 'sandbox'", "oci-seccomp = 'true'"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("runsc.toml lacks %q:\n%s", want, b)
		}
	}
	if strings.Contains(string(b), "debug-log") {
		t.Errorf("runsc.toml sets debug-log without RUNSC_DEBUG_LOG=1:\n%s", b)
	}
}

// TestRunscDebugLog: RUNSC_DEBUG_LOG=1 adds runsc's own logs, in the
// directory the shim's go to.
func TestRunscDebugLog(t *testing.T) {
	t.Setenv("RUNSC_DEBUG_LOG", "1")
	bin := t.TempDir()
	for _, f := range []string{"runsc", "containerd-shim-runsc-v1"} {
		if err := os.WriteFile(filepath.Join(bin, f), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n := &Node{State: t.TempDir(), paths: Paths{GVisorBin: bin}}
	if _, err := n.runscRuntime(); err != nil || n.GVisor() != nil {
		t.Fatal(err, n.GVisor())
	}
	b, err := os.ReadFile(filepath.Join(n.State, "runsc", "runsc.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if want := `debug-log = "` + filepath.Join(n.State, "runsc", "logs") + `/"`; !strings.Contains(string(b), want) {
		t.Errorf("runsc.toml lacks %q:\n%s", want, b)
	}
}
