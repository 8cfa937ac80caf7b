package envd

import (
	"encoding/hex"
	"log/slog"
	"net/http"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/envd/filesystem"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem/filesystemconnect"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process/processconnect"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/process"
)

// Version is the envd version this agent speaks, which the control plane
// reports as a sandbox's envdVersion. The SDK gates features on it: 0.3.0
// stdin on or off, 0.4.0 no default user ("user" sent only when asked),
// 0.5.2 closeStdin, 0.5.7 application/octet-stream uploads (streams and
// gzip). 0.6.2 (file metadata) and later are not implemented, so the SDK
// refuses those features itself with a clear TemplateError.
const Version = "0.5.7"

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
	log     *slog.Logger
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
	mux.Handle(processconnect.NewProcessHandler(s.procs))
	mux.Handle(filesystemconnect.NewFilesystemHandler(s.files))
	mux.HandleFunc("GET /files", s.download)
	mux.HandleFunc("POST /files", s.upload)
	authed := s.authenticate(mux)
	root := http.NewServeMux()
	root.HandleFunc("GET /health", health)
	root.Handle("/", authed)
	s.handler = root
	return s
}

// TokenHashProblem says what is wrong with a configured token hash, or ""
// if nothing is: for a log line at start, since the agent then refuses
// every call.
func TokenHashProblem(hash string) string {
	if hash == "" {
		return EnvTokenHash + " is not set: the agent refuses every call but /health"
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
