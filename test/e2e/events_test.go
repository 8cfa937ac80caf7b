//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/uuid"

	"github.com/deerflow-sandbox/provisioner/pkg/events"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// send delivers one event with the sdk-go client and returns the reply (nil
// on an error result) and the HTTP status.
func send(t *testing.T, f *function.Instance, structured bool, typ, subject string, data any, headers map[string]string) (*cloudevents.Event, int) {
	t.Helper()
	c, err := cloudevents.NewClientHTTP(cloudevents.WithTarget(f.URL))
	if err != nil {
		t.Fatal(err)
	}
	ev := cloudevents.NewEvent()
	ev.SetID(uuid.NewString())
	ev.SetSource("/e2e")
	ev.SetType(typ)
	if subject != "" {
		ev.SetSubject(subject)
	}
	if data != nil {
		if err := ev.SetData(cloudevents.ApplicationJSON, data); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := http.Header{}
	for k, v := range headers {
		h.Set(k, v)
	}
	ctx = cehttp.WithCustomHeader(ctx, h)
	if structured {
		ctx = binding.WithForceStructured(ctx)
	} else {
		ctx = binding.WithForceBinary(ctx)
	}
	reply, result := c.Request(ctx, ev)
	var httpResult *cehttp.Result
	if cloudevents.ResultAs(result, &httpResult) {
		return reply, httpResult.StatusCode
	}
	if !cloudevents.IsACK(result) {
		t.Fatalf("sending %s: %v", typ, result)
	}
	return reply, http.StatusOK
}

func replyData(t *testing.T, ev *cloudevents.Event) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(ev.Data(), &m); err != nil {
		t.Fatalf("reply data %q: %v", ev.Data(), err)
	}
	return m
}

func TestCloudEventsEveryType(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name       string
		structured bool
	}{{"binary", false}, {"structured", true}} {
		t.Run(mode.name, func(t *testing.T) {
			ns := namespace(t)
			f := start(t, ns, nil)
			key := map[string]string{"X-API-Key": function.Key}
			id := "ev-" + mode.name

			reply, code := send(t, f, mode.structured, events.TypeCreate, "", map[string]any{"sandbox_id": id, "thread_id": "t1"}, key)
			if code != 200 || reply == nil {
				t.Fatalf("create: %d", code)
			}
			if reply.Type() != events.TypeCreated || reply.Subject() != id {
				t.Errorf("create reply type %q subject %q", reply.Type(), reply.Subject())
			}
			created := replyData(t, reply)
			if !nodePortURL.MatchString(created["sandbox_url"].(string)) {
				t.Errorf("create reply data %v", created)
			}
			// The same Kubernetes effect as the HTTP call: one Pod, one Service.
			if p, s := len(pods(t, ns, "sandbox-id="+id)), len(services(t, ns, "sandbox-id="+id)); p != 1 || s != 1 {
				t.Errorf("%d Pods, %d Services after the create event", p, s)
			}
			// Redelivery is harmless.
			if again, code := send(t, f, mode.structured, events.TypeCreate, "", map[string]any{"sandbox_id": id, "thread_id": "t1"}, key); code != 200 || replyData(t, again)["sandbox_url"] != created["sandbox_url"] {
				t.Errorf("redelivered create: %d", code)
			}

			reply, code = send(t, f, mode.structured, events.TypeGet, id, nil, key)
			if code != 200 || reply.Type() != events.TypeStatus || reply.Subject() != id || replyData(t, reply)["sandbox_url"] != created["sandbox_url"] {
				t.Errorf("get: %d %v", code, reply)
			}
			reply, code = send(t, f, mode.structured, events.TypeGet, "", map[string]any{"sandbox_id": id, "wait_seconds": 15}, key)
			if code != 200 || replyData(t, reply)["status"] != "Running" {
				t.Errorf("get with wait: %d %v", code, reply)
			}
			reply, code = send(t, f, mode.structured, events.TypeList, "", nil, key)
			if code != 200 || reply.Type() != events.TypeListed || replyData(t, reply)["count"].(float64) != 1 {
				t.Errorf("list: %d %v", code, reply)
			}
			for _, typ := range []string{events.TypeReap, events.TypePing} {
				reply, code = send(t, f, mode.structured, typ, "", nil, key)
				if code != 200 || reply.Type() != events.TypeReaped || replyData(t, reply)["count"].(float64) != 0 {
					t.Errorf("%s: %d %v", typ, code, reply)
				}
			}
			reply, code = send(t, f, mode.structured, events.TypeDestroy, id, nil, key)
			if code != 200 || reply.Type() != events.TypeDestroyed || replyData(t, reply)["ok"] != true {
				t.Errorf("destroy: %d %v", code, reply)
			}
			eventually(t, 30*time.Second, "sandbox destroyed by event", func() (bool, error) {
				return len(pods(t, ns, "sandbox-id="+id)) == 0, nil
			})

			// Refusals.
			if _, code := send(t, f, mode.structured, events.TypeCreate, "", map[string]any{"sandbox_id": "nokey"}, nil); code != 401 {
				t.Errorf("create without the key: %d, want 401", code)
			}
			for _, typ := range []string{events.TypeGet, events.TypeList, events.TypeReap, events.TypePing} {
				if _, code := send(t, f, mode.structured, typ, "nokey", nil, nil); code != 401 {
					t.Errorf("%s without the key: %d, want 401", typ, code)
				}
			}
			if len(pods(t, ns, "sandbox-id=nokey")) != 0 {
				t.Errorf("a refused event created a sandbox")
			}
			if _, code := send(t, f, mode.structured, events.TypeCreate, "", map[string]any{"sandbox_id": "Bad_ID"}, key); code != 422 {
				t.Errorf("invalid data: %d, want 422", code)
			}
			if _, code := send(t, f, mode.structured, "com.example.other", "", map[string]any{}, nil); code < 400 || code > 499 {
				t.Errorf("unknown type: %d, want 4xx", code)
			}
			if _, code := send(t, f, mode.structured, events.TypeGet, "absent", nil, key); code != 404 {
				t.Errorf("get of an absent sandbox: %d, want 404", code)
			}
		})
	}
}

func TestMalformedEventIs400(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, nil)
	for name, hdr := range map[string]map[string]string{
		"binary without id":   {"Ce-Specversion": "1.0", "Ce-Type": events.TypeList, "Ce-Source": "/x"},
		"unknown specversion": {"Ce-Specversion": "9.9", "Ce-Id": "1", "Ce-Type": events.TypeList, "Ce-Source": "/x"},
		"structured garbage":  {"Content-Type": "application/cloudevents+json"},
	} {
		r, err := f.DoWithHeaders("POST", "/", "{not json", hdr)
		if err != nil {
			t.Fatal(err)
		}
		if r.Code != 400 || r.Detail() == "" {
			t.Errorf("%s: %d %s, want 400 with a detail", name, r.Code, r.Raw)
		}
	}
}

// TestKnFuncInvokeReplay sends what `kn func invoke` sends: POST / with its
// default body in --format http, and a CloudEvent of type boson.fn from
// source /boson/fn in --format cloudevent, with and without --data/--type.
func TestKnFuncInvokeReplay(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, nil)
	// kn func invoke can send neither headers nor extensions: the key
	// travels as the api_key field of the data.
	withKey := func(data string) string {
		if data == "{}" {
			return `{"api_key":"` + function.Key + `"}`
		}
		return strings.Replace(data, "{", `{"api_key":"`+function.Key+`",`, 1)
	}
	kn := map[string]string{"User-Agent": "Go-http-client/1.1", "Content-Type": "application/json"}
	knEvent := func(typ string) map[string]string {
		return map[string]string{"Ce-Specversion": "1.0", "Ce-Id": uuid.NewString(), "Ce-Source": "/boson/fn",
			"Ce-Type": typ, "Content-Type": "application/json"}
	}

	// Defaults: a helpful 400 that says how to call us, in both formats.
	r, _ := f.DoWithHeaders("POST", "/", `{"message":"Hello World"}`, kn)
	if r.Code != 400 || !strings.Contains(r.Detail(), `"operation"`) {
		t.Errorf("kn func invoke --format http default: %d %s", r.Code, r.Raw)
	}
	r, _ = f.DoWithHeaders("POST", "/", `{"message":"Hello World"}`, knEvent("boson.fn"))
	if r.Code != 400 || !strings.Contains(r.Detail(), events.TypeCreate) {
		t.Errorf("kn func invoke --format cloudevent default: %d %s", r.Code, r.Raw)
	}

	// --format http --data '{"operation": ...}'
	for _, step := range []struct{ data, want string }{
		{`{"operation":"create","sandbox_id":"kn1"}`, `"sandbox_url":"http://127.0.0.1:`},
		{`{"operation":"get","sandbox_id":"kn1"}`, `"sandbox_id":"kn1"`},
		{`{"operation":"list"}`, `"count":1`},
		{`{"operation":"reap"}`, `"count":0`},
		{`{"operation":"destroy","sandbox_id":"kn1"}`, `"ok":true`},
	} {
		if r, _ := f.DoWithHeaders("POST", "/", step.data, kn); r.Code != 401 {
			t.Errorf("--format http --data %s without the key: %d %s", step.data, r.Code, r.Raw)
		}
		r, _ := f.DoWithHeaders("POST", "/", withKey(step.data), kn)
		if r.Code != 200 || !strings.Contains(string(r.Raw), step.want) {
			t.Errorf("--format http --data %s: %d %s", step.data, r.Code, r.Raw)
		}
	}
	// --format cloudevent --type <request type> --data '...'
	for _, step := range []struct{ typ, data, wantType string }{
		{events.TypeCreate, `{"sandbox_id":"kn2"}`, events.TypeCreated},
		{events.TypeGet, `{"sandbox_id":"kn2"}`, events.TypeStatus},
		{events.TypeList, `{}`, events.TypeListed},
		{events.TypeReap, `{}`, events.TypeReaped},
		{events.TypeDestroy, `{"sandbox_id":"kn2"}`, events.TypeDestroyed},
	} {
		r, _ := f.DoWithHeaders("POST", "/", withKey(step.data), knEvent(step.typ))
		if r.Code != 200 || r.Header.Get("Ce-Type") != step.wantType {
			t.Errorf("--format cloudevent --type %s: %d %q %s", step.typ, r.Code, r.Header.Get("Ce-Type"), r.Raw)
		}
	}
}
