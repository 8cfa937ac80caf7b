//go:build e2e

package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/token"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// bareFloor is the job's floor for a create (issue 49): what any client
// must write to give a sandbox, as DeerFlow's own provisioner does, the
// Pod and then a Service that selects it. Two writes, no reads: no slot
// for a quota, no binding, no ownership record, no Event.
//
// The Service is owned by the Pod. That is free (the Pod's UID comes back
// in its create's answer, so it costs no call), it makes the two objects
// the same as those our create ends with (so the API server stores and
// the garbage collector tracks the same things on both sides), and it is
// what a client that wants its Service gone with its Pod would write.
// DeerFlow's provisioner sets no owner; an owner reference is a few dozen
// bytes of the same write.
type bareFloor struct {
	cfg    *config.Config
	client kubernetes.Interface
}

// create makes sandbox id's Pod, then its Service (the same objects as
// resources.BuildPod and BuildService make for our create, with a token).
func (f bareFloor) create(ctx context.Context, id string) error {
	spec, err := api.CreateRequest{SandboxID: id}.Validate(f.cfg.Objects(), time.Now())
	if err != nil {
		return err
	}
	spec.Token = token.New()
	pod, err := f.client.CoreV1().Pods(ns).Create(ctx, resources.BuildPod(f.cfg.Objects(), spec), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating pod %s: %w", resources.PodName(id), err)
	}
	svc := resources.BuildService(f.cfg.Objects(), spec, resources.PodOwnerRef(pod))
	if _, err := f.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating service %s: %w", svc.Name, err)
	}
	return nil
}

// remove deletes the sandboxes ids gives for 0…n-1 through client, eight at
// a time, untimed: the Pod at once (no grace: nothing runs in it that
// needs one, and a terminating Pod would still be listed by the list rows
// after), then its Service. Something already gone is not an error. It
// returns how many could not be removed and the first error.
func removeSandboxes(ctx context.Context, client kubernetes.Interface, n int, ids func(i int) string) (int, error) {
	var failed atomic.Int32
	s := run(n, 8, func(i int) error {
		id := ids(i)
		err := client.CoreV1().Pods(ns).Delete(ctx, resources.PodName(id), metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		if err != nil && !apierrors.IsNotFound(err) {
			failed.Add(1)
			return fmt.Errorf("deleting pod %s: %w", resources.PodName(id), err)
		}
		err = client.CoreV1().Services(ns).Delete(ctx, resources.ServiceName(id), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			failed.Add(1)
			return fmt.Errorf("deleting service %s: %w", resources.ServiceName(id), err)
		}
		return nil
	})
	return int(failed.Load()), s.first
}

// callColumn is one side's API calls over n creates.
type callColumn struct {
	name  string
	calls kubeCalls
	n     int
}

// isRead says whether a "verb resource" reads (get, list, watch) rather
// than writes.
func isRead(name string) bool {
	verb, _, _ := strings.Cut(name, " ")
	return verb == "get" || verb == "list" || verb == "watch"
}

// callsPerCreate prints, as markdown, each column's calls per create by
// "verb resource", the writes first, then the reads, then their totals.
// A call no column made is left out; one a column did not make is 0.
func callsPerCreate(cols []callColumn) string {
	seen := map[string]bool{}
	var names []string
	for _, c := range cols {
		for name, k := range c.calls {
			if k.n > 0 && !seen[name] {
				seen[name] = true
				names = append(names, name)
			}
		}
	}
	sort.Slice(names, func(i, j int) bool {
		if ri, rj := isRead(names[i]), isRead(names[j]); ri != rj {
			return rj
		}
		return names[i] < names[j]
	})
	per := func(calls float64, n int) string {
		if calls == 0 || n == 0 {
			return "0"
		}
		return fmt.Sprintf("%.2f", calls/float64(n))
	}
	var b strings.Builder
	b.WriteString("| calls per create |")
	for _, c := range cols {
		fmt.Fprintf(&b, " %s |", c.name)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(cols)) + "\n")
	writes, reads := make([]float64, len(cols)), make([]float64, len(cols))
	for _, name := range names {
		fmt.Fprintf(&b, "| %s |", name)
		for i, c := range cols {
			k := c.calls[name].n
			fmt.Fprintf(&b, " %s |", per(k, c.n))
			if isRead(name) {
				reads[i] += k
			} else {
				writes[i] += k
			}
		}
		b.WriteString("\n")
	}
	for _, total := range []struct {
		name string
		sums []float64
	}{{"total writes", writes}, {"total reads", reads}} {
		fmt.Fprintf(&b, "| %s |", total.name)
		for i, c := range cols {
			fmt.Fprintf(&b, " %s |", per(total.sums[i], c.n))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// perCreateMap is cols' calls per create, by column and "verb resource",
// for the JSON results.
func perCreateMap(cols []callColumn) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, c := range cols {
		m := map[string]float64{}
		for name, k := range c.calls {
			if k.n > 0 && c.n > 0 {
				m[name] = k.n / float64(c.n)
			}
		}
		out[c.name] = m
	}
	return out
}

// TestCallsPerCreate: calls are divided by each column's own creates, the
// writes come before the reads, a call one column did not make is 0 there,
// and the totals add writes and reads apart.
func TestCallsPerCreate(t *testing.T) {
	calls := func(kv ...any) kubeCalls {
		k := kubeCalls{}
		for i := 0; i < len(kv); i += 2 {
			k[kv[i].(string)] = struct{ n, secs float64 }{n: kv[i+1].(float64)}
		}
		return k
	}
	tests := []struct {
		name string
		cols []callColumn
		want string
	}{{
		name: "ours, design and bare",
		cols: []callColumn{
			{"ours", calls("create services", 200.0, "create pods", 200.0, "update services", 200.0, "create events", 20.0, "get pods", 10.0), 200},
			{"design floor", calls("create services", 100.0, "create pods", 100.0, "update services", 100.0), 100},
			{"bare floor", calls("create pods", 100.0, "create services", 100.0, "list pods", 0.0), 100},
		},
		want: "| calls per create | ours | design floor | bare floor |\n" +
			"|---|---|---|---|\n" +
			"| create events | 0.10 | 0 | 0 |\n" +
			"| create pods | 1.00 | 1.00 | 1.00 |\n" +
			"| create services | 1.00 | 1.00 | 1.00 |\n" +
			"| update services | 1.00 | 1.00 | 0 |\n" +
			"| get pods | 0.05 | 0 | 0 |\n" +
			"| total writes | 3.10 | 3.00 | 2.00 |\n" +
			"| total reads | 0.05 | 0 | 0 |\n",
	}, {
		name: "no creates measured",
		cols: []callColumn{{"ours", calls("list services", 3.0), 0}},
		want: "| calls per create | ours |\n|---|---|\n| list services | 0 |\n| total writes | 0 |\n| total reads | 0 |\n",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, callsPerCreate(tc.cols)); diff != "" {
				t.Errorf("callsPerCreate (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAlternateSides: every side runs every operation once, in chunks;
// within a chunk the sides run in the order given, or with rotate from one
// side further each chunk.
func TestAlternateSides(t *testing.T) {
	tests := []struct {
		name      string
		n, chunks int
		rotate    bool
		want      []string
	}{
		{name: "fixed", n: 4, chunks: 2,
			want: []string{"b0", "b1", "f0", "f1", "o0", "o1", "b2", "b3", "f2", "f3", "o2", "o3"}},
		{name: "rotating", n: 4, chunks: 4, rotate: true,
			want: []string{"b0", "f0", "o0", "f1", "o1", "b1", "o2", "b2", "f2", "b3", "f3", "o3"}},
		{name: "rotating chunks", n: 4, chunks: 2, rotate: true,
			want: []string{"b0", "b1", "f0", "f1", "o0", "o1", "f2", "f3", "o2", "o3", "b2", "b3"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var order []string
			side := func(name string) func(int) error {
				return func(i int) error { order = append(order, fmt.Sprintf("%s%d", name, i)); return nil }
			}
			s := alternateSides(tc.n, 1, tc.chunks, tc.rotate, side("b"), side("f"), side("o"))
			if diff := cmp.Diff(tc.want, order); diff != "" {
				t.Errorf("order (-want +got):\n%s", diff)
			}
			for i, x := range s {
				if len(x.d) != tc.n {
					t.Errorf("side %d: %d samples, want %d", i, len(x.d), tc.n)
				}
			}
		})
	}
}

// settleCalls waits until fn's count of API calls stands still for 300 ms
// (what it sends from a queue after answering, its Events, has been sent),
// for at most 5 s.
func settleCalls(b *testing.B, fn *function.Instance) {
	b.Helper()
	total := func() float64 {
		k, err := scrapeKubeCalls(fn)
		if err != nil {
			b.Fatal(err)
		}
		sum := 0.0
		for _, c := range k {
			sum += c.n
		}
		return sum
	}
	last := total()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		now := total()
		if now == last {
			return
		}
		last = now
	}
}
