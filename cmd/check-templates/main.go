// Command check-templates validates sandbox template manifests offline, as
// the provisioner validates them when a create names one: every PodTemplate
// in the given files or directories must be accepted, or it prints the
// template and field refused and exits 1. Settings the checks depend on
// (bounds, the port, capabilities) come from the environment, as in the
// function, with the same defaults.
//
//	go run ./cmd/check-templates config/templates
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: check-templates FILE|DIR...")
		os.Exit(2)
	}
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	failed, checked := 0, 0
	for _, arg := range os.Args[1:] {
		files, err := manifests(arg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		for _, file := range files {
			n, errs := checkFile(cfg, file)
			checked += n
			for _, e := range errs {
				failed++
				fmt.Fprintf(os.Stderr, "%s: %v\n", file, e)
			}
		}
	}
	if failed > 0 {
		os.Exit(1)
	}
	fmt.Printf("%d sandbox templates valid\n", checked)
}

// loadConfig is the function's configuration from the environment, with one
// stand-in: a template with the E2B agent (sandbox.deerflow.dev/envd) is
// refused while the agent's image is unset, and the image is the
// deployment's (make deploy sets it), not the template's, so an offline
// check names one when the environment does not.
func loadConfig() (*config.Config, error) {
	if os.Getenv("SANDBOX_ENVD_IMAGE") == "" {
		if err := os.Setenv("SANDBOX_ENVD_IMAGE", "sandbox-envd:offline-check"); err != nil {
			return nil, err
		}
	}
	return config.Load()
}

func manifests(arg string) ([]string, error) {
	st, err := os.Stat(arg)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{arg}, nil
	}
	return filepath.Glob(filepath.Join(arg, "*.yaml"))
}

// checkFile validates every PodTemplate document of file; other kinds of
// documents are an error, so a typo in kind is not silently skipped.
func checkFile(cfg *config.Config, file string) (int, []error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, []error{err}
	}
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	var errs []error
	n := 0
	for {
		var pt corev1.PodTemplate
		err := dec.Decode(&pt)
		if errors.Is(err, io.EOF) {
			return n, errs
		}
		if err != nil {
			return n, append(errs, fmt.Errorf("not a valid manifest: %w", err))
		}
		if pt.Kind != "PodTemplate" || pt.APIVersion != "v1" {
			errs = append(errs, fmt.Errorf("%s %q: want v1 PodTemplate", pt.Kind, pt.Name))
			continue
		}
		n++
		if _, ok := pt.Labels[keys.LabelTemplate]; !ok {
			errs = append(errs, fmt.Errorf("PodTemplate %q lacks the label %s, so the provisioner would not see it", pt.Name, keys.LabelTemplate))
			continue
		}
		if _, err := template.FromPodTemplateIn(&pt, cfg.Objects(), template.TenancyOf(&cfg.AuthConfig)); err != nil {
			errs = append(errs, err)
		}
	}
}
