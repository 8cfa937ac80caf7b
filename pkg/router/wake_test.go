package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	listersappsv1 "k8s.io/client-go/listers/apps/v1"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/fairness"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// sleeper is sandbox abc, paused until woken: then, after ready, its Pod
// is Ready (a stand-in for the Pod and ReplicaSet caches: the wake's own
// API calls are Scaler's, tested below on a fake clientset). gone makes
// its Service go instead.
type sleeper struct {
	woken atomic.Int32
	at    atomic.Int64 // when woken, unix nanoseconds
	ready time.Duration
	// unready: for so long after ready, the Pod runs with its IP but is
	// not yet reported Ready (the kubelet's next probe).
	unready time.Duration
	gone    bool
	err     error // Wake's answer
	// failure: while resuming, the ReplicaSet's controller reports that
	// it could not make the Pod (Target.Failure).
	failure string
}

func (s *sleeper) Resolve(id string) (Target, error) {
	if id != "abc" {
		return Target{}, fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	at := s.at.Load()
	switch {
	case at == 0:
		t := abc
		t.IP, t.Paused = "", true
		return t, fmt.Errorf("sandbox abc: %w", ErrPaused)
	case s.gone:
		return Target{}, fmt.Errorf("sandbox abc: %w", ErrGone)
	case time.Since(time.Unix(0, at)) < s.ready:
		// Resuming: the Cache says paused until the Pod runs.
		t := abc
		t.IP, t.Failure = "", s.failure
		return t, fmt.Errorf("sandbox abc: %w", ErrPaused)
	}
	t := abc
	t.Ready = time.Since(time.Unix(0, at)) >= s.ready+s.unready
	return t, nil
}

func (s *sleeper) Wake(context.Context, string) error {
	s.woken.Add(1)
	if s.err != nil {
		return s.err
	}
	s.at.CompareAndSwap(0, time.Now().UnixNano())
	return nil
}

// traffic is a request for abc's port 8080 with its traffic token (or
// with token, when not empty).
func traffic(token string) map[string]string {
	if token == "" {
		token = trafficToken
	}
	return map[string]string{HeaderSandboxID: "abc", HeaderSandboxPort: "8080", HeaderTrafficToken: token}
}

// TestWakesAPausedSandboxOnce: ten requests at once for a paused sandbox
// that resumes on traffic start one resume, are held until its Pod is
// Ready, and are all forwarded; a request without the token wakes nothing.
func TestWakesAPausedSandboxOnce(t *testing.T) {
	s := &sleeper{ready: 300 * time.Millisecond}
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }, func(o *Options) {
		o.Resolver, o.Waker = s, s
	})
	// Without the token: 401, and no resume.
	resp, err := http.DefaultClient.Do(h.request(t, "GET", nil, traffic("wrong")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || s.woken.Load() != 0 {
		t.Fatalf("a wrong token: %d, %d resumes; want 401 and none", resp.StatusCode, s.woken.Load())
	}
	var wg sync.WaitGroup
	codes := make([]int, 10)
	start := time.Now()
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.DefaultClient.Do(h.request(t, "GET", nil, traffic("")))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if string(b) == "hello" {
				codes[i] = resp.StatusCode
			}
		}()
	}
	wg.Wait()
	want := []int{200, 200, 200, 200, 200, 200, 200, 200, 200, 200}
	if diff := cmp.Diff(want, codes); diff != "" {
		t.Errorf("held requests' answers (-want +got):\n%s", diff)
	}
	if n := s.woken.Load(); n != 1 {
		t.Errorf("%d resumes for ten requests at once; want 1", n)
	}
	if took := time.Since(start); took < s.ready {
		t.Errorf("answered after %s, before the Pod was Ready (%s)", took, s.ready)
	}
	var m dto.Metric
	if err := h.metrics.wakes.WithLabelValues("resumed").(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetHistogram().GetSampleCount(); n != 10 {
		t.Errorf("sandbox_router_wake_seconds{outcome=resumed} counts %d held requests; want 10", n)
	}
}

// TestWakeFailures: each way a wake can fail answers at once or within the
// hold, with a body: the resume refused (503), the next Pod refused (503
// with the ReplicaSet controller's reason, as soon as it says so, not at
// the hold's end), the Pod not Ready within the hold (503), the sandbox
// deleted while requests wait (E2B's 502 for a sandbox gone), and the held
// requests' bound reached (429).
func TestWakeFailures(t *testing.T) {
	cases := []struct {
		name    string
		sleeper *sleeper
		hold    time.Duration
		code    int
		says    string
	}{
		{"resume refused", &sleeper{err: errors.New("forbidden")}, time.Second, 503, "could not be resumed: forbidden"},
		{"the next Pod refused", &sleeper{ready: time.Hour, failure: "FailedCreate: pods \"sandbox-abc-x\" is forbidden: exceeded quota"}, 30 * time.Second, 503,
			"could not be resumed: FailedCreate: pods \"sandbox-abc-x\" is forbidden: exceeded quota"},
		{"not Ready in time", &sleeper{ready: time.Hour}, 300 * time.Millisecond, 503, "did not resume within 300ms"},
		{"deleted while waiting", &sleeper{gone: true}, time.Second, 502, SandboxNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {}, func(o *Options) {
				o.Resolver, o.Waker, o.WakeHold = c.sleeper, c.sleeper, c.hold
			})
			start := time.Now()
			resp, err := http.DefaultClient.Do(h.request(t, "GET", nil, traffic("")))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			msg, _ := body["message"].(string)
			if resp.StatusCode != c.code || body["code"] != float64(c.code) || !strings.Contains(msg, c.says) {
				t.Errorf("= %d %v; want %d saying %q", resp.StatusCode, body, c.code, c.says)
			}
			if took := time.Since(start); took > c.hold+time.Second || c.sleeper.failure != "" && took > 2*time.Second {
				t.Errorf("answered after %s; want within the hold (%s), and at once when the controller says why", took, c.hold)
			}
		})
	}
	t.Run("too many held", func(t *testing.T) {
		s := &sleeper{ready: time.Hour}
		h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {}, func(o *Options) {
			o.Resolver, o.Waker, o.WakeHold, o.MaxHeld = s, s, 2*time.Second, 2
		})
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if resp, err := http.DefaultClient.Do(h.request(t, "GET", nil, traffic(""))); err == nil {
					resp.Body.Close()
				}
			}()
		}
		deadline := time.Now().Add(2 * time.Second)
		for s.woken.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // both held
		resp, err := http.DefaultClient.Do(h.request(t, "GET", nil, traffic("")))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("a third request while two are held (bound 2) = %d; want 429", resp.StatusCode)
		}
		wg.Wait()
	})
}

// pausedSandbox is a paused ReplicaSet sandbox abc and its Service, owned
// by it, as the function makes them.
func pausedSandbox(autoResume bool) (*appsv1.ReplicaSet, *corev1.Service) {
	labels := map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelID: "abc"}
	ann := map[string]string{keys.AnnotationPrincipal: "alice", keys.AnnotationCreatedAt: abc.Sandbox.CreatedAt,
		keys.AnnotationIdleTimeout: "60", keys.AnnotationMaxLifetime: "3600", keys.AnnotationLastActivity: abc.Sandbox.CreatedAt}
	if autoResume {
		ann[keys.AnnotationAutoResume] = "true"
	}
	tmpl := map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelID: "abc", LabelEnvd: LabelEnvdValue}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox-abc", Namespace: "ns", UID: "rs-uid", Labels: labels, Annotations: ann, ResourceVersion: "7"},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](0), Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: tmpl, Annotations: map[string]string{keys.AnnotationPrincipal: "alice", keys.AnnotationCreatedAt: abc.Sandbox.CreatedAt}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}}},
		}},
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: resources.ServiceName("abc"), Namespace: "ns", Labels: labels,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "sandbox-abc", UID: "rs-uid", Controller: ptr.To(true)}}}}
	return rs, svc
}

// TestCacheTellsAPausedSandbox: a paused ReplicaSet that owns the
// sandbox's Service and resumes on traffic is ErrPaused, with the Target
// its tokens are bound to; one that does not resume on traffic, or owns
// another Service, is not found, as a paused sandbox always was.
func TestCacheTellsAPausedSandbox(t *testing.T) {
	cases := []struct {
		name       string
		autoResume bool
		otherOwner bool
		podGoing   bool // its Pod still runs: the controller has yet to take it away
		wantErr    error
	}{
		{"resumes on traffic", true, false, false, ErrPaused},
		{"resumes on traffic, its Pod not yet taken away", true, false, true, ErrPaused},
		{"does not", false, false, false, ErrNotFound},
		{"another's Service", true, true, false, ErrNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs, svc := pausedSandbox(c.autoResume)
			if c.otherOwner {
				svc.OwnerReferences[0].UID = "someone-else"
			}
			var pods []runtime.Object
			if c.podGoing {
				p := &corev1.Pod{ObjectMeta: *rs.Spec.Template.ObjectMeta.DeepCopy(), Spec: rs.Spec.Template.Spec,
					Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.7", PodIPs: []corev1.PodIP{{IP: "10.244.0.7"}}}}
				p.Name, p.Namespace = "sandbox-abc-x7k2q", "ns"
				p.Labels = map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelID: "abc", LabelEnvd: LabelEnvdValue, keys.LabelToken: "t"}
				svc.Spec.Selector = map[string]string{keys.LabelID: "abc", keys.LabelToken: "t"}
				pods = append(pods, p)
			}
			services := indexOf(t, svc)
			c2 := Cache{
				Pods:        indexOf(t, pods...),
				Services:    listerscorev1.NewServiceLister(services).Services("ns"),
				Wires:       listerscorev1.NewServiceLister(indexOf(t)).Services("ns"),
				ReplicaSets: listersappsv1.NewReplicaSetLister(indexOf(t, rs)).ReplicaSets("ns"),
			}
			got, err := c2.Resolve("abc")
			if !errors.Is(err, c.wantErr) || c.wantErr == ErrPaused != errors.Is(err, ErrPaused) {
				t.Fatalf("Resolve = %v; want %v", err, c.wantErr)
			}
			if c.wantErr == ErrPaused {
				want := Target{Pod: "sandbox-abc", Sandbox: abc.Sandbox, Envd: true, Ports: []int32{8080}, Paused: true}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("paused Target (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// TestCacheTellsAFailedResume: a resuming ReplicaSet whose status, of the
// resume's own generation, says its controller could not make the Pod gives
// the Target that reason; one from before the resume (an older observed
// generation) or none gives none.
func TestCacheTellsAFailedResume(t *testing.T) {
	failed := appsv1.ReplicaSetCondition{Type: appsv1.ReplicaSetReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate", Message: "exceeded quota"}
	cases := []struct {
		name     string
		observed int64
		conds    []appsv1.ReplicaSetCondition
		want     string
	}{
		{"refused, as seen after the resume", 3, []appsv1.ReplicaSetCondition{failed}, "FailedCreate: exceeded quota"},
		{"refused before the resume", 2, []appsv1.ReplicaSetCondition{failed}, ""},
		{"no failure", 3, nil, ""},
		{"a failure cleared", 3, []appsv1.ReplicaSetCondition{{Type: appsv1.ReplicaSetReplicaFailure, Status: corev1.ConditionFalse}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs, svc := pausedSandbox(true)
			rs.Spec.Replicas, rs.Generation = ptr.To[int32](1), 3
			rs.Status.ObservedGeneration, rs.Status.Conditions = c.observed, c.conds
			got, err := Cache{
				Pods:        indexOf(t),
				Services:    listerscorev1.NewServiceLister(indexOf(t, svc)).Services("ns"),
				Wires:       listerscorev1.NewServiceLister(indexOf(t)).Services("ns"),
				ReplicaSets: listersappsv1.NewReplicaSetLister(indexOf(t, rs)).ReplicaSets("ns"),
			}.Resolve("abc")
			if !errors.Is(err, ErrPaused) || got.Paused {
				t.Fatalf("Resolve = %+v, %v; want a resuming sandbox (ErrPaused, not Paused)", got, err)
			}
			if got.Failure != c.want {
				t.Errorf("Failure = %q; want %q", got.Failure, c.want)
			}
		})
	}
}

// TestScalerResumesOnly: Scaler patches a paused sandbox that resumes on
// traffic to one replica (resources.ScalePatch, conditional on the version
// it read), leaves a running one alone, and refuses one that does not
// resume on traffic.
func TestScalerResumesOnly(t *testing.T) {
	cases := []struct {
		name       string
		autoResume bool
		running    bool
		wantErr    bool
		patches    int
	}{
		{"paused, resumes on traffic", true, false, false, 1},
		{"running already", true, true, false, 0},
		{"paused, does not resume on traffic", false, false, true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs, _ := pausedSandbox(c.autoResume)
			if c.running {
				rs.Spec.Replicas = ptr.To[int32](1)
			}
			client := fake.NewClientset(rs)
			var patches []string
			client.PrependReactor("patch", "replicasets", func(a k8stesting.Action) (bool, runtime.Object, error) {
				patches = append(patches, string(a.(k8stesting.PatchAction).GetPatch()))
				return false, nil, nil
			})
			err := Scaler{Client: client, Namespace: "ns"}.Wake(context.Background(), "abc")
			if (err != nil) != c.wantErr || len(patches) != c.patches {
				t.Fatalf("Wake = %v, %d patches; want error %v, %d patches", err, len(patches), c.wantErr, c.patches)
			}
			if c.patches == 0 {
				return
			}
			var p struct {
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
				Spec struct {
					Replicas int32 `json:"replicas"`
				} `json:"spec"`
			}
			if err := json.Unmarshal([]byte(patches[0]), &p); err != nil {
				t.Fatal(err)
			}
			if p.Spec.Replicas != 1 || p.Metadata.ResourceVersion != "7" {
				t.Errorf("patch %s: want one replica, conditional on version 7", patches[0])
			}
		})
	}
}

// TestBoundsEachPrincipal: with two requests open at most, two open requests to
// alice's sandbox leave her third one refused (429, with a body), while
// bob's sandbox is served; once one of hers ends, she is served again.
func TestBoundsEachPrincipal(t *testing.T) {
	unblock := make(chan struct{})
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Block") != "" {
			<-unblock
		}
		io.WriteString(w, "ok")
	}, func(o *Options) { o.Fairness = fairness.Limits{RequestsPerSecond: 1000, Burst: 1000, MaxInProgress: 2} })
	alice := func(block bool) *http.Request {
		req := h.request(t, "GET", nil, traffic(""))
		if block {
			req.Header.Set("Block", "1")
		}
		return req
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := http.DefaultClient.Do(alice(true)); err == nil {
				resp.Body.Close()
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	for h.hits.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	code := func(req *http.Request) int {
		t.Helper()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if got := code(alice(false)); got != http.StatusTooManyRequests {
		t.Errorf("alice's third request with two open = %d; want 429", got)
	}
	bob := h.request(t, "GET", nil, map[string]string{HeaderSandboxID: "bare", HeaderSandboxPort: "8080",
		HeaderTrafficToken: testKey.Token(access.Traffic, access.Sandbox{Principal: "bob", ID: "bare", CreatedAt: "2026-11-28T11:00:00Z"})})
	if got := code(bob); got != http.StatusOK {
		t.Errorf("bob's request while alice is at her bound = %d; want 200", got)
	}
	close(unblock)
	wg.Wait()
	if got := code(alice(false)); got != http.StatusOK {
		t.Errorf("alice's request once hers have ended = %d; want 200", got)
	}
}

// TestPacesEachPrincipal: with one request a second (a burst of one),
// alice's first passes at once, her second, whose turn is a second off, is
// refused at once (429, with a Retry-After and a body that says why), bob
// is not slowed, and a request of hers whose turn is near waits for it.
func TestPacesEachPrincipal(t *testing.T) {
	wait := 300 * time.Millisecond
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") },
		func(o *Options) {
			o.Fairness, o.RefusalDelay = fairness.Limits{RequestsPerSecond: 1, Burst: 1, MaxInProgress: 8}, -1
		})
	send := func(req *http.Request) (int, time.Duration, http.Header, string) {
		t.Helper()
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, time.Since(start), resp.Header, string(b)
	}
	first := time.Now() // alice's next turn comes a second after her first
	if code, took, _, _ := send(h.request(t, "GET", nil, traffic(""))); code != http.StatusOK || took > wait {
		t.Fatalf("alice's first request: %d after %s; want 200 at once", code, took)
	}
	code, took, hdr, body := send(h.request(t, "GET", nil, traffic("")))
	if code != http.StatusTooManyRequests || took > wait || hdr.Get("Retry-After") == "" || !strings.Contains(body, "PRINCIPAL_REQUESTS_PER_SECOND") {
		t.Errorf("alice's request whose turn is a second off: %d after %s, Retry-After %q, %s; want 429 at once with Retry-After and why",
			code, took, hdr.Get("Retry-After"), body)
	}
	bob := h.request(t, "GET", nil, map[string]string{HeaderSandboxID: "bare", HeaderSandboxPort: "8080",
		HeaderTrafficToken: testKey.Token(access.Traffic, access.Sandbox{Principal: "bob", ID: "bare", CreatedAt: "2026-11-28T11:00:00Z"})})
	if code, took, _, _ := send(bob); code != http.StatusOK || took > wait {
		t.Errorf("bob's request while alice is paced: %d after %s; want 200 at once", code, took)
	}
	time.Sleep(time.Until(first.Add(700 * time.Millisecond))) // her turn is now near
	turn := time.Until(first.Add(time.Second))
	if code, took, _, _ := send(h.request(t, "GET", nil, traffic(""))); code != http.StatusOK || took < turn-50*time.Millisecond {
		t.Errorf("alice's request whose turn is %s away: %d after %s; want 200 once it came", turn, code, took)
	}
}

// TestWakeForwardsOnceThePodListens: a woken sandbox whose Pod runs and
// takes connections on the request's port is forwarded to then, not a
// probe period later when the kubelet reports it Ready; one whose port
// refuses waits for Ready.
func TestWakeForwardsOnceThePodListens(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refuses bool
		min     time.Duration
		max     time.Duration
	}{
		{name: "its port takes connections", min: 200 * time.Millisecond, max: 1500 * time.Millisecond},
		{name: "its port refuses until Ready", refuses: true, min: 3 * time.Second, max: 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &sleeper{ready: 200 * time.Millisecond, unready: 3 * time.Second}
			var h *harness
			h = newHarness(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }, func(o *Options) {
				o.Resolver, o.Waker = s, s
				if tc.refuses {
					dial := o.Dial
					o.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
						if t, _ := s.Resolve("abc"); !t.Ready {
							return nil, errors.New("connection refused")
						}
						return dial(ctx, network, addr)
					}
				}
			})
			start := time.Now()
			resp, err := http.DefaultClient.Do(h.request(t, "GET", nil, traffic("")))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			took := time.Since(start)
			if resp.StatusCode != http.StatusOK || string(b) != "hello" || took < tc.min || took > tc.max {
				t.Errorf("%d %q after %s; want 200 hello after %s to %s", resp.StatusCode, b, took, tc.min, tc.max)
			}
		})
	}
}

// TestHoldsRefusals: a refused request is answered after RefusalDelay, so
// a client that ignores Retry-After loops no faster than that; past
// MaxHeldRefusals held for one principal, at once; another principal's
// requests are not held behind them.
func TestHoldsRefusals(t *testing.T) {
	const delay = 400 * time.Millisecond
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }, func(o *Options) {
		o.Fairness = fairness.Limits{RequestsPerSecond: 0.001, Burst: 1, MaxInProgress: 8}
		o.RefusalDelay, o.MaxHeldRefusals = delay, 2
	})
	send := func(req *http.Request) (int, time.Duration) {
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, time.Since(start)
	}
	if code, _ := send(h.request(t, "GET", nil, traffic(""))); code != http.StatusOK {
		t.Fatalf("alice's first request = %d; want 200 (her burst)", code)
	}
	type answer struct {
		code int
		held bool
	}
	got := make([]answer, 3)
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, took := send(h.request(t, "GET", nil, traffic("")))
			got[i] = answer{code, took >= delay-20*time.Millisecond}
		}()
	}
	time.Sleep(100 * time.Millisecond) // the three refusals are in
	bob := h.request(t, "GET", nil, map[string]string{HeaderSandboxID: "bare", HeaderSandboxPort: "8080",
		HeaderTrafficToken: testKey.Token(access.Traffic, access.Sandbox{Principal: "bob", ID: "bare", CreatedAt: "2026-11-28T11:00:00Z"})})
	if code, took := send(bob); code != http.StatusOK || took > delay/2 {
		t.Errorf("bob's request while alice's refusals are held: %d after %s; want 200 at once", code, took)
	}
	wg.Wait()
	held := 0
	for _, a := range got {
		if a.code != http.StatusTooManyRequests {
			t.Errorf("alice's request past her rate = %d; want 429", a.code)
		}
		if a.held {
			held++
		}
	}
	if held != 2 {
		t.Errorf("%d of alice's three refusals were held %s; want 2 (MaxHeldRefusals), the third answered at once: %+v", held, delay, got)
	}
}

// indexOf is an informer's store holding objs, indexed by sandbox id.
func indexOf(t *testing.T, objs ...runtime.Object) cache.Indexer {
	t.Helper()
	i := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{IDIndex: IndexByID})
	for _, o := range objs {
		if err := i.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	return i
}
