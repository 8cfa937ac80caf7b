package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/egress"
)

// EgressRequest is the body of POST and DELETE /api/sandboxes/{id}/egress
// (and of the egress CloudEvent): names to grant, for a duration or (For
// omitted) the sandbox's lifetime, or to revoke.
type EgressRequest struct {
	Allow []string `json:"allow"`
	For   string   `json:"for,omitempty"`
}

// EgressChange is a validated EgressRequest.
type EgressChange struct {
	Allow  []string
	For    time.Duration // 0: the sandbox's lifetime
	Revoke bool
}

// maxGrantFor bounds a timed grant; a longer one is a lifetime grant.
const maxGrantFor = 30 * 24 * time.Hour

// DecodeEgressRequest reads and checks a grant (revoke false) or a revoke.
func DecodeEgressRequest(body []byte, revoke bool) (EgressChange, error) {
	var req EgressRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return EgressChange{}, Malformedf("the body must be a JSON object such as {\"allow\": [\"pypi.org\"], \"for\": \"10m\"}: %v", err)
	}
	if len(req.Allow) == 0 {
		return EgressChange{}, &Error{Kind: KindInvalid, Detail: "allow: name at least one host, such as [\"pypi.org\"] or [\"*.github.com\"]"}
	}
	names, err := egress.CleanNames(req.Allow)
	if err != nil {
		return EgressChange{}, &Error{Kind: KindInvalid, Detail: "allow: " + err.Error()}
	}
	c := EgressChange{Allow: names, Revoke: revoke}
	if req.For != "" {
		if revoke {
			return EgressChange{}, &Error{Kind: KindInvalid, Detail: "for: a revoke takes effect at once and for good; send only allow"}
		}
		d, err := time.ParseDuration(req.For)
		if err != nil || d < time.Second || d > maxGrantFor {
			return EgressChange{}, &Error{Kind: KindInvalid, Detail: fmt.Sprintf("for: %q: want a duration from 1s to %s, such as \"10m\", or leave it out for the sandbox's lifetime", req.For, maxGrantFor)}
		}
		c.For = d
	}
	return c, nil
}
