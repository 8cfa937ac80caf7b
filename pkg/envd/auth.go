package envd

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem/filesystemconnect"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process/processconnect"
)

var rpcErrors = connect.NewErrorWriter()

// authenticate lets a request through only with the sandbox's access
// token. A refused RPC gets Connect's Unauthenticated in its own protocol
// (the SDK's AuthenticationError), anything else 401 with the JSON error
// the SDK reads.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var msg string
		switch hash, tok := s.tokenHash(), r.Header.Get(TokenHeader); {
		case hash == "":
			msg = "this agent has no " + EnvTokenHash + " (the hash of the sandbox's access token) and no " + InitPath + " gave it one, so it refuses every call"
		case tok == "":
			msg = "missing " + TokenHeader + ": every call to this sandbox's agent needs the sandbox's envd access token"
		case !access.MatchesHash(hash, tok):
			msg = "wrong " + TokenHeader + ": it is not this sandbox's envd access token"
		default:
			next.ServeHTTP(w, r)
			return
		}
		s.log.Warn("refused a call", "path", r.URL.Path, "reason", msg)
		if isRPC(r) && rpcErrors.IsSupported(r) {
			_ = rpcErrors.Write(w, r, connect.NewError(connect.CodeUnauthenticated, errors.New(msg)))
			return
		}
		writeError(w, http.StatusUnauthorized, msg)
	})
}

// isRPC says whether r calls one of the Connect services (the ErrorWriter
// alone takes any GET for a Connect GET).
func isRPC(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/"+processconnect.ProcessName+"/") ||
		strings.HasPrefix(r.URL.Path, "/"+filesystemconnect.FilesystemName+"/")
}

// writeError answers envd's JSON error, {"code": status, "message": msg},
// whose message the SDK shows.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}
