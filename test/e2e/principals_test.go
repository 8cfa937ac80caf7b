//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/events"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

const (
	aliceKey = "alice-key-0123456789abcdef"
	bobKey   = "bob-key-0123456789abcdef"
	opsKey   = "ops-key-0123456789abcdef"
)

// as sends one request through a door with the given credential headers.
func as(t *testing.T, f *function.Instance, headers map[string]string, d door) function.Response {
	t.Helper()
	return d.send(t, f, headers)
}

func keyHeader(k string) map[string]string { return map[string]string{"X-API-Key": k} }

func bearerHeader(tok string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + tok}
}

// byIDDoors are the operations on one sandbox, through each door.
func byIDDoors(id string) map[string]door {
	data := `{"sandbox_id":"` + id + `"}`
	return map[string]door{
		"http get":      {name: "GET", method: "GET", path: "/api/sandboxes/" + id},
		"http destroy":  {name: "DELETE", method: "DELETE", path: "/api/sandboxes/" + id},
		"http pause":    {name: "pause", method: "POST", path: "/api/sandboxes/" + id + "/pause"},
		"http resume":   {name: "resume", method: "POST", path: "/api/sandboxes/" + id + "/resume"},
		"event get":     {name: "event get", method: "POST", path: "/", body: data, event: events.TypeGet},
		"event destroy": {name: "event destroy", method: "POST", path: "/", body: data, event: events.TypeDestroy},
		"event pause":   {name: "event pause", method: "POST", path: "/", body: data, event: events.TypePause},
		"event resume":  {name: "event resume", method: "POST", path: "/", body: data, event: events.TypeResume},
		"invoke get":    {name: "invoke get", method: "POST", path: "/", body: `{"operation":"get","sandbox_id":"` + id + `"}`},
		"invoke pause":  {name: "invoke pause", method: "POST", path: "/", body: `{"operation":"pause","sandbox_id":"` + id + `"}`},
	}
}

// listedIDs lists through the HTTP door, or through a list event.
func listedIDs(t *testing.T, f *function.Instance, headers map[string]string, event bool) []string {
	t.Helper()
	d := door{name: "list", method: "GET", path: "/api/sandboxes"}
	if event {
		d = door{name: "event list", method: "POST", path: "/", body: `{}`, event: events.TypeList}
	}
	r := as(t, f, headers, d)
	expectCode(t, r, 200, d.name)
	var body struct {
		Sandboxes []struct {
			ID string `json:"sandbox_id"`
		} `json:"sandboxes"`
	}
	if err := json.Unmarshal(r.Raw, &body); err != nil {
		t.Fatalf("%s: %v: %s", d.name, err, r.Raw)
	}
	var ids []string
	for _, s := range body.Sandboxes {
		ids = append(ids, s.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestPrincipalsCannotSeeEachOther: a key principal (alice) and a token
// principal (a service account) each create a ReplicaSet sandbox; neither
// can get, destroy, pause or resume the other's through the HTTP API,
// CloudEvents or POST /: every answer is the one for an absent sandbox
// (404; 200 for destroy), and the other's sandbox is untouched. Each lists
// only its own; the administrator sees and destroys both. Every mutating
// operation leaves one audit line naming the principal, in the function's
// own log.
func TestPrincipalsCannotSeeEachOther(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	putTemplate(t, ns, rsTemplate("heal", "sandbox:test", nil))
	subject := "system:serviceaccount:" + ns + ":bob-sa"
	f := start(t, ns, map[string]string{
		"PROVISIONER_API_KEYS":  "alice=" + aliceKey + ",ops=" + opsKey,
		"PROVISIONER_ADMINS":    "ops",
		"AUTH_TOKEN_AUDIENCE":   audience,
		"AUTH_ALLOWED_SUBJECTS": subject,
	})
	alice, bob, ops := keyHeader(aliceKey), bearerHeader(token(t, ns, "bob-sa", audience)), keyHeader(opsKey)
	ctx := context.Background()

	expectCode(t, as(t, f, alice, door{name: "alice's create", method: "POST", path: "/api/sandboxes",
		body: `{"sandbox_id":"alice1","user_id":"alice-u","template":"heal"}`}), 200, "alice's create")
	expectCode(t, as(t, f, bob, door{name: "bob's create", method: "POST", path: "/", event: events.TypeCreate,
		body: `{"sandbox_id":"bob1","user_id":"bob-u","template":"heal"}`}), 200, "bob's create (event)")
	uid := map[string]string{}
	for _, id := range []string{"alice1", "bob1"} {
		rs, err := client().AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uid[id] = string(rs.UID)
	}

	for _, c := range []struct {
		who     string
		headers map[string]string
		other   string
	}{{"alice", alice, "bob1"}, {"bob", bob, "alice1"}} {
		for name, d := range byIDDoors(c.other) {
			t.Run(c.who+"/"+name+" of "+c.other, func(t *testing.T) {
				r := as(t, f, c.headers, d)
				want := 404
				if strings.HasSuffix(name, "destroy") {
					want = 200 // as for an id that never existed
				}
				if r.Code != want {
					t.Errorf("%d %s, want %d", r.Code, r.Raw, want)
				}
				if want == 200 && (r.Body["ok"] != true || r.Body["sandbox_id"] != c.other) {
					t.Errorf("destroy answered %s, want the answer for an absent id", r.Raw)
				}
				if strings.Contains(string(r.Raw), "svc.cluster.local") || strings.Contains(string(r.Raw), "127.0.0.1:") {
					t.Errorf("the answer reveals the other's sandbox: %s", r.Raw)
				}
			})
		}
	}
	// The absent answers match an id that never existed, byte for byte.
	never := as(t, f, alice, byIDDoors("never1")["http get"])
	other := as(t, f, alice, byIDDoors("bob1")["http get"])
	if strings.ReplaceAll(string(other.Raw), "bob1", "never1") != string(never.Raw) {
		t.Errorf("another's sandbox %s answers unlike an absent one %s", other.Raw, never.Raw)
	}
	for id, want := range uid {
		rs, err := client().AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-"+id, metav1.GetOptions{})
		if err != nil || string(rs.UID) != want || rs.DeletionTimestamp != nil || rs.Spec.Replicas == nil || *rs.Spec.Replicas != 1 {
			t.Errorf("%s was touched by the other principal: %v", id, err)
		}
	}

	got := map[string][]string{
		"alice http": listedIDs(t, f, alice, false), "bob event": listedIDs(t, f, bob, true),
		"ops http": listedIDs(t, f, ops, false), "ops event": listedIDs(t, f, ops, true),
	}
	want := map[string][]string{"alice http": {"alice1"}, "bob event": {"bob1"}, "ops http": {"alice1", "bob1"}, "ops event": {"alice1", "bob1"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("lists (-want +got):\n%s", diff)
	}

	// Each principal runs its own sandbox's lifecycle; the administrator
	// gets and destroys the others'.
	expectCode(t, as(t, f, alice, byIDDoors("alice1")["http pause"]), 200, "alice pauses hers")
	expectCode(t, as(t, f, alice, byIDDoors("alice1")["event resume"]), 200, "alice resumes hers")
	expectCode(t, as(t, f, bob, byIDDoors("bob1")["event pause"]), 200, "bob pauses his")
	expectCode(t, as(t, f, ops, byIDDoors("bob1")["http get"]), 200, "the administrator gets bob's")
	expectCode(t, as(t, f, ops, byIDDoors("alice1")["event destroy"]), 200, "the administrator destroys alice's")
	expectCode(t, as(t, f, ops, byIDDoors("bob1")["http destroy"]), 200, "the administrator destroys bob's")
	// The reap judges every principal's sandboxes: granted to the
	// administrator, not to alice (no entry of PROVISIONER_PRINCIPAL_OPERATIONS
	// lists it for her).
	expectCode(t, as(t, f, alice, door{name: "reap", method: "POST", path: "/api/reap"}), 403, "alice's reap")
	expectCode(t, as(t, f, ops, door{name: "reap", method: "POST", path: "/api/reap"}), 200, "the administrator reaps")
	eventually(t, 30*time.Second, "both sandboxes gone", func() (bool, error) {
		l, err := client().AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		live := 0
		for _, rs := range l.Items {
			if rs.DeletionTimestamp == nil {
				live++
			}
		}
		return live == 0, nil
	})

	type line struct{ Principal, Operation, SandboxID, Outcome string }
	var audit []line
	for _, rec := range auditRecords(t, f) {
		audit = append(audit, line{rec["principal"].(string), rec["operation"].(string), rec["sandbox_id"].(string), rec["outcome"].(string)})
	}
	wantAudit := []line{
		{"alice", "create", "alice1", "ok"},
		{subject, "create", "bob1", "ok"},
		{"ops", "destroy", "alice1", "ok"},
		{"ops", "destroy", "bob1", "ok"},
		{"ops", "reap", "", "ok"},
		{"alice", "destroy", "bob1", "hidden"}, {subject, "destroy", "alice1", "hidden"},
		{"alice", "pause", "bob1", "not_found"}, {subject, "resume", "alice1", "not_found"},
		{"alice", "pause", "alice1", "ok"}, {"alice", "resume", "alice1", "ok"}, {subject, "pause", "bob1", "ok"},
	}
	for _, w := range wantAudit {
		if !slices.Contains(audit, w) {
			t.Errorf("no audit line %+v in the function's log; audit lines: %+v", w, audit)
		}
	}
	for _, a := range audit {
		if a.Operation == "get" || a.Operation == "list" {
			t.Errorf("a read was audited as a mutation: %+v", a)
		}
	}
}

// auditRecords reads the audit lines of the function's log.
func auditRecords(t *testing.T, f *function.Instance) []map[string]any {
	t.Helper()
	file, err := os.Open(f.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	var out []map[string]any
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["audit"] == "sandbox" && rec["msg"] == "audit" {
			out = append(out, rec)
		}
	}
	return out
}

// TestTriggerSubjectLimitedToItsOperation: a token subject that
// PROVISIONER_PRINCIPAL_OPERATIONS limits to get (a get Trigger's identity)
// is refused, 403 with a detail, for create on every door, and gets.
func TestTriggerSubjectLimitedToItsOperation(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	subject := "system:serviceaccount:" + ns + ":get-trigger"
	f := start(t, ns, map[string]string{
		"AUTH_TOKEN_AUDIENCE":              audience,
		"AUTH_ALLOWED_SUBJECTS":            subject,
		"PROVISIONER_PRINCIPAL_OPERATIONS": subject + "=get",
	})
	getter := bearerHeader(token(t, ns, "get-trigger", audience))
	for _, d := range []door{
		{name: "POST /api/sandboxes", method: "POST", path: "/api/sandboxes", body: `{"sandbox_id":"lim1"}`},
		{name: "event create", method: "POST", path: "/", body: `{"sandbox_id":"lim1"}`, event: events.TypeCreate},
		{name: "POST / create", method: "POST", path: "/", body: `{"operation":"create","sandbox_id":"lim1"}`},
		{name: "event reap", method: "POST", path: "/", body: `{}`, event: events.TypeReap},
		{name: "DELETE", method: "DELETE", path: "/api/sandboxes/lim1"},
	} {
		r := as(t, f, getter, d)
		if r.Code != 403 || !strings.Contains(r.Detail(), "PROVISIONER_PRINCIPAL_OPERATIONS") || !strings.Contains(r.Detail(), subject) {
			t.Errorf("%s: %d %s, want 403 with a detail naming the subject and the setting", d.name, r.Code, r.Raw)
		}
	}
	if n := len(pods(t, ns, "")); n != 0 {
		t.Errorf("%d Pods after refused creates", n)
	}
	expectCode(t, as(t, f, getter, byIDDoors("lim1")["event get"]), 404, "get, which it may run")
}

// TestPerPrincipalQuotaAcrossDoors: MAX_SANDBOXES_PER_PRINCIPAL refuses a
// principal's third sandbox (429 naming the variable) whichever door it
// uses, while another principal still creates.
func TestPerPrincipalQuotaAcrossDoors(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, map[string]string{"PROVISIONER_API_KEYS": "alice=" + aliceKey + ",bob=" + bobKey, "MAX_SANDBOXES_PER_PRINCIPAL": "2"})
	alice, bob := keyHeader(aliceKey), keyHeader(bobKey)
	expectCode(t, as(t, f, alice, door{name: "a1", method: "POST", path: "/api/sandboxes", body: `{"sandbox_id":"q-a1","user_id":"alice-u"}`}), 200, "alice's first")
	expectCode(t, as(t, f, alice, door{name: "a2", method: "POST", path: "/", event: events.TypeCreate, body: `{"sandbox_id":"q-a2","user_id":"other"}`}), 200, "alice's second")
	for _, d := range []door{
		{name: "http", method: "POST", path: "/api/sandboxes", body: `{"sandbox_id":"q-a3","user_id":"alice-u"}`},
		{name: "event", method: "POST", path: "/", event: events.TypeCreate, body: `{"sandbox_id":"q-a3","user_id":"third"}`},
	} {
		r := as(t, f, alice, d)
		if r.Code != 429 || !strings.Contains(r.Detail(), "MAX_SANDBOXES_PER_PRINCIPAL") {
			t.Errorf("alice's third by %s: %d %s, want 429 naming MAX_SANDBOXES_PER_PRINCIPAL", d.name, r.Code, r.Raw)
		}
	}
	expectCode(t, as(t, f, alice, door{name: "a1 again", method: "POST", path: "/api/sandboxes", body: `{"sandbox_id":"q-a1","user_id":"alice-u"}`}), 200, "an existing id is never refused")
	expectCode(t, as(t, f, bob, door{name: "b1", method: "POST", path: "/api/sandboxes", body: `{"sandbox_id":"q-b1","user_id":"bob-u"}`}), 200, "bob's first")
	var live []string
	for _, p := range pods(t, ns, "app=deer-flow-sandbox") {
		if p.DeletionTimestamp == nil {
			live = append(live, p.Name)
		}
	}
	slices.Sort(live)
	if diff := cmp.Diff([]string{"sandbox-q-a1", "sandbox-q-a2", "sandbox-q-b1"}, live); diff != "" {
		t.Errorf("live sandboxes (-want +got):\n%s", diff)
	}
}
