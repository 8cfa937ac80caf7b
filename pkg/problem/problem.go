// Package problem turns domain errors into HTTP answers for both front doors:
// one status per error kind and a {"detail": ...} body a person can act on.
package problem

import (
	"encoding/json"
	"net/http"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

// Body is the error body DeerFlow's client (FastAPI's convention) reads.
type Body struct {
	Detail string `json:"detail"`
}

// Status maps an error kind to its HTTP status.
func Status(err error) int {
	switch api.KindOf(err) {
	case api.KindMalformed:
		return http.StatusBadRequest
	case api.KindInvalid:
		return http.StatusUnprocessableEntity
	case api.KindForbidden:
		return http.StatusForbidden
	case api.KindNotFound:
		return http.StatusNotFound
	case api.KindConflict:
		return http.StatusConflict
	case api.KindQuota:
		return http.StatusTooManyRequests
	case api.KindUnavailable:
		return http.StatusServiceUnavailable
	case api.KindTimeout:
		return http.StatusGatewayTimeout
	default:
		return http.StatusInternalServerError
	}
}

// Write answers with err's status and detail. Transient failures carry
// Retry-After, so well-behaved clients back off instead of hammering.
func Write(w http.ResponseWriter, err error) int {
	code := Status(err)
	if code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	WriteDetail(w, code, api.DetailOf(err))
	return code
}

// WriteDetail answers with code and detail.
func WriteDetail(w http.ResponseWriter, code int, detail string) {
	WriteJSON(w, code, Body{Detail: detail})
}

// WriteJSON answers with code and v as JSON.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
