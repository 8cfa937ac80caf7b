package envd

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem/filesystemconnect"
	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process/processconnect"
)

const testToken = "the-sandbox-envd-token"

// tokenTransport adds the access token, as the SDK's fetch does.
type tokenTransport struct {
	token string
	next  http.RoundTripper
}

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if t.token != "" {
		r.Header.Set(TokenHeader, t.token)
	}
	return t.next.RoundTrip(r)
}

type agent struct {
	url   string
	http  *http.Client // sends the token
	procs processconnect.ProcessClient
	fs    filesystemconnect.FilesystemClient
	home  string
}

// newAgent serves an agent whose token is testToken, with HOME a fresh
// directory, and clients that speak Connect with JSON as the SDK does
// (useBinaryFormat: false).
func newAgent(t *testing.T) *agent {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	srv := serveAgent(t, access.Hash(testToken))
	srv.Start()
	hc := &http.Client{Transport: tokenTransport{testToken, http.DefaultTransport}}
	return &agent{
		url:   srv.URL,
		http:  hc,
		procs: processconnect.NewProcessClient(hc, srv.URL, connect.WithProtoJSON()),
		fs:    filesystemconnect.NewFilesystemClient(hc, srv.URL, connect.WithProtoJSON()),
		home:  home,
	}
}

// serveAgent is an agent whose token hash is hash, not yet started (a
// test may set the server's listener first), closed when t ends.
func serveAgent(t *testing.T, hash string) *httptest.Server {
	t.Helper()
	s := New(Config{TokenHash: hash, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	srv := httptest.NewUnstartedServer(s)
	t.Cleanup(s.Close)
	t.Cleanup(srv.Close)
	return srv
}

// result is what a process's stream told.
type result struct {
	pid            uint32
	stdout, stderr string
	end            *pb.ProcessEvent_EndEvent
	keepalives     int
}

type eventStream interface {
	Receive() bool
	Err() error
}

// collect reads a Start or Connect stream to its end.
func collect[T interface{ GetEvent() *pb.ProcessEvent }](t *testing.T, s interface {
	eventStream
	Msg() T
}) (result, error) {
	t.Helper()
	var r result
	for s.Receive() {
		switch e := s.Msg().GetEvent().GetEvent().(type) {
		case *pb.ProcessEvent_Start:
			r.pid = e.Start.GetPid()
		case *pb.ProcessEvent_Data:
			r.stdout += string(e.Data.GetStdout())
			r.stderr += string(e.Data.GetStderr())
		case *pb.ProcessEvent_End:
			r.end = e.End
		case *pb.ProcessEvent_Keepalive:
			r.keepalives++
		}
	}
	return r, s.Err()
}

// bash is the request the SDK's commands.run sends.
func bash(cmd string) *pb.StartRequest {
	return &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}, Stdin: new(false)}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or 5 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// code is err's Connect code; 0 for no error.
func code(err error) connect.Code {
	if err == nil {
		return 0
	}
	return connect.CodeOf(err)
}
