package template

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
)

// lists counts the PodTemplate lists the client has sent.
func lists(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "list" && a.GetResource().Resource == "podtemplates" {
			n++
		}
	}
	return n
}

// TestListServesFromItsWatch: until the watch has synced a listing reads
// the templates from the API server; once it has, GET /api/templates and
// /api/capabilities (ListValid, ListValidFor) read nothing however often
// they are asked, and an edit shows as the watch delivers it.
func TestListServesFromItsWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pt := python()
	pt.Namespace = "ns"
	cs := fake.NewClientset(pt)
	s := storeFor(t, cs)

	if _, _, err := s.ListValid(ctx); err != nil {
		t.Fatal(err)
	}
	if n := lists(cs); n != 1 {
		t.Errorf("%d lists for one listing without a watch, want 1", n)
	}

	s.Run(ctx)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return s.HasSynced(), nil
	}); err != nil {
		t.Fatalf("the watch never synced: %v", err)
	}
	cs.ClearActions()
	for range 3 {
		sums, valid, err := s.ListValid(ctx)
		if err != nil || len(valid) != 1 || len(sums) != 2 { // python and the built-in default
			t.Fatalf("ListValid = %v, %d valid, %v", sums, len(valid), err)
		}
		if _, _, err := s.ListValidFor(ctx, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	if n := lists(cs); n != 0 {
		t.Errorf("%d lists for six listings the watch holds, want 0", n)
	}

	edited := pt.DeepCopy()
	edited.Template.Spec.Containers[0].Image = "registry.example/python-sandbox:3.13"
	edited.ResourceVersion = "8"
	if _, err := cs.CoreV1().PodTemplates("ns").Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		sums, err := s.List(ctx)
		for _, sum := range sums {
			if sum.Name == "python" {
				return err == nil && sum.Image == "registry.example/python-sandbox:3.13", nil
			}
		}
		return false, err
	}); err != nil {
		t.Errorf("the edit never showed in the listing: %v", err)
	}
	if n := lists(cs); n != 0 {
		t.Errorf("%d lists after the edit, want 0", n)
	}
}
