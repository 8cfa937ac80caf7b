// Command workloads reads manifests (YAML documents on stdin) and writes
// them back with each Knative Service rendered as the Deployment Knative
// makes of it (its Pod template, one replica), so that a manifest scanner
// that knows no Knative judges the function's Pod (hack/verify-scan.sh).
// Every other document passes through unchanged.
//
//	kubectl kustomize config | go run ./test/framework/workloads
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "workloads:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	dec := yaml.NewYAMLOrJSONDecoder(bufio.NewReader(in), 4096)
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if obj == nil {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetAPIVersion() == "serving.knative.dev/v1" && u.GetKind() == "Service" {
			if u, err = deployment(u); err != nil {
				return err
			}
		}
		b, err := sigsyaml.Marshal(u.Object)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "---\n%s", b)
	}
}

// deployment is the Deployment a Knative Service's revision runs as: its
// template's metadata and spec, its name and namespace and labels.
func deployment(svc *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	tmpl, ok, err := unstructured.NestedMap(svc.Object, "spec", "template")
	if err != nil || !ok {
		return nil, fmt.Errorf("Knative Service %s has no spec.template: %v", svc.GetName(), err)
	}
	labels, _, _ := unstructured.NestedStringMap(tmpl, "metadata", "labels")
	if labels == nil {
		labels = map[string]string{}
	}
	// As Knative labels a revision's Pods (NetworkPolicies select them so).
	labels["serving.knative.dev/service"] = svc.GetName()
	if err := unstructured.SetNestedStringMap(tmpl, labels, "metadata", "labels"); err != nil {
		return nil, err
	}
	d := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"spec": map[string]any{"replicas": int64(1), "template": tmpl},
	}}
	d.SetName(svc.GetName())
	d.SetNamespace(svc.GetNamespace())
	d.SetLabels(svc.GetLabels())
	if err := unstructured.SetNestedStringMap(d.Object, labels, "spec", "selector", "matchLabels"); err != nil {
		return nil, err
	}
	return d, nil
}
