//go:build e2e

package bench

import (
	"bufio"
	"fmt"
	"io"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/deerflow-sandbox/provisioner/pkg/metrics"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// kubeCalls is what the function has asked the API server so far, from
// its own metrics: for each "verb resource", the calls and their summed
// latency in seconds.
type kubeCalls map[string]struct{ n, secs float64 }

const kubeDurationSeries = "sandbox_provisioner_kube_request_duration_seconds"

// scrapeKubeCalls reads the function's kube_request_duration_seconds
// histograms (watches are not in them: their duration is how long they
// stayed open).
func scrapeKubeCalls(fn *function.Instance) (kubeCalls, error) {
	resp, err := fn.Client.Get(fn.URL + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return parseKubeCalls(resp.Body)
}

// timedClient is a client of rc whose calls are timed as the function
// times its own (metrics.WrapTransport), so that a floor's calls can be
// set beside the function's; calls reads what it has timed so far.
func timedClient(rc *rest.Config) (client kubernetes.Interface, calls func() (kubeCalls, error), err error) {
	m := metrics.New()
	rc = rest.CopyConfig(rc)
	rc.Wrap(m.WrapTransport)
	if client, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, nil, err
	}
	return client, func() (kubeCalls, error) {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return parseKubeCalls(rec.Body)
	}, nil
}

func parseKubeCalls(r io.Reader) (kubeCalls, error) {
	out := kubeCalls{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		var sum bool
		switch {
		case strings.HasPrefix(line, kubeDurationSeries+"_sum{"):
			sum = true
		case strings.HasPrefix(line, kubeDurationSeries+"_count{"):
		default:
			continue
		}
		labels := line[strings.IndexByte(line, '{')+1 : strings.IndexByte(line, '}')]
		var verb, resource string
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			v = strings.Trim(v, `"`)
			switch k {
			case "verb":
				verb = v
			case "resource":
				resource = v
			}
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		c := out[verb+" "+resource]
		if sum {
			c.secs = v
		} else {
			c.n = v
		}
		out[verb+" "+resource] = c
	}
	return out, sc.Err()
}

// add adds after minus before to k: the calls made in between.
func (k kubeCalls) add(before, after kubeCalls) {
	for name, a := range after {
		b := before[name]
		c := k[name]
		c.n += a.n - b.n
		c.secs += a.secs - b.secs
		k[name] = c
	}
}

// table prints k as markdown rows, per claim of the n measured, the
// busiest first, beside the floor's calls (fk, over its fn claims).
func (k kubeCalls) table(n int, fk kubeCalls, fn int) string {
	names := make([]string, 0, len(k))
	total := 0.0
	for name, c := range k {
		if c.n > 0 {
			names = append(names, name)
			total += c.n
		}
	}
	ftotal := 0.0
	for name, c := range fk {
		if c.n > 0 && k[name].n == 0 {
			names = append(names, name)
		}
		ftotal += c.n
	}
	sort.Slice(names, func(i, j int) bool { return k[names[i]].secs > k[names[j]].secs })
	per := func(c struct{ n, secs float64 }, n int) string {
		if c.n == 0 || n == 0 {
			return " | "
		}
		return fmt.Sprintf(" %.2f | %.1f ", c.n/float64(n), 1000*c.secs/c.n)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| API call | ours per claim | ours mean ms | floor per claim | floor mean ms |\n|---|---|---|---|---|\n")
	for _, name := range names {
		fmt.Fprintf(&b, "| %s |%s|%s|\n", name, per(k[name], n), per(fk[name], fn))
	}
	fmt.Fprintf(&b, "| all | %.2f | | %.2f | |\n", total/float64(max(n, 1)), ftotal/float64(max(fn, 1)))
	return b.String()
}
