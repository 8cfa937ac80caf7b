package envd

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	fspb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem/filesystemconnect"
	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process/processconnect"
)

func TestAuthentication(t *testing.T) {
	cases := []struct {
		name, hash, token string
		ok                bool
		message           string
	}{
		{"right token", access.Hash(testToken), testToken, true, ""},
		{"hash in capitals", strings.ToUpper(access.Hash(testToken)), testToken, true, ""},
		{"no token", access.Hash(testToken), "", false, "missing X-Access-Token"},
		{"wrong token", access.Hash(testToken), "another", false, "wrong X-Access-Token"},
		{"no hash configured", "", testToken, false, "no ENVD_ACCESS_TOKEN_SHA256"},
		{"no hash, no token", "", "", false, "no ENVD_ACCESS_TOKEN_SHA256"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("HOME", t.TempDir())
			srv := serveAgent(t, c.hash)
			srv.Start()
			hc := &http.Client{Transport: tokenTransport{c.token, http.DefaultTransport}, Timeout: 10 * time.Second}
			wantCode := connect.CodeUnauthenticated
			if c.ok {
				wantCode = 0
			}
			checkRPC := func(what string, err error) {
				t.Helper()
				if code(err) != wantCode || (!c.ok && !strings.Contains(err.Error(), c.message)) {
					t.Errorf("%s: %v: want code %v with %q", what, err, wantCode, c.message)
				}
			}
			for _, opt := range []connect.ClientOption{connect.WithProtoJSON(), connect.WithGRPC()} {
				procs := processconnect.NewProcessClient(hc, srv.URL, opt)
				_, err := procs.List(t.Context(), connect.NewRequest(&pb.ListRequest{}))
				checkRPC("List (unary)", err)
				stream, err := procs.Start(t.Context(), connect.NewRequest(bash("true")))
				if err == nil {
					_, err = collect(t, stream)
				}
				checkRPC("Start (server stream)", err)
			}
			fs := filesystemconnect.NewFilesystemClient(hc, srv.URL)
			_, err := fs.Stat(t.Context(), connect.NewRequest(&fspb.StatRequest{Path: "/"}))
			checkRPC("Stat", err)

			status, b := do(t, hc, http.MethodGet, srv.URL+"/files?path=/etc/hostname", "", nil, nil)
			if c.ok {
				if status == http.StatusUnauthorized {
					t.Errorf("GET /files with the right token: %d %s", status, b)
				}
			} else {
				var e struct {
					Code    int
					Message string
				}
				_ = json.Unmarshal(b, &e)
				if status != http.StatusUnauthorized || e.Code != 401 || !strings.Contains(e.Message, c.message) {
					t.Errorf("GET /files: %d %s: want 401 with %q", status, b, c.message)
				}
			}
			// /health answers anyone: the SDK's isRunning sends no token.
			status, _ = do(t, http.DefaultClient, http.MethodGet, srv.URL+"/health", "", nil, nil)
			if status != http.StatusNoContent {
				t.Errorf("GET /health: %d, want 204", status)
			}
		})
	}
}

func TestTokenHashProblem(t *testing.T) {
	for hash, bad := range map[string]bool{
		"":                       true,
		"abc":                    true,
		strings.Repeat("g", 64):  true,
		access.Hash(testToken):   false,
		strings.Repeat("AB", 32): false,
	} {
		if got := TokenHashProblem(hash) != ""; got != bad {
			t.Errorf("TokenHashProblem(%q) reports a problem: %v, want %v", hash, got, bad)
		}
	}
}

// The server speaks h2c (HTTP/2 without TLS) beside HTTP/1.1.
func TestH2C(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	s := New(Config{TokenHash: access.Hash(testToken)})
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = NewHTTPServer("", s, slog.New(slog.DiscardHandler))
	srv.Start()
	defer srv.Close()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: &http.Transport{Protocols: &p}}
	resp, err := c.Get(srv.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusNoContent {
		t.Errorf("GET /health over h2c: %s %d, want HTTP/2 204", resp.Proto, resp.StatusCode)
	}
}

// TestInit: an agent started without its token's hash (a pooled Pod's)
// takes the first valid one POST /init gives, then answers that token
// alone; the same hash again is 204, another 409, a malformed one 400. An
// agent started with its hash (a cold create's) keeps it.
func TestInit(t *testing.T) {
	other := access.Hash("another token")
	body := func(h string) string { return `{"accessTokenHash":"` + h + `"}` }
	cases := []struct {
		name  string
		start string   // the hash from the environment
		inits []string // bodies sent in order
		codes []int
		works bool // a call with testToken after the inits
	}{
		{"pooled: set once", "", []string{body(access.Hash(testToken))}, []int{204}, true},
		{"pooled: the same again", "", []string{body(access.Hash(testToken)), body(strings.ToUpper(access.Hash(testToken)))}, []int{204, 204}, true},
		{"pooled: another after it", "", []string{body(access.Hash(testToken)), body(other)}, []int{204, 409}, true},
		{"pooled: first wins", "", []string{body(other), body(access.Hash(testToken))}, []int{204, 409}, false},
		{"pooled: never set", "", nil, nil, false},
		{"pooled: malformed", "", []string{body("xyz"), `{"accessTokenHash":`, body("")}, []int{400, 400, 400}, false},
		{"cold: its own hash", access.Hash(testToken), []string{body(access.Hash(testToken))}, []int{204}, true},
		{"cold: another refused", access.Hash(testToken), []string{body(other)}, []int{409}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("HOME", t.TempDir())
			srv := serveAgent(t, c.start)
			srv.Start()
			var codes []int
			for _, b := range c.inits {
				status, _ := do(t, http.DefaultClient, http.MethodPost, srv.URL+InitPath, "application/json", strings.NewReader(b), nil)
				codes = append(codes, status)
			}
			if !slices.Equal(codes, c.codes) {
				t.Errorf("POST %s answered %v, want %v", InitPath, codes, c.codes)
			}
			hc := &http.Client{Transport: tokenTransport{testToken, http.DefaultTransport}, Timeout: 10 * time.Second}
			_, err := processconnect.NewProcessClient(hc, srv.URL).List(t.Context(), connect.NewRequest(&pb.ListRequest{}))
			if (err == nil) != c.works {
				t.Errorf("a call with the token after the inits: %v, want working %v", err, c.works)
			}
		})
	}
}
