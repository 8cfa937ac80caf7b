package realnode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// ProxyName is the egress proxy's Deployment and Service, as config/ names
// them.
const ProxyName = "sandbox-egress-proxy"

// DeployProxy applies the egress proxy's manifest (config/300-egress-
// proxy.yaml) into ns and waits until its replicas are Ready: as shipped,
// but for what this machine needs, each a stand-in said here:
//   - the image: ProxyImage, built here from cmd/proxy, never pulled;
//   - the node: the real node (its selector and toleration);
//   - the proxy's resolver: the public host's zone (PublicResolver), the
//     "internet DNS" of the fake internet; the cluster's DNS stand-in
//     answers every name with one address.
//
// `make run NODE=real` and the real-node tests both deploy it this way.
func DeployProxy(ctx context.Context, client kubernetes.Interface, manifest, ns string) error {
	return deploy(ctx, client, manifest, ns, ProxyName, ProxyImage, corev1.EnvVar{Name: "PROXY_RESOLVER", Value: PublicResolver})
}

// RouterName is the E2B router's Deployment and Service, as config/ names
// them; RouterKeySecret the Secret of the key it checks tokens with.
const (
	RouterName      = "sandbox-router"
	RouterKeySecret = "sandbox-e2b-key"
)

// DeployRouter applies the E2B router's manifest (config/310-router.yaml)
// into ns, with key as its token key (the Secret RouterKeySecret, which an
// operator creates: no key is shipped), and waits until its replicas are
// Ready. As shipped, but for the image (RouterImage, built here) and the
// node (the real node).
func DeployRouter(ctx context.Context, client kubernetes.Interface, manifest, ns string, key []byte) error {
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s for the router: %w", ns, err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: RouterKeySecret, Namespace: ns}, Data: map[string][]byte{"key": key}}
	if _, err := client.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = client.CoreV1().Secrets(ns).Update(ctx, secret, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("the router's key: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("the router's key: %w", err)
	}
	return deploy(ctx, client, manifest, ns, RouterName, RouterImage, corev1.EnvVar{Name: "E2B_DOMAIN", Value: E2BDomain})
}

// E2BDomain is the E2B_DOMAIN the tests give the router and the function:
// under .test (RFC 2606), which no resolver answers, so the tests reach
// <port>-<id>.<domain> by setting the Host on a request to the router's
// own address, as an ingress with a wildcard rule would pass it on.
const E2BDomain = "e2b.sandbox.test"

// deploy applies a component's manifest into ns, its Deployment on the real
// node with image and env added, and waits until its replicas are Ready.
func deploy(ctx context.Context, client kubernetes.Interface, manifest, ns, name, image string, env ...corev1.EnvVar) error {
	objs, err := readManifest(manifest)
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s for %s: %w", ns, name, err)
	}
	for _, o := range objs {
		o.SetNamespace(ns)
		switch o.GetKind() {
		case "RoleBinding":
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				if m, ok := s.(map[string]any); ok {
					m["namespace"] = ns
				}
			}
			if err := unstructured.SetNestedSlice(o.Object, subjects, "subjects"); err != nil {
				return err
			}
		case "Deployment":
			if err := onTheRealNode(o, image, env); err != nil {
				return err
			}
		}
		if err := apply(ctx, client, o); err != nil {
			return err
		}
	}
	return poll(ctx, 90*time.Second, name+"'s replicas Ready", func(ctx context.Context) (bool, error) {
		d, err := client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		want := ptr.Deref(d.Spec.Replicas, 1)
		return d.Status.ReadyReplicas == want && d.Status.Replicas == want, fmt.Errorf("%d of %d Ready", d.Status.ReadyReplicas, want)
	})
}

// onTheRealNode points a Deployment at this machine's stand-ins.
func onTheRealNode(o *unstructured.Unstructured, image string, env []corev1.EnvVar) error {
	var d appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
		return err
	}
	spec := &d.Spec.Template.Spec
	spec.NodeSelector = map[string]string{NodeLabel: "true"}
	spec.Tolerations = append(spec.Tolerations, Toleration)
	spec.TerminationGracePeriodSeconds = ptr.To[int64](2)
	if len(spec.Containers) != 1 {
		return fmt.Errorf("the Deployment %s has %d containers, want 1", d.Name, len(spec.Containers))
	}
	c := &spec.Containers[0]
	c.Image, c.ImagePullPolicy = image, corev1.PullNever
	for _, e := range env {
		// A variable the manifest names takes the test's value.
		if i := slices.IndexFunc(c.Env, func(v corev1.EnvVar) bool { return v.Name == e.Name }); i >= 0 {
			c.Env[i] = e
		} else {
			c.Env = append(c.Env, e)
		}
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&d)
	if err != nil {
		return err
	}
	u["apiVersion"], u["kind"] = "apps/v1", "Deployment"
	o.Object = u
	return nil
}

// readManifest decodes every object of a YAML file.
func readManifest(file string) ([]*unstructured.Unstructured, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// apply server-side-applies o through the typed client of its group (the
// manifest's kinds are known, so no discovery).
func apply(ctx context.Context, client kubernetes.Interface, o *unstructured.Unstructured) error {
	var rc rest.Interface
	var resource string
	switch o.GetKind() {
	case "ServiceAccount":
		rc, resource = client.CoreV1().RESTClient(), "serviceaccounts"
	case "Service":
		rc, resource = client.CoreV1().RESTClient(), "services"
	case "Role":
		rc, resource = client.RbacV1().RESTClient(), "roles"
	case "RoleBinding":
		rc, resource = client.RbacV1().RESTClient(), "rolebindings"
	case "Deployment":
		rc, resource = client.AppsV1().RESTClient(), "deployments"
	case "NetworkPolicy":
		rc, resource = client.NetworkingV1().RESTClient(), "networkpolicies"
	case "PodDisruptionBudget":
		rc, resource = client.PolicyV1().RESTClient(), "poddisruptionbudgets"
	default:
		return fmt.Errorf("the manifest has a %s, which deploy does not know", o.GetKind())
	}
	body, err := json.Marshal(o.Object)
	if err != nil {
		return err
	}
	err = rc.Patch(types.ApplyPatchType).Namespace(o.GetNamespace()).Resource(resource).Name(o.GetName()).
		Param("fieldManager", "realnode").Param("force", "true").Body(body).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("applying %s %s: %w", o.GetKind(), o.GetName(), err)
	}
	return nil
}
