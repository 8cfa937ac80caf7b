package knative

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// SystemNamespaces are where Install runs things, and the Deployments in
// them it waits for.
var SystemNamespaces = []string{"kube-system", "knative-serving", "knative-eventing", "traefik"}

// NodeTaint is what the Knative cluster puts on its kwok nodes: nothing of
// Knative, nor the function's revision, nor a sandbox lands there.
var NodeTaint = corev1.Taint{Key: "kwok.x-k8s.io/node", Value: "fake", Effect: corev1.TaintEffectNoSchedule}

// APIServerSANs are the names the API server's certificate needs beyond
// kwokctl's for Pods' in-cluster clients: the kubernetes Service's address.
var APIServerSANs = []string{"10.96.0.1"}

// ImageArchives are the images hack/install-knative.sh packed, for the real
// node to import.
func ImageArchives(cacheDir string) ([]string, error) {
	dir := envOr("KNATIVE_IMAGES_DIR", filepath.Join(cacheDir, "knative-images"))
	files, err := filepath.Glob(filepath.Join(dir, "*.tar"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no Knative images in %s: run hack/install-knative.sh (make knative) first", dir)
	}
	return files, nil
}

// Install puts CoreDNS, Knative Serving and Eventing and Traefik on the
// cluster and waits until every Deployment of theirs is Available. repoRoot
// locates hack/knative (CoreDNS's and Traefik's manifests, ours) and the
// wrapper modules naming Knative's versions.
func Install(ctx context.Context, cfg *rest.Config, repoRoot string, s Settings, logf func(string, ...any)) error {
	src, err := FindSources(repoRoot)
	if err != nil {
		return err
	}
	knative, err := Render(src, DefaultVersions(), s)
	if err != nil {
		return err
	}
	var ours []*unstructured.Unstructured
	for _, f := range []string{"coredns.yaml", "traefik.yaml"} {
		raw, err := os.ReadFile(filepath.Join(repoRoot, "hack", "knative", f))
		if err != nil {
			return err
		}
		objs, err := decode(raw)
		if err != nil {
			return fmt.Errorf("hack/knative/%s: %w", f, err)
		}
		ours = append(ours, objs...)
	}
	all := append(ours, knative...)
	slices.SortStableFunc(all, func(a, b *unstructured.Unstructured) int { return rank(a) - rank(b) })

	a, err := newApplier(cfg)
	if err != nil {
		return err
	}
	first := slices.IndexFunc(all, func(o *unstructured.Unstructured) bool { return rank(o) > 1 })
	logf("applying %d namespaces and CRDs", first)
	if err := a.apply(ctx, all[:first]); err != nil {
		return err
	}
	if err := a.waitEstablished(ctx, all[:first]); err != nil {
		return err
	}
	a.mapper.Reset()
	logf("applying %d objects of CoreDNS, Traefik and Knative", len(all)-first)
	if err := a.apply(ctx, all[first:]); err != nil {
		return err
	}
	start := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 6*time.Minute, true, func(ctx context.Context) (bool, error) {
		pending, err := a.unavailable(ctx)
		if err != nil {
			return false, nil
		}
		if len(pending) > 0 && time.Since(start) > 20*time.Second && int(time.Since(start).Seconds())%20 < 2 {
			logf("waiting for %s", strings.Join(pending, ", "))
		}
		return len(pending) == 0, nil
	})
	if err != nil {
		pending, _ := a.unavailable(context.WithoutCancel(ctx))
		return fmt.Errorf("Knative's Deployments not Available after %s: %s (%s): %w", time.Since(start).Round(time.Second), strings.Join(pending, ", "),
			a.whyNotReady(context.WithoutCancel(ctx)), err)
	}
	logf("CoreDNS, Traefik, Knative Serving and Eventing Available after %s", time.Since(start).Round(time.Second))
	return nil
}

var crds = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

type applier struct {
	dyn    dynamic.Interface
	client kubernetes.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(cfg *rest.Config) (*applier, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &applier{dyn: dyn, client: client,
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery()))}, nil
}

// apply server-side applies objs in order, retrying each for a while: a
// webhook whose Pod is still starting refuses what it checks.
func (a *applier) apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		var last error
		err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				a.mapper.Reset()
				last = err
				return false, nil
			}
			_, err = a.dyn.Resource(m.Resource).Namespace(o.GetNamespace()).Apply(ctx, o.GetName(), o,
				metav1.ApplyOptions{FieldManager: "knative-up", Force: true})
			last = err
			return err == nil, nil
		})
		if err != nil {
			return fmt.Errorf("applying %s %s/%s: %v", gvk.Kind, o.GetNamespace(), o.GetName(), last)
		}
	}
	return nil
}

func (a *applier) waitEstablished(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		var last string
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			u, err := a.dyn.Resource(crds).Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false, nil
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				c, _ := c.(map[string]any)
				if c["type"] == "Established" && c["status"] == "True" {
					return true, nil
				}
			}
			last = "not Established"
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s: %s", o.GetName(), last)
		}
	}
	return nil
}

// unavailable lists the Deployments in SystemNamespaces that are not yet
// Available with every replica updated.
func (a *applier) unavailable(ctx context.Context) ([]string, error) {
	var pending []string
	for _, ns := range SystemNamespaces {
		l, err := a.client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for _, d := range l.Items {
			if !available(&d) {
				pending = append(pending, ns+"/"+d.Name)
			}
		}
	}
	return pending, nil
}

// whyNotReady says, for each Pod of the system namespaces that is not
// Ready, what holds it: its phase, an unmet condition's message, and each
// container's waiting or last terminated reason (an install that times out
// then says why, not only what).
func (a *applier) whyNotReady(ctx context.Context) string {
	var out []string
	for _, ns := range SystemNamespaces {
		l, err := a.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			out = append(out, ns+": "+err.Error())
			continue
		}
		for _, p := range l.Items {
			var why []string
			ready := false
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready = true
				}
				if c.Status != corev1.ConditionTrue && c.Message != "" {
					why = append(why, string(c.Type)+": "+c.Message)
				}
			}
			if ready {
				continue
			}
			for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
				switch {
				case cs.State.Waiting != nil:
					why = append(why, cs.Name+" waiting: "+cs.State.Waiting.Reason+" "+cs.State.Waiting.Message)
				case cs.LastTerminationState.Terminated != nil:
					t := cs.LastTerminationState.Terminated
					why = append(why, fmt.Sprintf("%s exited %d: %s %s", cs.Name, t.ExitCode, t.Reason, t.Message))
				}
			}
			out = append(out, fmt.Sprintf("%s/%s %s [%s]", ns, p.Name, p.Status.Phase, strings.Join(why, "; ")))
		}
	}
	if len(out) == 0 {
		return "no Pod of theirs exists"
	}
	return strings.Join(out, "; ")
}

func available(d *appsv1.Deployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	return d.Status.ObservedGeneration >= d.Generation && d.Status.AvailableReplicas >= want && d.Status.UpdatedReplicas >= want
}
