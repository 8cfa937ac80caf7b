// Package manifests checks config/ with Knative's own Go types, so a manifest
// Knative would refuse (or warn about) fails here, not at deploy time.
package manifests

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"
	"knative.dev/pkg/apis"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
)

func TestKnativeServiceValidates(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "config", "400-service.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var svc servingv1.Service
	if err := yaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&svc); err != nil {
		t.Fatal(err)
	}
	ctx := apis.WithinCreate(context.Background())
	svc.SetDefaults(ctx)
	fe := svc.Validate(ctx)
	if errs := fe.Filter(apis.ErrorLevel); errs != nil {
		t.Errorf("Knative refuses config/400-service.yaml: %v", errs)
	}
	if warns := fe.Filter(apis.WarningLevel); warns != nil {
		t.Errorf("Knative warns about config/400-service.yaml: %v", warns)
	}
	if svc.Spec.Template.Spec.ServiceAccountName != "sandbox-provisioner" {
		t.Errorf("serviceAccountName = %q", svc.Spec.Template.Spec.ServiceAccountName)
	}
	if got := svc.Spec.Template.Annotations["autoscaling.knative.dev/min-scale"]; got != "0" {
		t.Errorf("min-scale = %q, want 0 (scale to zero)", got)
	}
	if got := svc.Labels["networking.knative.dev/visibility"]; got != "cluster-local" {
		t.Errorf("visibility = %q, want cluster-local", got)
	}
}
