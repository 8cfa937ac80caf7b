//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/deerflow-sandbox/provisioner/pkg/events"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// TestGroupedTriggersShareSandboxes: what config/ does for the Broker's
// Triggers. Two service accounts in one PROVISIONER_PRINCIPAL_GROUPS group
// ("events"), one limited to create and the other to destroy by
// PROVISIONER_PRINCIPAL_OPERATIONS, create and destroy the same sandbox
// through CloudEvents with their own tokens. Each is still held to its own
// operations by its own name, and a third, ungrouped service account cannot
// see the sandbox (404 on get, the absent answer on destroy). The event log
// lines name the sender's own identity; the sandbox and its audit lines
// name the group.
func TestGroupedTriggersShareSandboxes(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const group = "events"
	sub := func(sa string) string { return "system:serviceaccount:" + ns + ":" + sa }
	creator, destroyer, outsider := sub("create-trigger"), sub("destroy-trigger"), sub("outsider")
	f := start(t, ns, map[string]string{
		"AUTH_TOKEN_AUDIENCE":              audience,
		"AUTH_ALLOWED_SUBJECTS":            strings.Join([]string{creator, destroyer, outsider}, ","),
		"PROVISIONER_PRINCIPAL_OPERATIONS": creator + "=create;" + destroyer + "=destroy",
		"PROVISIONER_PRINCIPAL_GROUPS":     group + "=" + creator + "," + destroyer,
		"LOG_LEVEL":                        "info", // the "event handled" lines
	})
	asCreator := bearerHeader(token(t, ns, "create-trigger", audience))
	asDestroyer := bearerHeader(token(t, ns, "destroy-trigger", audience))
	asOutsider := bearerHeader(token(t, ns, "outsider", audience))
	ctx := context.Background()
	const id = "grp1"
	createEvent := door{name: "event create", method: "POST", path: "/", event: events.TypeCreate, body: `{"sandbox_id":"` + id + `","user_id":"grp-user"}`}

	// The create Trigger's identity creates; the sandbox is the group's.
	created := as(t, f, asCreator, createEvent)
	expectCode(t, created, 200, "the create Trigger's create (event)")
	pod, err := client().CoreV1().Pods(ns).Get(ctx, "sandbox-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Annotations[keys.AnnotationPrincipal]; got != group {
		t.Errorf("the sandbox's %s = %q, want the group %q", keys.AnnotationPrincipal, got, group)
	}

	// Operations are judged by each member's own name, not the group's.
	for _, c := range []struct {
		who     string
		headers map[string]string
		subject string
		d       door
	}{
		{"the create Trigger", asCreator, creator, byIDDoors(id)["event destroy"]},
		{"the destroy Trigger", asDestroyer, destroyer, door{name: "event create", method: "POST", path: "/", event: events.TypeCreate, body: `{"sandbox_id":"grp2","user_id":"grp-user"}`}},
		{"the destroy Trigger", asDestroyer, destroyer, byIDDoors(id)["event get"]},
	} {
		r := as(t, f, c.headers, c.d)
		if r.Code != 403 || !strings.Contains(r.Detail(), "PROVISIONER_PRINCIPAL_OPERATIONS") || !strings.Contains(r.Detail(), c.subject) {
			t.Errorf("%s's %s: %d %s, want 403 with a detail naming its own subject and the setting", c.who, c.d.name, r.Code, r.Raw)
		}
	}
	if _, err := client().CoreV1().Pods(ns).Get(ctx, "sandbox-grp2", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the destroy Trigger's refused create made sandbox-grp2 (or the lookup failed): %v", err)
	}

	// Outside the group, the sandbox is absent.
	expectCode(t, as(t, f, asOutsider, byIDDoors(id)["event get"]), 404, "the outsider's get (event)")
	expectCode(t, as(t, f, asOutsider, byIDDoors(id)["http get"]), 404, "the outsider's get (HTTP)")
	hidden := as(t, f, asOutsider, byIDDoors(id)["event destroy"])
	expectCode(t, hidden, 200, "the outsider's destroy (event)")
	if hidden.Body["ok"] != true || hidden.Body["sandbox_id"] != id {
		t.Errorf("the outsider's destroy answered %s, want the answer for an absent id", hidden.Raw)
	}
	if ids := listedIDs(t, f, asOutsider, true); len(ids) != 0 {
		t.Errorf("the outsider lists %v, want nothing", ids)
	}
	after, err := client().CoreV1().Pods(ns).Get(ctx, "sandbox-"+id, metav1.GetOptions{})
	if err != nil || after.UID != pod.UID || after.DeletionTimestamp != nil {
		t.Fatalf("the outsider's destroy touched the group's sandbox: %v", err)
	}

	// The destroy Trigger's identity destroys what the create Trigger's made.
	destroyed := as(t, f, asDestroyer, byIDDoors(id)["event destroy"])
	expectCode(t, destroyed, 200, "the destroy Trigger's destroy (event)")
	eventually(t, 30*time.Second, "the group's sandbox gone", func() (bool, error) {
		p, err := client().CoreV1().Pods(ns).Get(ctx, "sandbox-"+id, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && (p.UID != pod.UID || p.DeletionTimestamp != nil), err
	})

	// The logs: each event's line names its sender's own identity; each
	// audit line the owner it acted as.
	type want struct {
		what, requestID, identity, auditPrincipal, outcome string
	}
	wants := []want{
		{"create", created.Header.Get(reqid.Header), creator, group, "ok"},
		{"destroy", destroyed.Header.Get(reqid.Header), destroyer, group, "ok"},
		{"destroy", hidden.Header.Get(reqid.Header), outsider, outsider, "hidden"},
	}
	// The audit line is written before the answer, but an event's "event
	// handled" line after it (pkg/events), so it may reach the log after
	// the test has the answer: wait (bounded) until each event's line is
	// there. On a timeout the checks below say what is missing.
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		logged := map[any]bool{}
		for _, rec := range logRecordsOf(t, f) {
			if rec["msg"] == "event handled" {
				logged[rec["request_id"]] = true
			}
		}
		for _, w := range wants {
			if w.requestID != "" && !logged[w.requestID] {
				return false, nil
			}
		}
		return true, nil
	})
	for _, w := range wants {
		if w.requestID == "" {
			t.Errorf("the %s event's answer has no %s", w.what, reqid.Header)
			continue
		}
		var handled, audit []map[string]any
		for _, rec := range logRecordsOf(t, f) {
			if rec["request_id"] != w.requestID {
				continue
			}
			switch {
			case rec["msg"] == "event handled":
				handled = append(handled, rec)
			case rec["msg"] == "audit" && rec["audit"] == "sandbox":
				audit = append(audit, rec)
			}
		}
		if len(handled) != 1 || handled[0]["identity"] != w.identity {
			t.Errorf("%s by %s: the event's log lines %v, want one \"event handled\" with \"identity\":%q", w.what, w.identity, handled, w.identity)
		}
		if len(audit) != 1 || audit[0]["principal"] != w.auditPrincipal || audit[0]["operation"] != w.what ||
			audit[0]["sandbox_id"] != id || audit[0]["outcome"] != w.outcome {
			t.Errorf("%s by %s: audit lines %v, want one with principal %q, outcome %q", w.what, w.identity, audit, w.auditPrincipal, w.outcome)
		}
	}
}

// logRecordsOf reads every JSON line of the function's log.
func logRecordsOf(t *testing.T, f *function.Instance) []map[string]any {
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
		if json.Unmarshal(sc.Bytes(), &rec) == nil {
			out = append(out, rec)
		}
	}
	return out
}
