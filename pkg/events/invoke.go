package events

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/problem"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// invokeOperations maps the "operation" of a POST / body to its event type.
var invokeOperations = map[string]string{
	"create": TypeCreate, "get": TypeGet, "list": TypeList, "destroy": TypeDestroy, "reap": TypeReap,
	"pause": TypePause, "resume": TypeResume, "egress": TypeEgress,
}

// invokeNames lists the operations for error details.
var invokeNames = strings.Join(slices.Sorted(maps.Keys(invokeOperations)), ", ")

// Invoke handles POST / with a plain JSON body, which is what
// `kn func invoke --format http` sends: {"operation": "create", ...} runs the
// same operation as the event of that type, with the rest of the body as its
// data. It is an event door: the same settings (EVENTS_DISABLED, the source
// allow-list, with the body's optional "source") and the same credentials
// apply. func's default body ({"message": "Hello World"}) gets a 400 that
// says how to call us instead.
func (h *Handler) Invoke(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	opName, code := "invoke", 0
	defer func() { h.metrics.ObserveRequest(opName, "invoke", code, time.Since(start)) }()

	if h.cfg.EventsDisabled {
		code = writeDetail(w, http.StatusNotFound, eventsDisabled)
		return
	}
	// Only JSON: a web page can POST a form or text/plain cross-site without
	// a preflight, never application/json, so this keeps a browser from
	// driving a developer's function.
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		code = writeDetail(w, http.StatusUnsupportedMediaType, "POST / takes Content-Type: application/json")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxRequestBodyBytes))
	if err != nil {
		code = writeDetail(w, http.StatusRequestEntityTooLarge, "request body too large or unreadable: "+err.Error())
		return
	}
	var envelope struct {
		Operation string `json:"operation"`
		Source    string `json:"source"`
	}
	if err := json.Unmarshal(body, &envelope); err != nil || envelope.Operation == "" {
		code = writeDetail(w, http.StatusBadRequest, fmt.Sprintf(
			"POST / expects a JSON object with \"operation\" (one of %s) and that operation's fields, e.g. "+
				`{"operation":"create","sandbox_id":"abcd1234","api_key":"..."}; DeerFlow's API is under /api/sandboxes, and CloudEvents of types %s are accepted here too`,
			invokeNames, strings.Join(RequestTypes, ", ")))
		return
	}
	evType, ok := invokeOperations[envelope.Operation]
	if !ok {
		code = writeDetail(w, http.StatusBadRequest, fmt.Sprintf("unknown operation %q; use one of %s",
			api.Truncate(envelope.Operation), invokeNames))
		return
	}
	op := operations[evType]
	opName = op.name
	ctx, c, detail, _, release := h.admit(r.Context(), w, r, opName, envelope.Source, body)
	if c != 0 {
		code = writeDetail(w, c, detail)
		reqid.Logger(ctx).Warn("invoke refused", "operation", opName, "status", code, "reason", detail)
		return
	}
	defer release()
	reply, _, err := op.run(h, ctx, body, "")
	if err != nil {
		code = problem.Write(w, err)
		reqid.Logger(ctx).Info("invoke failed", "operation", opName, "status", code, "error", err)
		return
	}
	code = http.StatusOK
	problem.WriteJSON(w, code, reply)
}
