package knative

import (
	"encoding/json"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// TestRenderChangesOnlyImagesAndNamedSettings renders the upstream
// manifests from the module cache (downloaded through the module proxy if
// missing) and checks what Render promises to change, and nothing ko would
// have built is left unresolved.
func TestRenderChangesOnlyImagesAndNamedSettings(t *testing.T) {
	src, err := FindSources(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	v := DefaultVersions()
	objs, err := Render(src, v, Settings{ScaleToZeroGracePeriod: "6s"})
	if err != nil {
		t.Fatal(err)
	}
	find := func(kind, ns, name string) *unstructured.Unstructured {
		t.Helper()
		for _, o := range objs {
			if o.GetKind() == kind && o.GetNamespace() == ns && o.GetName() == name {
				return o
			}
		}
		t.Fatalf("no %s %s/%s in the rendered manifests", kind, ns, name)
		return nil
	}
	data := func(ns, name, key string) string {
		t.Helper()
		s, _, _ := unstructured.NestedString(find("ConfigMap", ns, name).Object, "data", key)
		return s
	}
	got := map[string]string{
		"ingress-class":              data("knative-serving", "config-network", "ingress-class"),
		"scale-to-zero-grace-period": data("knative-serving", "config-autoscaler", "scale-to-zero-grace-period"),
		"authentication-oidc":        data("knative-eventing", "config-features", "authentication-oidc"),
		"queue-sidecar-image":        data("knative-serving", "config-deployment", "queue-sidecar-image"),
	}
	want := map[string]string{
		"ingress-class":              "traefik.ingress.networking.knative.dev",
		"scale-to-zero-grace-period": "6s",
		"authentication-oidc":        "enabled",
		"queue-sidecar-image":        Image("serving", "queue", v.Serving),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("settings (-want +got):\n%s", diff)
	}

	images := map[string]bool{}
	kinds := map[string]int{}
	for i, o := range objs {
		raw, _ := json.Marshal(o.Object)
		if strings.Contains(string(raw), "ko://") {
			t.Errorf("%s %s/%s still names a ko:// image", o.GetKind(), o.GetNamespace(), o.GetName())
		}
		kinds[o.GetKind()]++
		if i > 0 && rank(objs[i-1]) > rank(o) {
			t.Errorf("%s %s comes after %s %s", o.GetKind(), o.GetName(), objs[i-1].GetKind(), objs[i-1].GetName())
		}
		if o.GetKind() != "Deployment" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			images[c.(map[string]any)["image"].(string)] = true
		}
	}
	// Every Deployment runs an image hack/install-knative.sh builds.
	built := map[string]bool{}
	for _, c := range []string{"activator", "autoscaler", "controller", "webhook"} {
		built[Image("serving", c, v.Serving)] = true
	}
	for _, c := range []string{"controller", "webhook", "mtchannel_broker", "ingress", "filter", "channel_controller", "channel_dispatcher", "mtping"} {
		built[Image("eventing", c, v.Eventing)] = true
	}
	if diff := cmp.Diff(built, images); diff != "" {
		t.Errorf("Deployments' images (-built +rendered):\n%s", diff)
	}
	for _, k := range []string{"HorizontalPodAutoscaler"} {
		if kinds[k] != 0 {
			t.Errorf("%d %s rendered; they are left out", kinds[k], k)
		}
	}
	for _, crd := range []string{"ingresses.networking.internal.knative.dev", "serverlessservices.networking.internal.knative.dev",
		"images.caching.internal.knative.dev", "eventpolicies.eventing.knative.dev", "inmemorychannels.messaging.knative.dev"} {
		find("CustomResourceDefinition", "", crd)
	}
}
