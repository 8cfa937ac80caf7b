// Command benchcompare reports the figures of a `make bench` run that are
// more than 25 % worse than the figures of record in docs/performance.md,
// so a regression is seen the day it lands. It is a report, not a test: on
// a noisy two-core machine one slow figure is a place to look, not a
// verdict, so it always exits 0 once it could read both.
//
//	benchcompare docs/performance.md results/bench-<time>.txt
//
// Both hold Go's benchmark format (golang.org/x/perf/benchfmt): the run's
// figures are what each benchmark gives b.ReportMetric; the record is the
// fenced block after the line recordMarker in docs/performance.md. A unit
// ending in "/s" is better higher, every other unit better lower.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"golang.org/x/perf/benchfmt"
)

// recordMarker is the line of docs/performance.md after which the fenced
// block of the figures of record starts.
const recordMarker = "<!-- figures of record for benchcompare -->"

// worseBy is how much worse than its record a figure is reported: 25 %.
const worseBy = 1.25

// figure is one benchmark's value in one unit.
type figure struct {
	bench, unit string
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: benchcompare RECORD.md RUN.txt")
		os.Exit(2)
	}
	out, err := compareFiles(os.Args[1], os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchcompare:", err)
		os.Exit(1)
	}
	fmt.Print(out)
}

func compareFiles(recordPath, runPath string) (string, error) {
	md, err := os.ReadFile(recordPath)
	if err != nil {
		return "", err
	}
	block, err := recordBlock(md)
	if err != nil {
		return "", fmt.Errorf("%s: %w", recordPath, err)
	}
	record, err := figures(bytes.NewReader(block), recordPath)
	if err != nil {
		return "", err
	}
	f, err := os.Open(runPath)
	if err != nil {
		return "", err
	}
	defer f.Close()
	run, err := figures(f, runPath)
	if err != nil {
		return "", err
	}
	return report(record, run), nil
}

// recordBlock is the fenced block after recordMarker.
func recordBlock(md []byte) ([]byte, error) {
	_, after, ok := bytes.Cut(md, []byte(recordMarker))
	if !ok {
		return nil, fmt.Errorf("no line %q", recordMarker)
	}
	sc := bufio.NewScanner(bytes.NewReader(after))
	var block bytes.Buffer
	in := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```") && !in:
			in = true
		case strings.HasPrefix(line, "```"):
			return block.Bytes(), nil
		case in:
			block.WriteString(line + "\n")
		}
	}
	return nil, errors.New("the block after " + recordMarker + " is not closed")
}

// figures reads every benchmark result of r: the last value of each
// benchmark (its name with its sub-benchmarks, without GOMAXPROCS) in each
// unit.
func figures(r io.Reader, name string) (map[figure]float64, error) {
	out := map[figure]float64{}
	br := benchfmt.NewReader(r, name)
	for br.Scan() {
		switch rec := br.Result().(type) {
		case *benchfmt.SyntaxError:
			return nil, rec
		case *benchfmt.Result:
			for _, v := range rec.Values {
				if v.Unit == "ns/op" || v.Unit == "sec/op" {
					continue // one iteration of a whole run: not a figure
				}
				out[figure{benchName(rec.Name), v.Unit}] = v.Value
			}
		}
	}
	return out, br.Err()
}

// benchName is n without its GOMAXPROCS suffix, which differs between
// machines while the figure is the same.
func benchName(n benchfmt.Name) string {
	base, parts := n.Parts()
	name := string(base)
	for _, p := range parts {
		if p[0] != '-' {
			name += string(p)
		}
	}
	return name
}

// worse says whether got is more than worseBy worse than was.
func worse(unit string, was, got float64) bool {
	if strings.HasSuffix(unit, "/s") {
		return got*worseBy < was
	}
	return got > was*worseBy
}

func report(record, run map[figure]float64) string {
	var worseRows, unrecorded []string
	for f, got := range run {
		was, ok := record[f]
		switch {
		case !ok:
			unrecorded = append(unrecorded, fmt.Sprintf("  %s %s = %g", f.bench, f.unit, got))
		case worse(f.unit, was, got):
			worseRows = append(worseRows, fmt.Sprintf("  %s %s: %g, recorded %g (%+.0f %%)", f.bench, f.unit, got, was, (got/was-1)*100))
		}
	}
	sort.Strings(worseRows)
	sort.Strings(unrecorded)
	var b strings.Builder
	if len(worseRows) == 0 {
		fmt.Fprintf(&b, "benchcompare: no figure of this run is more than 25 %% worse than docs/performance.md records (%d compared)\n", len(run)-len(unrecorded))
	} else {
		fmt.Fprintf(&b, "benchcompare: %d figures more than 25 %% worse than docs/performance.md records:\n%s\n", len(worseRows), strings.Join(worseRows, "\n"))
	}
	if len(unrecorded) > 0 {
		fmt.Fprintf(&b, "benchcompare: figures with no record yet (add them to its block):\n%s\n", strings.Join(unrecorded, "\n"))
	}
	return b.String()
}
