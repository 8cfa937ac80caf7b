//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/events"
	"github.com/deerflow-sandbox/provisioner/pkg/ownership"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// TestDataBelongsToItsPrincipal (issue 29, item 4), on a real API server
// with two replicas of the function: a user_id and a thread_id are the
// first principal's; another principal's create naming either is refused
// with 403 naming the field, on every door, and leaves no object; an
// omitted user_id is principal default's; an administrator uses any id.
// Replicas share no memory: the second learns the owner from the Lease.
func TestDataBelongsToItsPrincipal(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	env := map[string]string{
		"PROVISIONER_API_KEYS": "alice=" + aliceKey + ",bob=" + bobKey + ",ops=" + opsKey,
		"PROVISIONER_ADMINS":   "ops",
	}
	r1, r2 := start(t, ns, env), start(t, ns, env)
	alice, bob, ops, dflt := keyHeader(aliceKey), keyHeader(bobKey), keyHeader(opsKey), keyHeader(function.Key)
	create := func(id, user, thread string) string {
		body := `{"sandbox_id":"` + id + `"`
		if user != "" {
			body += `,"user_id":"` + user + `"`
		}
		if thread != "" {
			body += `,"thread_id":"` + thread + `"`
		}
		return body + "}"
	}
	http := func(body string) door {
		return door{name: "POST /api/sandboxes", method: "POST", path: "/api/sandboxes", body: body}
	}
	event := func(body string) door {
		return door{name: "event create", method: "POST", path: "/", body: body, event: events.TypeCreate}
	}

	expectCode(t, as(t, r1, alice, http(create("own-a1", "u1", "t1"))), 200, "alice's first use of u1 and t1")
	expectCode(t, as(t, r2, alice, http(create("own-a2", "u1", "t2"))), 200, "alice again, on the other replica")

	refusals := []struct {
		name      string
		f         *function.Instance
		who       map[string]string
		d         door
		id, field string
	}{
		{"bob names alice's user", r2, bob, http(create("own-b1", "u1", "tb")), "own-b1", `user_id "u1"`},
		{"bob names alice's thread", r1, bob, http(create("own-b2", "ub", "t1")), "own-b2", `thread_id "t1"`},
		{"bob names alice's user by event", r2, bob, event(create("own-b3", "u1", "tb3")), "own-b3", `user_id "u1"`},
		{"bob names alice's thread by POST /", r1, bob, door{name: "POST / create", method: "POST", path: "/",
			body: `{"operation":"create","sandbox_id":"own-b4","user_id":"ub","thread_id":"t2"}`}, "own-b4", `thread_id "t2"`},
		{"bob omits user_id", r2, bob, http(create("own-b5", "", "tb5")), "own-b5", "send a user_id of your own"},
		{"alice omits user_id by event", r1, alice, event(create("own-a5", "", "ta5")), "own-a5", "send a user_id of your own"},
	}
	for _, c := range refusals {
		r := as(t, c.f, c.who, c.d)
		if r.Code != 403 || !strings.Contains(r.Detail(), c.field) {
			t.Errorf("%s: %d %s, want 403 with a detail naming %s", c.name, r.Code, r.Raw, c.field)
		}
		if p, s := pods(t, ns, "sandbox-id="+c.id), services(t, ns, "sandbox-id="+c.id); len(p)+len(s) != 0 {
			t.Errorf("%s: the refused create left %d Pods and %d Services", c.name, len(p), len(s))
		}
	}
	// bob's own ids stay his; the refusals above claimed none of them for
	// anyone else, and the default user stays default's.
	expectCode(t, as(t, r1, bob, http(create("own-b6", "ub", "tb"))), 200, "bob's own user and thread")
	expectCode(t, as(t, r2, dflt, http(create("own-d1", "", ""))), 200, "the backend's key omits user_id")
	expectCode(t, as(t, r1, ops, http(create("own-o1", "u1", "t1"))), 200, "the administrator uses alice's ids")

	// An extra mount of alice's tree under bob's own user is refused (422
	// naming the entry), as are the shared roots' users/ and threads/.
	for _, hp := range []string{"/.deer-flow/users/u1", "/.deer-flow/users/u1/threads/t1/acp-workspace", "/.deer-flow/users", "/.deer-flow/threads"} {
		body := `{"sandbox_id":"own-b7","user_id":"ub","thread_id":"tb","extra_mounts":[{"host_path":"` + hp + `","container_path":"/mnt/acp-workspace","read_only":false}]}`
		r := as(t, r2, bob, http(body))
		if r.Code != 422 || !strings.Contains(r.Detail(), "extra_mounts[0]") {
			t.Errorf("bob mounts %s: %d %s, want 422 naming extra_mounts[0]", hp, r.Code, r.Raw)
		}
	}

	// The Leases: one per id, holding its owner.
	ctx := context.Background()
	for _, w := range []struct {
		f         ownership.Field
		id, owner string
	}{{ownership.User, "u1", "alice"}, {ownership.Thread, "t1", "alice"}, {ownership.Thread, "t2", "alice"}, {ownership.User, "ub", "bob"}} {
		l, err := client().CoordinationV1().Leases(ns).Get(ctx, ownership.LeaseName(w.f, w.id), metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != w.owner {
			t.Errorf("the Lease of %s %s: %v (%v), want holder %s", w.f, w.id, l, err, w.owner)
		}
	}
	for _, none := range []string{ownership.LeaseName(ownership.User, "default"), ownership.LeaseName(ownership.Thread, "tb3")} {
		if _, err := client().CoordinationV1().Leases(ns).Get(ctx, none, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Lease %s: %v, want none (the default user needs none; a refused user claims no thread)", none, err)
		}
	}
}

// TestOwnershipRaceHasOneWinner: alice and bob create at once, each on its
// own replica, naming one fresh user_id: in every round exactly one gets
// 200, the other 403 naming user_id, and the loser's create left nothing.
func TestOwnershipRaceHasOneWinner(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	env := map[string]string{"PROVISIONER_API_KEYS": "alice=" + aliceKey + ",bob=" + bobKey}
	r1, r2 := start(t, ns, env), start(t, ns, env)
	for round := range 8 {
		user := fmt.Sprintf("race%d", round)
		var wg sync.WaitGroup
		got := map[string]function.Response{}
		var mu sync.Mutex
		for _, c := range []struct {
			who string
			f   *function.Instance
			key string
		}{{"alice", r1, aliceKey}, {"bob", r2, bobKey}} {
			wg.Go(func() {
				id := fmt.Sprintf("race-%s-%d", c.who, round)
				body := `{"sandbox_id":"` + id + `","user_id":"` + user + `","thread_id":"` + id + `"}`
				r := as(t, c.f, keyHeader(c.key), door{name: "create", method: "POST", path: "/api/sandboxes", body: body})
				mu.Lock()
				got[id] = r
				mu.Unlock()
			})
		}
		wg.Wait()
		won := 0
		for id, r := range got {
			switch {
			case r.Code == 200:
				won++
			case r.Code == 403 && strings.Contains(r.Detail(), `user_id "`+user+`"`):
				if p := pods(t, ns, "sandbox-id="+id); len(p) != 0 {
					t.Errorf("round %d: the refused %s left %d Pods", round, id, len(p))
				}
			default:
				t.Errorf("round %d: %s answered %d %s, want 200 or 403 naming user_id", round, id, r.Code, r.Raw)
			}
		}
		if won != 1 {
			t.Errorf("round %d: %d creates answered 200, want exactly 1", round, won)
		}
	}
}
