package config

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// configurationDoc is the configuration reference, which names every variable.
const configurationDoc = "../../docs/configuration.md"

var codeSpan = regexp.MustCompile("`([^`]*)`")

// docRows returns the cells of every Markdown table row of the reference
// whose first cell is a code span, keyed by that span (a variable's name).
func docRows(t *testing.T) (doc string, rows map[string][]string) {
	t.Helper()
	raw, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows = map[string][]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if m := codeSpan.FindStringSubmatch(cells[0]); m != nil && m[0] == cells[0] {
			rows[m[1]] = cells
		}
	}
	return string(raw), rows
}

// TestConfigurationDocNamesEveryVariable fails naming each variable Load
// reads that docs/configuration.md does not mention, as `NAME` or in a
// table cell.
func TestConfigurationDocNamesEveryVariable(t *testing.T) {
	doc, rows := docRows(t)
	named := map[string]bool{}
	for _, m := range codeSpan.FindAllStringSubmatch(doc, -1) {
		named[m[1]] = true
	}
	for _, cells := range rows {
		for _, c := range cells {
			named[strings.Trim(c, "`")] = true
		}
	}
	var missing []string
	for _, name := range variableNames(t) {
		if !named[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%s does not name %d variables: %s", configurationDoc, len(missing), strings.Join(missing, ", "))
	}
}

// TestConfigurationDocRows keeps the tables true: every row is a variable
// Load reads, and a default written as a code span is the one the code
// declares ("unset" for none); prose such as "see below" is not checked.
func TestConfigurationDocRows(t *testing.T) {
	_, rows := docRows(t)
	defaults := variableDefaults(t)
	for _, name := range slices.Sorted(maps.Keys(rows)) {
		cells := rows[name]
		want, ok := defaults[name]
		switch {
		case !ok:
			t.Errorf("%s has a row for %s, which Load does not read", configurationDoc, name)
		case len(cells) != 3:
			t.Errorf("%s: the row of %s has %d cells, want 3 (name, default, what it does)", configurationDoc, name, len(cells))
		case cells[1] == "unset" && want != "":
			t.Errorf("%s: %s's default is %q, not unset", configurationDoc, name, want)
		case strings.HasPrefix(cells[1], "`") && cells[1] != "`"+want+"`":
			if want == "" {
				want = "unset"
			} else {
				want = "`" + want + "`"
			}
			t.Errorf("%s: %s's default is %s, want %s", configurationDoc, name, cells[1], want)
		}
	}
}
