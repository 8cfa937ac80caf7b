package e2bsdk

import (
	"bufio"
	"context"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseBenchReport(t *testing.T) {
	report := `{"template":"e2b","rounds":2,"create_ms":{"n":2,"samples":[10,20]},"run_true_ms":{"n":1,"samples":[3]},"first_run_failures":["once"]}`
	tests := []struct {
		name    string
		out     string
		want    BenchReport
		wantErr string
	}{
		{name: "stdout alone", out: report + "\n",
			want: BenchReport{Template: "e2b", Rounds: 2, Create: Summary{N: 2, Samples: []float64{10, 20}}, RunTrue: Summary{N: 1, Samples: []float64{3}}, FirstRunFailures: []string{"once"}}},
		{name: "after its progress", out: "round 1/2: create 10 ms\nround 2/2: create 20 ms\n" + report + "\n\n",
			want: BenchReport{Template: "e2b", Rounds: 2, Create: Summary{N: 2, Samples: []float64{10, 20}}, RunTrue: Summary{N: 1, Samples: []float64{3}}, FirstRunFailures: []string{"once"}}},
		{name: "no report last", out: report + "\nSIGINT: killing this run's sandboxes\n", wantErr: "bench.mjs's last line is not its JSON report"},
		{name: "nothing", out: " \n", wantErr: "bench.mjs printed nothing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBenchReport([]byte(tc.out))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseBenchReport: %v; want an error saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseBenchReport (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSummaryDurations(t *testing.T) {
	got := Summary{N: 2, Samples: []float64{1.5, 200}}.Durations()
	if diff := cmp.Diff([]time.Duration{1500 * time.Microsecond, 200 * time.Millisecond}, got); diff != "" {
		t.Errorf("Durations (-want +got):\n%s", diff)
	}
}

// TestCommandInterrupts: when its context ends, the command is sent
// SIGINT, which a script traps to kill its sandboxes, with env and dir
// given. A shell stands in for node.
func TestCommandInterrupts(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatalf("no sh, which stands in for node here (every supported machine has one): %v", err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := Command(ctx, dir, map[string]string{"E2BSDK_TEST": "given"},
		"-c", `trap 'echo "interrupted in $(pwd) with $E2BSDK_TEST"; exit 0' INT; echo ready; while :; do sleep 0.05; done`)
	cmd.Path, cmd.Args[0] = sh, "sh"
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(stdout)
	if line, err := r.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("the script's first line: %q %v", line, err)
	}
	cancel()
	rest, _ := io.ReadAll(r)
	_ = cmd.Wait()
	if want := "interrupted in " + dir + " with given\n"; string(rest) != want {
		t.Errorf("after the context ended the script said %q; want %q (SIGINT, not a kill)", rest, want)
	}
	if cmd.WaitDelay != waitDelay {
		t.Errorf("WaitDelay %v; want %v", cmd.WaitDelay, waitDelay)
	}
}
