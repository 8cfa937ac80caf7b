// Command check-templates validates sandbox template manifests offline, as
// the provisioner validates them when a create names one: every PodTemplate
// in the given files or directories must be accepted, or it prints the
// template and field refused and exits 1. Settings the checks depend on
// (bounds, the port, capabilities) come from the environment, as in the
// function, with the same defaults.
//
//	go run ./cmd/check-templates config/templates
//
// With -render it prints, instead, the workload the function builds from
// each template (a Pod, or a ReplicaSet for kind ReplicaSet) as YAML
// documents, for a manifest scanner to judge what runs, not the template
// alone (hack/verify-scan.sh).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

func main() {
	args := os.Args[1:]
	render := len(args) > 0 && args[0] == "-render"
	if render {
		args = args[1:]
	}
	if len(args) < 1 {
		fmt.Fprintln(os.Stderr, "usage: check-templates [-render] FILE|DIR...")
		os.Exit(2)
	}
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	failed, checked := 0, 0
	var workloads []runtime.Object
	for _, arg := range args {
		files, err := manifests(arg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		for _, file := range files {
			n, built, errs := checkFile(cfg, file)
			checked += n
			workloads = append(workloads, built...)
			for _, e := range errs {
				failed++
				fmt.Fprintf(os.Stderr, "%s: %v\n", file, e)
			}
		}
	}
	if failed > 0 {
		os.Exit(1)
	}
	if render {
		for _, w := range workloads {
			out, err := sigsyaml.Marshal(w)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			fmt.Printf("---\n%s", out)
		}
		return
	}
	fmt.Printf("%d sandbox templates valid\n", checked)
}

// workload is what the function creates for a sandbox of t: a create of a
// new id with a user and a thread (DeerFlow's), as BuildPodFor and
// BuildReplicaSet make it.
func workload(cfg *config.Config, t *template.Template) (runtime.Object, error) {
	user, thread := "scan", "scan"
	s, err := api.CreateRequest{SandboxID: "scan-" + t.Name, Template: t.Name, UserID: &user, ThreadID: &thread}.Validate(cfg.Objects(), time.Now())
	if err != nil {
		return nil, err
	}
	s.Caller = api.Caller{Principal: config.DefaultPrincipal}
	s.Token = "scan"
	s = resources.WithTemplate(cfg.Objects(), s, t)
	if t.Kind == template.KindReplicaSet {
		return resources.BuildReplicaSet(cfg.Objects(), s), nil
	}
	return resources.BuildPodFor(cfg.Objects(), s), nil
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
func checkFile(cfg *config.Config, file string) (int, []runtime.Object, []error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, nil, []error{err}
	}
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	var (
		errs  []error
		built []runtime.Object
	)
	n := 0
	for {
		var pt corev1.PodTemplate
		err := dec.Decode(&pt)
		if errors.Is(err, io.EOF) {
			return n, built, errs
		}
		if err != nil {
			return n, built, append(errs, fmt.Errorf("not a valid manifest: %w", err))
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
		t, err := template.FromPodTemplateIn(&pt, cfg.Objects(), template.TenancyOf(&cfg.AuthConfig))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		w, err := workload(cfg, t)
		if err != nil {
			errs = append(errs, fmt.Errorf("PodTemplate %q: the workload it becomes: %w", pt.Name, err))
			continue
		}
		built = append(built, w)
	}
}
