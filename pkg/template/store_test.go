package template

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
)

// gets counts the PodTemplate GETs the client has sent.
func gets(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "podtemplates" {
			n++
		}
	}
	return n
}

func storeFor(t *testing.T, cs *fake.Clientset) *Store {
	t.Helper()
	cfg := testConfig(t)
	cfg.Namespace = "ns"
	cfg.TemplateCacheTTL = 0 // on demand, every use reads
	return NewStore(cs, cfg.Objects())
}

// TestStoreReadsOnDemandUntilWatched: without its watch (not started, or
// not yet synced) the Store reads each template from the API server.
func TestStoreReadsOnDemandUntilWatched(t *testing.T) {
	pt := python()
	pt.Namespace = "ns"
	cs := fake.NewClientset(pt)
	s := storeFor(t, cs)
	for range 2 {
		if got, err := s.Get(context.Background(), "python"); err != nil || got == nil || got.Name != "python" {
			t.Fatalf("Get(python) = %v, %v", got, err)
		}
	}
	if n := gets(cs); n != 2 {
		t.Errorf("%d GETs for two uses with a TTL of 0 and no watch, want 2", n)
	}
}

// TestStoreKeepsTheTemplatesInUseWhenFull: names come from requests, so
// a caller naming more templates than the Store holds pushes out the
// least recently used ones, never the template every create uses: it is
// read once within its TTL, however many made-up names come between.
func TestStoreKeepsTheTemplatesInUseWhenFull(t *testing.T) {
	pt := python()
	pt.Namespace = "ns"
	cs := fake.NewClientset(pt)
	s := storeFor(t, cs)
	s.ttl = time.Hour
	ctx := context.Background()
	for i := range 3 * maxCached {
		if got, err := s.Get(ctx, "python"); err != nil || got == nil || got.Name != "python" {
			t.Fatalf("Get(python) = %v, %v", got, err)
		}
		if _, err := s.Get(ctx, fmt.Sprintf("made-up-%d", i)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get(made-up-%d) = %v, want ErrNotFound", i, err)
		}
	}
	if n, want := gets(cs), 1+3*maxCached; n != want {
		t.Errorf("%d GETs, want %d: python once, each made-up name once", n, want)
	}
	if n := s.entries.Len(); n != maxCached {
		t.Errorf("the Store holds %d entries, want its bound, %d", n, maxCached)
	}
}

// TestStoreServesFromItsWatch: once the watch has synced, a create's
// template costs no round trip, an edit applies as the watch delivers it,
// a default that does not exist is the built-in Pod, and only a named
// template the watch has not shown (made a moment ago, or a typo) is read.
func TestStoreServesFromItsWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pt := python()
	pt.Namespace = "ns"
	cs := fake.NewClientset(pt)
	s := storeFor(t, cs)
	s.Run(ctx)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return s.informer.HasSynced(), nil
	}); err != nil {
		t.Fatalf("the watch never synced: %v", err)
	}

	got, err := s.Get(ctx, "python")
	if err != nil || got == nil {
		t.Fatalf("Get(python) = %v, %v", got, err)
	}
	if got.IdleTimeout != 30*time.Minute {
		t.Errorf("idle timeout %v, want the template's 30m", got.IdleTimeout)
	}
	if def, err := s.Get(ctx, ""); def != nil || err != nil {
		t.Errorf("Get(default) with no PodTemplate default = %v, %v; want the built-in (nil, nil)", def, err)
	}
	if n := gets(cs); n != 0 {
		t.Errorf("%d GETs for templates the watch holds, want 0", n)
	}

	edited := pt.DeepCopy()
	edited.Annotations[keys.TemplateIdleTimeout] = "5m"
	edited.ResourceVersion = "8"
	if _, err := cs.CoreV1().PodTemplates("ns").Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		got, err := s.Get(ctx, "python")
		return err == nil && got != nil && got.IdleTimeout == 5*time.Minute, nil
	}); err != nil {
		t.Errorf("the edit never applied: %v", err)
	}

	_, err = s.Get(ctx, "missing")
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(missing) error %v, want ErrNotFound", err)
	}
	if diff := cmp.Diff(1, gets(cs)); diff != "" {
		t.Errorf("GETs: only the template the watch has not shown is read (-want +got):\n%s", diff)
	}
}
