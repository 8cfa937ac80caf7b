package config

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kelseyhightower/envconfig"
)

// variableNames lists every environment variable Load reads, as envconfig
// itself derives them from Config (its Usagef walks the struct the way
// Process does), sorted.
func variableNames(t *testing.T) []string {
	t.Helper()
	var buf bytes.Buffer
	if err := envconfig.Usagef("", &Config{}, &buf, "{{range .}}{{usage_key .}}\n{{end}}"); err != nil {
		t.Fatal(err)
	}
	names := strings.Fields(buf.String())
	slices.Sort(names)
	return names
}

// variableDefaults maps every variable's name to its declared default ("" for
// none), as envconfig reads it from the tags.
func variableDefaults(t *testing.T) map[string]string {
	t.Helper()
	var buf bytes.Buffer
	if err := envconfig.Usagef("", &Config{}, &buf, "{{range .}}{{usage_key .}}\t{{usage_default .}}\n{{end}}"); err != nil {
		t.Fatal(err)
	}
	defaults := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		name, def, _ := strings.Cut(line, "\t")
		defaults[name] = def
	}
	return defaults
}

// TestVariableNames pins the set of variable names: deployments set them, so
// a field moved or renamed in Config must not rename one. A variable added on
// purpose is added to testdata/variables.txt (sorted, one per line).
func TestVariableNames(t *testing.T) {
	raw, err := os.ReadFile("testdata/variables.txt")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Fields(string(raw))
	got := variableNames(t)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("environment variables (-testdata/variables.txt +Config):\n%s", diff)
	}
	if dups := len(got) - len(slices.Compact(slices.Clone(got))); dups > 0 {
		t.Errorf("%d variable names are read by more than one field", dups)
	}
}
