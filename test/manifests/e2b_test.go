package manifests

import (
	"path"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
)

// keyFile is where a container reads the E2B token key: the file
// E2B_TOKEN_KEY_FILE names, and the Secret volume mounted over its
// directory (name, item, optional).
type keyFile struct {
	Env, Secret, Item string
	Optional          bool
	ReadOnly          bool
}

// keyFileOf finds the key's file in a container of spec: the mount whose
// path holds E2B_TOKEN_KEY_FILE, and its Secret volume's item there.
func keyFileOf(t *testing.T, what string, spec corev1.PodSpec, c corev1.Container) keyFile {
	t.Helper()
	var k keyFile
	for _, e := range c.Env {
		if e.Name == "E2B_TOKEN_KEY_FILE" {
			k.Env = e.Value
		}
	}
	if k.Env == "" {
		t.Fatalf("%s sets no E2B_TOKEN_KEY_FILE", what)
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath != path.Dir(k.Env) {
			continue
		}
		k.ReadOnly = m.ReadOnly
		for _, v := range spec.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			k.Secret = v.Secret.SecretName
			k.Optional = v.Secret.Optional != nil && *v.Secret.Optional
			for _, it := range v.Secret.Items {
				if it.Path == path.Base(k.Env) {
					k.Item = it.Key
				}
			}
		}
	}
	if k.Secret == "" {
		t.Fatalf("%s mounts no Secret at %s, the directory of E2B_TOKEN_KEY_FILE=%s", what, path.Dir(k.Env), k.Env)
	}
	return k
}

// keyEnvOf finds the key the function reads by env: E2B_TOKEN_KEY's
// Secret, item and whether it is optional.
func keyEnvOf(t *testing.T, what string, c corev1.Container) keyFile {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == "E2B_TOKEN_KEY" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			ref := e.ValueFrom.SecretKeyRef
			return keyFile{Env: e.Name, Secret: ref.Name, Item: ref.Key, Optional: ref.Optional != nil && *ref.Optional, ReadOnly: true}
		}
	}
	t.Fatalf("%s takes no E2B_TOKEN_KEY from a Secret", what)
	return keyFile{}
}

// TestE2BKeyIsSharedWithTheRouter: the function reads the token key from
// the same Secret and item as the router (a sandbox's tokens are checked
// with the key they were made with), the router from a read-only mount,
// the function by env (its Pod has no volume: TestFunctionPodHasNoVolume);
// the function's is optional (a deployment without E2B starts; its E2B API
// answers 503), the router's is not (it must not start without it); and
// the function carries SANDBOX_ENVD_IMAGE for make deploy to set.
func TestE2BKeyIsSharedWithTheRouter(t *testing.T) {
	var svc servingv1.Service
	decode(t, "400-service.yaml", &svc)
	fnSpec := svc.Spec.Template.Spec.PodSpec
	fn := keyEnvOf(t, "400-service.yaml", fnSpec.Containers[0])
	var router *appsv1.Deployment
	for _, o := range configObjects(t) {
		if o.file == "310-router.yaml" && o.groupKind().Kind == "Deployment" {
			router = &appsv1.Deployment{}
			o.into(t, router)
		}
	}
	if router == nil {
		t.Fatal("310-router.yaml has no Deployment")
	}
	rt := keyFileOf(t, "310-router.yaml", router.Spec.Template.Spec, router.Spec.Template.Spec.Containers[0])

	if fn.Secret != rt.Secret || fn.Item != rt.Item || fn.Item == "" {
		t.Errorf("the function reads Secret %s item %q, the router Secret %s item %q: want the same", fn.Secret, fn.Item, rt.Secret, rt.Item)
	}
	if !fn.Optional {
		t.Error("400-service.yaml: the key's Secret is required, so a deployment without E2B does not start")
	}
	if rt.Optional {
		t.Error("310-router.yaml: the key's Secret is optional, so the router would start unable to check tokens")
	}
	if !rt.ReadOnly {
		t.Error("310-router.yaml: the key's mount is writable")
	}
	found := false
	for _, e := range fnSpec.Containers[0].Env {
		if e.Name == "SANDBOX_ENVD_IMAGE" && e.ValueFrom == nil {
			found = true
		}
	}
	if !found {
		t.Error("400-service.yaml has no plain SANDBOX_ENVD_IMAGE for make deploy (hack/deploy.sh's replacement) to set")
	}
}
