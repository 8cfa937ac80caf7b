//go:build e2e

package e2e

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	"sigs.k8s.io/yaml"

	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
	"github.com/deerflow-sandbox/provisioner/test/framework/registry"
	"github.com/deerflow-sandbox/provisioner/test/framework/skip"
)

// imageSizeBudget is the most the linux/amd64 image may weigh, compressed
// layers and config together: a static Go binary, CA certificates and the
// function's sources. Today it is about 10 MiB.
const imageSizeBudget = 16 << 20

// ociDescriptor, ociManifest and ociConfig are the parts of the OCI image
// spec the image test reads.
type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	Platform  *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform,omitempty"`
}

type ociManifest struct {
	Config ociDescriptor   `json:"config"`
	Layers []ociDescriptor `json:"layers"`
}

type ociConfig struct {
	Config struct {
		User       string   `json:"User"`
		Env        []string `json:"Env"`
		Entrypoint []string `json:"Entrypoint"`
		Cmd        []string `json:"Cmd"`
		WorkingDir string   `json:"WorkingDir"`
	} `json:"config"`
}

// builtImage is the OCI layout `make image` (hack/image.sh) wrote.
type builtImage struct {
	dir      string
	manifest ociManifest
	config   ociConfig
}

func (b builtImage) blob(digest string) string {
	return filepath.Join(b.dir, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func readJSON(t *testing.T, path string, into any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func openImage(t *testing.T) builtImage {
	t.Helper()
	dir := filepath.Join(cluster.CacheDir(), "image", "oci")
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		skip.Unavailable(t, "no image in %s: `make image` builds it (make test-e2e does so first): %v", dir, err)
	}
	b := builtImage{dir: dir}
	var index struct{ Manifests []ociDescriptor }
	readJSON(t, filepath.Join(dir, "index.json"), &index)
	for _, m := range index.Manifests {
		if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == "amd64" {
			readJSON(t, b.blob(m.Digest), &b.manifest)
		}
	}
	if b.manifest.Config.Digest == "" {
		t.Fatalf("the image index in %s has no linux/amd64 image", dir)
	}
	readJSON(t, b.blob(b.manifest.Config.Digest), &b.config)
	return b
}

// eachFile calls fn for every entry of every layer, in order.
func (b builtImage) eachFile(t *testing.T, fn func(h *tar.Header, r io.Reader)) {
	t.Helper()
	for _, l := range b.manifest.Layers {
		f, err := os.Open(b.blob(l.Digest))
		if err != nil {
			t.Fatal(err)
		}
		gz, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(gz)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("layer %s: %v", l.Digest, err)
			}
			fn(h, tr)
		}
		f.Close()
	}
}

// configService is config/400-service.yaml, the Knative Service users deploy.
func configService(t *testing.T) servingv1.Service {
	t.Helper()
	var ksvc servingv1.Service
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "400-service.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &ksvc); err != nil {
		t.Fatal(err)
	}
	return ksvc
}

// TestImage inspects the image `make image` built with func's host builder,
// then runs the binary taken from its layers against the test cluster.
func TestImage(t *testing.T) {
	img := openImage(t)
	cfg := img.config.Config

	// Non-root, and consistent with config/400-service.yaml.
	var uid, gid int
	if _, err := fmt.Sscanf(cfg.User, "%d:%d", &uid, &gid); err != nil || uid == 0 {
		t.Errorf("image user %q: want a numeric non-root uid:gid", cfg.User)
	}
	ksvc := configService(t)
	sc := ksvc.Spec.Template.Spec.Containers[0].SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("config/400-service.yaml does not set runAsNonRoot")
	}
	if sc != nil && sc.RunAsUser != nil && int(*sc.RunAsUser) != uid {
		t.Errorf("config runs as uid %d, the image as %d", *sc.RunAsUser, uid)
	}

	// The entrypoint and address func-go's runtime expects.
	if len(cfg.Entrypoint) != 0 || !cmp.Equal(cfg.Cmd, []string{"/func/f"}) {
		t.Errorf("entrypoint %q, cmd %q: want the host builder's /func/f", cfg.Entrypoint, cfg.Cmd)
	}
	if !slices.Contains(cfg.Env, "LISTEN_ADDRESS=[::]:8080") {
		t.Errorf("env %q lacks LISTEN_ADDRESS=[::]:8080", cfg.Env)
	}
	// No credentials, templates or trust switches in the image.
	secretName := regexp.MustCompile(`(?i)(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH)`)
	for _, e := range cfg.Env {
		name, value, _ := strings.Cut(e, "=")
		if secretName.MatchString(name) || strings.Contains(value, "{{") || strings.HasPrefix(name, "EVENTS_") {
			t.Errorf("image env %s: no secret, template or trust switch may be baked in", name)
		}
	}

	// Size budget, and only what the function needs.
	size := img.manifest.Config.Size
	for _, l := range img.manifest.Layers {
		size += l.Size
	}
	t.Logf("image linux/amd64: %.1f MiB compressed in %d layers, user %s, cmd %q", float64(size)/(1<<20), len(img.manifest.Layers), cfg.User, cfg.Cmd)
	if size > imageSizeBudget {
		t.Errorf("image is %d bytes, over the %d budget", size, imageSizeBudget)
	}
	unwanted := regexp.MustCompile(`(_test\.go$|/testdata/|^/?func/(test|hack|config|cmd|\.ci|bin|results)/|/Makefile$|\.md$)`)
	bin := filepath.Join(t.TempDir(), "f")
	var files []string
	img.eachFile(t, func(h *tar.Header, r io.Reader) {
		files = append(files, h.Name)
		if unwanted.MatchString(h.Name) {
			t.Errorf("image carries %s, which .funcignore keeps out", h.Name)
		}
		if strings.TrimPrefix(h.Name, "/") == "func/f" {
			out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(out, r); err != nil {
				t.Fatal(err)
			}
			out.Close()
		}
	})
	sort.Strings(files)
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no /func/f in the image's layers (%d files)", len(files))
	}

	// Run the image's own binary: readiness, then the API.
	ns := namespace(t)
	env := function.BaseEnv(kubeconfig, ns)
	f, err := function.StartBinary(bin, env, filepath.Join(t.TempDir(), "image-fn.log"))
	if err != nil {
		t.Fatalf("the image's binary did not become ready: %v", err)
	}
	defer f.Stop()
	expectCode(t, mustDo(t, f, "GET", "/api/capabilities", nil), 200, "capabilities from the image's binary")
	// The wait the other create-and-wait tests allow (SANDBOX_MAX_READY_WAIT's
	// default): once, kwok's scheduler left the Pod unbound for over 10 s.
	r := mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": "img1"})
	if r.Code != 200 || r.Body["status"] != "Running" {
		t.Errorf("create with wait from the image's binary: %d %s", r.Code, r.Raw)
	}
	expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/img1", nil), 200, "destroy from the image's binary")

	// Cold start to the first 200 on /health/readiness: a figure for the
	// closing note, not an assertion (timings vary on shared machines).
	var ms []float64
	for i := 0; i < 15; i++ {
		addr, err := function.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		g, err := function.StartProcess(bin, env, addr, filepath.Join(t.TempDir(), "cold.log"))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.WaitReady(20 * time.Second); err != nil {
			g.Kill()
			t.Fatal(err)
		}
		ms = append(ms, float64(time.Since(g.Started).Microseconds())/1000)
		g.Kill()
	}
	sort.Float64s(ms)
	t.Logf("image binary cold start to first 200 on /health/readiness: median %.1f ms of %d (min %.1f, max %.1f)", ms[len(ms)/2], len(ms), ms[0], ms[len(ms)-1])
}

// TestPushedImageIsWhatDeployNames pushes the image with `make deploy`'s
// script (DRY_RUN: build, push, render; nothing applied) to a registry on
// 127.0.0.1 (test/framework/registry: go-containerregistry's, the stand-in
// for an operator's), and checks that the rendered manifests name the
// digest the registry holds.
func TestPushedImageIsWhatDeployNames(t *testing.T) {
	reg, err := registry.Start("127.0.0.1:0", t.TempDir(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	addr := reg.Addr

	image := addr + "/deer-flow/sandbox-provisioner:e2e"
	// PLATFORM: this machine's only. make deploy builds func's three by
	// default, by the same builder and flags; what is checked here, the
	// digest the manifests pin, does not depend on how many the index
	// holds, and the other two cost a cold run two and a half minutes.
	out := runScript(t, map[string]string{"DRY_RUN": "1", "PLATFORM": "linux/" + runtime.GOARCH}, filepath.Join("..", "..", "hack", "deploy.sh"), image)

	req, _ := http.NewRequest(http.MethodHead, "http://"+addr+"/v2/deer-flow/sandbox-provisioner/manifests/e2e", nil)
	req.Header.Set("Accept", "application/vnd.oci.image.index.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	pushed := resp.Header.Get("Docker-Content-Digest")
	if resp.StatusCode != 200 || pushed == "" {
		t.Fatalf("registry has no e2e tag: %d", resp.StatusCode)
	}

	var images []string
	for _, doc := range strings.Split(out, "\n---\n") {
		var ks servingv1.Service
		if err := yaml.Unmarshal([]byte(doc), &ks); err != nil || ks.Kind != "Service" || ks.APIVersion != "serving.knative.dev/v1" {
			continue
		}
		for _, c := range ks.Spec.Template.Spec.Containers {
			images = append(images, c.Image)
		}
	}
	want := []string{addr + "/deer-flow/sandbox-provisioner@" + pushed}
	if diff := cmp.Diff(want, images); diff != "" {
		t.Errorf("deploy manifests' images (-pushed +rendered):\n%s", diff)
	}
}

// process is a helper process a test started.
type process struct{ cmd *exec.Cmd }

func (p process) stop() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// command starts bin with args, its output going to logPath.
func command(t *testing.T, logPath, bin string, args ...string) process {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return process{cmd}
}

// runScript runs a hack/ script with extra env and returns its stdout; its
// progress output (stderr) goes to the test log.
func runScript(t *testing.T, env map[string]string, script string, args ...string) string {
	t.Helper()
	cmd := exec.Command(script, args...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", script, strings.Join(args, " "), err, stderr.String())
	}
	t.Logf("%s %s:\n%s", script, strings.Join(args, " "), lastLines(stderr.String(), 5))
	return string(out)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestImageRunsInCluster runs the image `make image` built as a Pod on the
// real node, with config/'s ServiceAccount, RBAC and container settings from
// 400-service.yaml (a plain Pod stands in for the Knative Service, whose
// controller this cluster does not run). The function then serves the API
// with its in-cluster credentials: the mounted ServiceAccount token, and
// TokenReview for bearer tokens.
func TestImageRunsInCluster(t *testing.T) {
	rn := needRealNode(t)
	img := openImage(t)
	ctx := context.Background()
	const ref = "localhost/sandbox-provisioner:e2e"
	if err := rn.ImportOCILayout(ctx, img.dir, ref); err != nil {
		t.Fatal(err)
	}
	var rbac []string
	for _, f := range configFiles(t) {
		if b := filepath.Base(f); strings.HasPrefix(b, "1") || strings.HasPrefix(b, "2") || b == "701-networkpolicy-sandboxes.yaml" {
			rbac = append(rbac, f)
		}
	}
	applyServerSide(t, readObjects(t, rbac...))
	const ns = "deer-flow"
	eventually(t, 30*time.Second, "default ServiceAccount in deer-flow", func() (bool, error) {
		_, err := client().CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-provisioner", Namespace: ns}, StringData: map[string]string{"api-key": function.Key}}
	if _, err := client().CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	ksvc := configService(t)
	spec := ksvc.Spec.Template.Spec.PodSpec
	c := &spec.Containers[0]
	c.Image, c.ImagePullPolicy = ref, corev1.PullNever
	// Knative fills the probe ports in; a plain Pod needs them.
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		p.HTTPGet.Port = intstr.FromInt32(8080)
		p.PeriodSeconds = 1
	}
	// The test API server's certificate does not name the kubernetes
	// Service's address (10.96.0.1), so in-cluster clients reach it at the
	// node's address, which it names; token and CA are the mounted ones.
	_, apiPort, _ := net.SplitHostPort(strings.TrimPrefix(kc.Config.Host, "https://"))
	c.Env = append(c.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: rn.HostIP}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: apiPort})
	spec.NodeSelector = map[string]string{realnode.NodeLabel: "true"}
	spec.Tolerations = []corev1.Toleration{realnode.Toleration}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-provisioner-e2e", Namespace: ns, Labels: ksvc.Spec.Template.Labels}, Spec: spec}
	_ = client().CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	eventually(t, 30*time.Second, "no earlier provisioner Pod", func() (bool, error) {
		_, err := client().CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	if _, err := client().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("config/'s provisioner as a Pod: %v", err)
	}
	defer client().CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{})
	// Ready is the function's readiness: connected to the API server.
	ip := waitReady(t, "the image's Pod", podNamed(ns, pod.Name)).Status.PodIP
	f := &function.Instance{URL: "http://" + net.JoinHostPort(ip, "8080"), Client: &http.Client{Timeout: 30 * time.Second}}
	expectCode(t, mustDo(t, f, "GET", "/api/capabilities", nil), 200, "capabilities from the Pod")
	r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "incluster1", "thread_id": "t1", "user_id": "u1"})
	if r.Code != 200 || r.Body["sandbox_url"] != "http://sandbox-incluster1-svc.deer-flow.svc.cluster.local:8080" {
		t.Errorf("create from the Pod, with its ServiceAccount: %d %s", r.Code, r.Raw)
	}
	if p := pods(t, ns, "sandbox-id=incluster1"); len(p) != 1 {
		t.Errorf("the in-cluster create made %d Pods", len(p))
	}
	expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/incluster1", nil), 200, "destroy from the Pod")
}
