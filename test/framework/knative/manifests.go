// Package knative installs real Knative Serving and Eventing, Traefik's
// KIngress and CoreDNS on a local test cluster whose real node runs them
// (make knative, the Knative end-to-end suite). Knative's objects come from
// the upstream manifests shipped in the Serving and Eventing modules that
// hack/install-knative.sh builds; this package changes only their image
// references and the settings this cluster needs, each named in Render.
package knative

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// Versions are the Knative releases hack/lib.sh builds.
type Versions struct {
	Serving, Eventing, Traefik, CoreDNS string
}

// DefaultVersions are hack/lib.sh's, overridable the same way.
func DefaultVersions() Versions {
	return Versions{
		Serving:  envOr("KNATIVE_SERVING_VERSION", "v0.50.0"),
		Eventing: envOr("KNATIVE_EVENTING_VERSION", "v0.50.0"),
		Traefik:  envOr("TRAEFIK_VERSION", "v3.6.12"),
		CoreDNS:  envOr("COREDNS_VERSION", "v1.15.0"),
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Sources are the module directories the manifests come from. Some files
// in Serving's repository are symlinks into networking and caching, which
// module zips drop: those come from the modules themselves, at the versions
// Serving's build uses.
type Sources struct {
	Serving, Networking, Caching, Eventing string
}

// FindSources asks Go for the module directories, from the wrapper modules
// under hack/tools that hack/install-knative.sh builds (downloading through
// the module proxy if the cache lacks one).
func FindSources(repoRoot string) (Sources, error) {
	var s Sources
	for _, m := range []struct {
		dir, module string
		into        *string
	}{
		{"knative-serving", "knative.dev/serving", &s.Serving},
		{"knative-serving", "knative.dev/networking", &s.Networking},
		{"knative-serving", "knative.dev/caching", &s.Caching},
		{"knative-eventing", "knative.dev/eventing", &s.Eventing},
	} {
		cmd := exec.Command("go", "mod", "download", "-json", m.module)
		cmd.Dir = filepath.Join(repoRoot, "hack", "tools", m.dir)
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
		out, err := cmd.Output()
		var info struct{ Dir, Error string }
		if jerr := json.Unmarshal(out, &info); err != nil || jerr != nil || info.Dir == "" {
			return s, fmt.Errorf("go mod download %s in hack/tools/%s: %v %s", m.module, m.dir, err, info.Error)
		}
		*m.into = info.Dir
	}
	return s, nil
}

// Image is the reference hack/install-knative.sh gives a Knative command's
// image: dev.local/knative-<project>-<command>:<version>. dev.local is on
// Serving's list of registries whose tags it never resolves to digests
// (it could not, offline).
func Image(project, command, version string) string {
	return fmt.Sprintf("dev.local/knative-%s-%s:%s", project, command, version)
}

// Settings are what this cluster changes in upstream's configuration.
type Settings struct {
	// ScaleToZeroGracePeriod is config-autoscaler's scale-to-zero-grace-period
	// (upstream 30s): how long the last Pod of a revision at zero demand
	// lingers. Tests shorten it to see scale to zero within a minute.
	ScaleToZeroGracePeriod string
}

// cpuRequest replaces every Knative container's CPU request: upstream's
// (the activator's alone is 300m) add up to more than this two-core node
// can give beside the function and its sandboxes. Limits stay.
const cpuRequest = "10m"

// Render returns Knative's objects from the upstream manifests: Serving's
// core (with networking's KIngress, ServerlessService, Certificate and
// DomainClaim CRDs and config-network, and caching's Image CRD), Eventing's
// core, the multi-tenant channel-based Broker and the in-memory channel
// (with the integration-images ConfigMaps its release adds from
// third_party/).
// Left out: the HPAs (no metrics server), Eventing's JobSink and
// RequestReply Deployments (not used here), and stray editor backups.
//
// Changed: every ko:// image reference becomes Image(…) (commands not
// built here, such as the ApiServerSource adapter, get names no node has,
// and are never run); the ingress class is Traefik's; Eventing's OIDC
// authentication is on; the SinkBinding webhook is in inclusion mode, so it
// is not in the path of every Pod create; CPU requests shrink (cpuRequest);
// and the settings in s.
func Render(src Sources, v Versions, s Settings) ([]*unstructured.Unstructured, error) {
	type tree struct {
		root, project, version string
		dirs                   []string
	}
	var objs []*unstructured.Unstructured
	for _, t := range []tree{
		{src.Serving, "serving", v.Serving, []string{"config/core"}},
		{src.Networking, "serving", v.Serving, []string{"config"}},
		{src.Caching, "serving", v.Serving, []string{"config"}},
		{src.Eventing, "eventing", v.Eventing, []string{"config/core", "config/brokers/mt-channel-broker", "config/channels/in-memory-channel",
			// The ConfigMaps naming the integration images the controller's
			// env reads; Eventing's release ships them from here.
			"third_party/eventing-integrations-latest"}},
	} {
		for _, d := range t.dirs {
			files, err := manifestFiles(filepath.Join(t.root, d))
			if err != nil {
				return nil, err
			}
			for _, f := range files {
				raw, err := os.ReadFile(f)
				if err != nil {
					return nil, err
				}
				raw = substituteImages(raw, t.project, t.version)
				got, err := decode(raw)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", f, err)
				}
				objs = append(objs, got...)
			}
		}
	}
	for _, o := range objs {
		if err := adjust(o, s); err != nil {
			return nil, err
		}
	}
	// CRDs and namespaces first, then upstream's order (webhook
	// configurations come last in it, after what they would check).
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int { return rank(a) - rank(b) })
	return objs, nil
}

func rank(o *unstructured.Unstructured) int {
	switch o.GetKind() {
	case "Namespace":
		return 0
	case "CustomResourceDefinition":
		return 1
	case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
		return 3
	}
	return 2
}

// manifestFiles lists the YAML files under dir, in upstream's order
// (lexical), without the ones Render leaves out.
func manifestFiles(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := d.Name()
		switch {
		case !strings.HasSuffix(name, ".yaml"): // README.md, placeholder.go, "x.yaml~abc (backup)"
		case strings.Contains(name, "hpa"):
		case name == "job-sink.yaml" || name == "request-reply.yaml":
		default:
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading Knative's manifests in %s: %w", dir, err)
	}
	slices.Sort(files)
	return files, nil
}

// substituteImages rewrites ko://knative.dev/<project>/cmd/<path> (an image
// ko would build) to the image hack/install-knative.sh built, named for the
// command's last path element.
func substituteImages(raw []byte, project, version string) []byte {
	const ko = "ko://knative.dev/"
	var out bytes.Buffer
	for {
		i := bytes.Index(raw, []byte(ko))
		if i < 0 {
			out.Write(raw)
			return out.Bytes()
		}
		out.Write(raw[:i])
		end := i + bytes.IndexAny(raw[i:], " \t\r\n\"'")
		if end < i {
			end = len(raw)
		}
		ref := string(raw[i+len(ko) : end]) // eventing/cmd/broker/filter
		out.WriteString(Image(project, filepath.Base(ref), version))
		raw = raw[end:]
	}
}

func decode(raw []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var u unstructured.Unstructured
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(u.Object) > 0 {
			objs = append(objs, &u)
		}
	}
}

// adjust applies Render's changes to one object.
func adjust(o *unstructured.Unstructured, s Settings) error {
	set := func(key, value string) error {
		return unstructured.SetNestedField(o.Object, value, "data", key)
	}
	switch ns, name := o.GetNamespace(), o.GetName(); {
	case o.GetKind() == "ConfigMap" && ns == "knative-serving" && name == "config-network":
		return set("ingress-class", "traefik.ingress.networking.knative.dev")
	case o.GetKind() == "ConfigMap" && ns == "knative-serving" && name == "config-autoscaler" && s.ScaleToZeroGracePeriod != "":
		return set("scale-to-zero-grace-period", s.ScaleToZeroGracePeriod)
	case o.GetKind() == "ConfigMap" && ns == "knative-eventing" && name == "config-features":
		return set("authentication-oidc", "enabled")
	case o.GetKind() == "Deployment":
		return adjustDeployment(o)
	}
	return nil
}

func adjustDeployment(o *unstructured.Unstructured) error {
	containers, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if err != nil {
		return fmt.Errorf("%s/%s: %w", o.GetNamespace(), o.GetName(), err)
	}
	for i, c := range containers {
		c := c.(map[string]any)
		if _, ok, _ := unstructured.NestedFieldNoCopy(c, "resources", "requests", "cpu"); ok {
			if err := unstructured.SetNestedField(c, cpuRequest, "resources", "requests", "cpu"); err != nil {
				return err
			}
		}
		if o.GetNamespace() == "knative-eventing" && o.GetName() == "eventing-webhook" {
			env, _, _ := unstructured.NestedSlice(c, "env")
			for j, e := range env {
				if e := e.(map[string]any); e["name"] == "SINK_BINDING_SELECTION_MODE" {
					e["value"] = "inclusion"
					env[j] = e
				}
			}
			if err := unstructured.SetNestedSlice(c, env, "env"); err != nil {
				return err
			}
		}
		containers[i] = c
	}
	return unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers")
}
