package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

func TestShippedTemplatesAreValid(t *testing.T) {
	t.Setenv("SANDBOX_ENVD_IMAGE", "") // unset, as offline; loadConfig stands one in
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	files, err := manifests(filepath.Join("..", "..", "config", "templates"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no templates under config/templates: %v", err)
	}
	for _, f := range files {
		if n, _, errs := checkFile(cfg, f); n == 0 || len(errs) > 0 {
			t.Errorf("%s: %d templates, errors %v", f, n, errs)
		}
	}
}

func TestRefusedTemplateIsReported(t *testing.T) {
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "bad.yaml")
	manifest := `apiVersion: v1
kind: PodTemplate
metadata: {name: root, labels: {sandbox.deerflow.dev/template: "true"}}
template:
  spec:
    containers: [{name: sandbox, securityContext: {privileged: true}}]
---
apiVersion: v1
kind: PodTemplate
metadata: {name: unlabelled}
template: {spec: {containers: [{name: sandbox}]}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: stray}
`
	if err := os.WriteFile(file, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	n, _, errs := checkFile(cfg, file)
	if n != 2 || len(errs) != 3 {
		t.Fatalf("%d templates, errors %v; want 2 templates and 3 errors", n, errs)
	}
	for i, want := range []string{`"root": template.spec.containers[0].securityContext.privileged`, "lacks the label", "want v1 PodTemplate"} {
		if !strings.Contains(errs[i].Error(), want) {
			t.Errorf("error %d = %v, want it to contain %q", i, errs[i], want)
		}
	}
}
