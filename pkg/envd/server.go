package envd

import (
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/access"

	"github.com/deerflow-sandbox/provisioner/pkg/envd/filesystem"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem/filesystemconnect"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process/processconnect"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/process"
)

// Version is the envd version this agent speaks, which the control plane
// reports as a sandbox's envdVersion. The SDK gates features on it: 0.3.0
// stdin on or off, 0.4.0 no default user ("user" sent only when asked),
// 0.5.2 closeStdin, 0.5.7 application/octet-stream uploads (streams and
// gzip), 0.6.2 file metadata (filesystem/metadata.go), 0.6.3 the entry in
// watch events, 0.6.4 watches allowed on network mounts (this agent
// refuses no mount, so the flag asks for nothing more).
const Version = "0.6.4"

const (
	// Port is envd's port, on which the SDK (through the router) calls it.
	Port = 49983
	// DefaultAddr is the listen address without ENVD_ADDR.
	DefaultAddr = ":49983"
	// EnvAddr names the listen address's environment variable.
	EnvAddr = "ENVD_ADDR"
	// EnvTokenHash names the environment variable with the hex SHA-256 of
	// the sandbox's envd access token (pkg/access.Hash).
	EnvTokenHash = "ENVD_ACCESS_TOKEN_SHA256"
	// TokenHeader carries the envd access token.
	TokenHeader = "X-Access-Token"
)

// Config configures the agent.
type Config struct {
	// TokenHash is the hex SHA-256 of the access token; empty refuses
	// every call but /health.
	TokenHash string
	Log       *slog.Logger
}

// Server is the agent's HTTP handler.
type Server struct {
	log *slog.Logger
	// mu guards hash: set at start from the environment (a sandbox Pod
	// made by its create), or once by POST /init (a pooled Pod, made
	// before any create, so before its token existed).
	mu      sync.RWMutex
	hash    string
	handler http.Handler
	procs   *process.Service
	files   *filesystem.Service
}

// New is the agent.
func New(cfg Config) *Server {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		log:   log,
		hash:  cfg.TokenHash,
		procs: process.New(log),
		files: filesystem.New(log),
	}
	mux := http.NewServeMux()
	// Streams' flushes are coalesced (flush.go); unary answers are one
	// write anyway.
	path, h := processconnect.NewProcessHandler(s.procs)
	mux.Handle(path, coalesce(h))
	path, h = filesystemconnect.NewFilesystemHandler(s.files)
	mux.Handle(path, coalesce(h))
	mux.HandleFunc("GET /files", s.download)
	mux.HandleFunc("POST /files", s.upload)
	authed := s.authenticate(mux)
	root := http.NewServeMux()
	root.HandleFunc("GET /health", health)
	root.HandleFunc("POST /init", s.init)
	root.Handle("/", authed)
	s.handler = root
	return s
}

// InitPath is where the router gives a pooled sandbox's agent its token's
// hash, before the first call it forwards.
const InitPath = "/init"

// InitRequest is the body of POST /init.
type InitRequest struct {
	AccessTokenHash string `json:"accessTokenHash"`
}

// init sets the token's hash once, for an agent started without one: a
// pooled Pod's, made before its sandbox existed. The first valid hash
// wins; the same one again is 204, another 409. It needs no token, as
// there is none yet. Who can call it first: the pooled Pod answers no one
// until it is claimed (its policies), and then only the router, which sends
// the hash of the token it checked, and the sandbox's own code (its
// image's entrypoint, then the owner's), which can reach the agent anyway
// and so gains nothing: a wrong hash locks the owner out of its own
// sandbox, nobody else in.
func (s *Server) init(w http.ResponseWriter, r *http.Request) {
	var req InitRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "the body must be {\"accessTokenHash\": \"<64 hex digits>\"}: "+err.Error())
		return
	}
	hash := strings.ToLower(req.AccessTokenHash)
	if p := TokenHashProblem(hash); p != "" {
		writeError(w, http.StatusBadRequest, "accessTokenHash is not 64 hex digits (a SHA-256)")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.hash == "":
		s.hash = hash
		s.log.Info("token hash set by " + InitPath)
	case access.Equal(strings.ToLower(s.hash), hash):
	default:
		writeError(w, http.StatusConflict, "this agent has its token's hash already")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// tokenHash is the hash calls are checked against ("": none yet).
func (s *Server) tokenHash() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.hash
}

// TokenHashProblem says what is wrong with a configured token hash, or ""
// if nothing is: for a log line at start, since the agent then refuses
// every call.
func TokenHashProblem(hash string) string {
	if hash == "" {
		return EnvTokenHash + " is not set: the agent refuses every call but /health until POST " + InitPath + " gives it (a pooled sandbox's)"
	}
	if b, err := hex.DecodeString(hash); err != nil || len(b) != 32 {
		return EnvTokenHash + " is not 64 hex digits (a SHA-256): no token can match it, so the agent refuses every call but /health"
	}
	return ""
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.handler.ServeHTTP(w, r)
}

// Close stops what outlives requests (the filesystem watchers). Processes
// are left running: they are the sandbox's, not the agent's.
func (s *Server) Close() {
	s.files.Close()
}

// health answers 204 without authentication: the SDK's isRunning and the
// agent's own start wait on it, and it tells nothing about the sandbox.
func health(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusNoContent)
}

// NewHTTPServer serves h on addr over HTTP/1.1 and h2c (HTTP/2 without
// TLS: the router speaks either). It sets no write timeout: process output
// and watches are long-lived streams.
func NewHTTPServer(addr string, h http.Handler, log *slog.Logger) *http.Server {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		Protocols:         &p,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}
