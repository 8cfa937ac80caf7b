//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// TestSandboxesOfThePreviousVersion (issue 49): before this version, a
// cold sandbox's Pod owned its Service (the create bound the Service to
// the Pod with a third write); now the Service owns the Pod from the Pod's
// create. After an upgrade, sandboxes of the earlier shape are found,
// listed, created again (DeerFlow's reuse: the same Pod, the Service left
// as it is) and destroyed, on a real API server with its garbage
// collector. They are made here by this version and turned into the
// earlier shape by an administrator's patches, a stand-in for running the
// earlier release: the objects are otherwise the same.
func TestSandboxesOfThePreviousVersion(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, nil)
	ctx := context.Background()
	for _, id := range []string{"prev1", "prev2"} {
		expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": id}), 200, "create "+id)
		pod, err := client().CoreV1().Pods(ns).Patch(ctx, resources.PodName(id), types.MergePatchType, []byte(`{"metadata":{"ownerReferences":null}}`), metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc, err := client().CoreV1().Services(ns).Get(ctx, resources.ServiceName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.OwnerReferences = []metav1.OwnerReference{resources.PodOwnerRef(pod)}
		if _, err := client().CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	before := pods(t, ns, "sandbox-id=prev1")
	if len(before) != 1 {
		t.Fatalf("%d Pods of prev1", len(before))
	}
	url := mustDo(t, f, "GET", "/api/sandboxes/prev1", nil)
	expectCode(t, url, 200, "get of the earlier shape")
	if u, _ := url.Body["sandbox_url"].(string); u == "" || url.Body["status"] == "NotFound" {
		t.Errorf("get of the earlier shape: %s", url.Raw)
	}
	l := mustDo(t, f, "GET", "/api/sandboxes", nil)
	expectCode(t, l, 200, "list")
	if l.Body["count"].(float64) != 2 {
		t.Errorf("list of two sandboxes of the earlier shape: %s", l.Raw)
	}
	again := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "prev1"})
	expectCode(t, again, 200, "create of the earlier shape again")
	if again.Body["sandbox_url"] != url.Body["sandbox_url"] {
		t.Errorf("the create again answered %v, the get %v: want the same sandbox", again.Body["sandbox_url"], url.Body["sandbox_url"])
	}
	after, svcs := pods(t, ns, "sandbox-id=prev1"), services(t, ns, "sandbox-id=prev1")
	if len(after) != 1 || after[0].UID != before[0].UID || len(svcs) != 1 || resources.OwnerUID(svcs[0].OwnerReferences) != before[0].UID {
		t.Errorf("after the create again: %d Pods (same: %v), %d Services; want the same Pod, owning its Service", len(after), len(after) == 1 && after[0].UID == before[0].UID, len(svcs))
	}
	for _, id := range []string{"prev1", "prev2"} {
		expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/"+id, nil), 200, "destroy "+id)
	}
	eventually(t, 30*time.Second, "both sandboxes of the earlier shape gone", func() (bool, error) {
		return len(pods(t, ns, "app=deer-flow-sandbox"))+len(services(t, ns, "app=deer-flow-sandbox")) == 0, nil
	})
}
