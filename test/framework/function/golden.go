package function

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// Recorded is one request DeerFlow's backend really sent (shared/contract,
// copied to test/e2e/testdata).
type Recorded struct {
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers"`
	Body    json.RawMessage   `json:"body"`
}

// GoldenRequests reads the recording of DeerFlow's client: the seven
// requests of test/e2e/testdata/deerflow-client-requests.jsonl.
func GoldenRequests(t testing.TB) []Recorded {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	file, err := os.Open(filepath.Join(filepath.Dir(here), "..", "..", "e2e", "testdata", "deerflow-client-requests.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	var reqs []Recorded
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		var r Recorded
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	if len(reqs) != 7 {
		t.Fatalf("golden file has %d requests, want 7", len(reqs))
	}
	return reqs
}

// Eventually polls cond every interval, bounded by timeout, until it
// holds; it fails the test with cond's last error otherwise.
func Eventually(t testing.TB, timeout, interval time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		time.Sleep(interval)
	}
	t.Fatalf("%s: not true after %s (last error: %v)", what, timeout, lastErr)
}
