package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCompare: a figure more than 25 % worse than its record is reported
// (a latency higher, a rate lower), one within 25 % or better is not, one
// with no record is listed as such, and the record is the block after the
// marker only.
func TestCompare(t *testing.T) {
	record := "# Performance\n\n```\nBenchmarkE2BWake 1 9 wake-p50-ms\n```\n\n" + recordMarker + "\n\n```\n" +
		"BenchmarkE2BWake 1 2000 wake-p50-ms 2 warm-p50-ms\n" +
		"BenchmarkProvisioner 1 60 create-c8-ops/s 20 create-c1-p50-ms\n" +
		"BenchmarkRealNode/gvisor 1 700 ready-p50-ms\nBenchmarkRealNode/runc 1 300 ready-p50-ms\n```\n"
	tests := []struct {
		name string
		run  string
		want []string
	}{{
		name: "a latency and a rate more than 25 % worse",
		run: "goos: linux\nBenchmarkE2BWake-2 1 123 ns/op 2600 wake-p50-ms 2.4 warm-p50-ms\nBenchmarkProvisioner-2 1 5 ns/op 47 create-c8-ops/s 19 create-c1-p50-ms\n" +
			"BenchmarkRealNode/gvisor-2 1 5 ns/op 710 ready-p50-ms\nBenchmarkRealNode/runc-2 1 5 ns/op 400 ready-p50-ms\nPASS\n",
		want: []string{
			"benchcompare: 3 figures more than 25 % worse than docs/performance.md records:",
			"  E2BWake wake-p50-ms: 2600, recorded 2000 (+30 %)",
			"  Provisioner create-c8-ops/s: 47, recorded 60 (-22 %)",
			"  RealNode/runc ready-p50-ms: 400, recorded 300 (+33 %)",
		},
	}, {
		name: "within 25 %, or better",
		run:  "BenchmarkE2BWake-2 1 1 ns/op 1200 wake-p50-ms 2.5 warm-p50-ms\nBenchmarkProvisioner-2 1 1 ns/op 49 create-c8-ops/s 25 create-c1-p50-ms\n",
		want: []string{"benchcompare: no figure of this run is more than 25 % worse than docs/performance.md records (4 compared)"},
	}, {
		name: "a figure with no record",
		run:  "BenchmarkRouterUnderPrincipalFlood-2 1 1 ns/op 1.4 flood-ratio-x\n",
		want: []string{
			"benchcompare: no figure of this run is more than 25 % worse than docs/performance.md records (0 compared)",
			"benchcompare: figures with no record yet (add them to its block):",
			"  RouterUnderPrincipalFlood flood-ratio-x = 1.4",
		},
	}}
	dir := t.TempDir()
	md := filepath.Join(dir, "performance.md")
	if err := os.WriteFile(md, []byte(record), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run := filepath.Join(dir, "run"+string(rune('a'+i))+".txt")
			if err := os.WriteFile(run, []byte(tc.run), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := compareFiles(md, run)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, strings.Split(strings.TrimSuffix(got, "\n"), "\n")); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestRecordMustBeThere: a record without the marker, or with its block
// not closed, is an error that says so.
func TestRecordMustBeThere(t *testing.T) {
	for _, md := range []string{"# Performance\n", recordMarker + "\n```\nBenchmarkX 1 1 a-ms\n"} {
		if _, err := recordBlock([]byte(md)); err == nil {
			t.Errorf("recordBlock(%q) = nil error; want one", md)
		}
	}
}

// TestTheRecordReads: docs/performance.md's block of figures of record is
// there and in Go's benchmark format, with every benchmark in it.
func TestTheRecordReads(t *testing.T) {
	md, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "performance.md"))
	if err != nil {
		t.Fatal(err)
	}
	block, err := recordBlock(md)
	if err != nil {
		t.Fatal(err)
	}
	got, err := figures(strings.NewReader(string(block)), "performance.md")
	if err != nil {
		t.Fatal(err)
	}
	benches := map[string]bool{}
	for f := range got {
		benches[f.bench] = true
	}
	for _, b := range []string{"Provisioner", "RealNodeCreateToReady/gVisor", "E2BWake", "RouterUnderPrincipalFlood", "ColdStartFromZero"} {
		if !benches[b] {
			t.Errorf("the record has no figure of %s (it has %v)", b, benches)
		}
	}
}
