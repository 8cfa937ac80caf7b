package envd

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const tenMiB = 10 << 20

// randomBytes is n reproducible, incompressible bytes.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{1})
	_, _ = r.Read(b)
	return b
}

func filesURL(a *agent, path string) string {
	q := url.Values{}
	if path != "" {
		q.Set("path", path)
	}
	return a.url + "/files?" + q.Encode()
}

// multipartBody streams a multipart body with one "file" part per name,
// the way the SDK's FormData does (the filename is the destination path).
func multipartBody(files map[string][]byte) (io.Reader, string) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		for name, data := range files {
			w, err := mw.CreateFormFile("file", name)
			if err == nil {
				_, err = w.Write(data)
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.CloseWithError(mw.Close())
	}()
	return pr, mw.FormDataContentType()
}

func do(t *testing.T, c *http.Client, method, u, contentType string, body io.Reader, hdr map[string]string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func TestUploadAndDownload(t *testing.T) {
	a := newAgent(t)
	data := randomBytes(tenMiB)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(data)
	_ = zw.Close()
	cases := []struct {
		name        string
		query       string
		body        func() (io.Reader, string)
		hdr         map[string]string
		wantWritten []writtenFile
	}{
		{
			name:  "multipart to ?path",
			query: "up/multi.bin",
			body:  func() (io.Reader, string) { return multipartBody(map[string][]byte{"ignored": data}) },
			wantWritten: []writtenFile{
				{Name: "multi.bin", Type: "file", Path: filepath.Join(a.home, "up/multi.bin")},
			},
		},
		{
			name: "multipart to the part's filename (a path)",
			body: func() (io.Reader, string) {
				return multipartBody(map[string][]byte{filepath.Join(a.home, "deep/dir/named.bin"): data})
			},
			wantWritten: []writtenFile{
				{Name: "named.bin", Type: "file", Path: filepath.Join(a.home, "deep/dir/named.bin")},
			},
		},
		{
			name:  "octet-stream",
			query: "/" + strings.TrimPrefix(filepath.Join(a.home, "raw.bin"), "/"),
			body:  func() (io.Reader, string) { return bytes.NewReader(data), "application/octet-stream" },
			wantWritten: []writtenFile{
				{Name: "raw.bin", Type: "file", Path: filepath.Join(a.home, "raw.bin")},
			},
		},
		{
			name:  "octet-stream, gzip",
			query: "gz.bin",
			body:  func() (io.Reader, string) { return bytes.NewReader(gz.Bytes()), "application/octet-stream" },
			hdr:   map[string]string{"Content-Encoding": "gzip"},
			wantWritten: []writtenFile{
				{Name: "gz.bin", Type: "file", Path: filepath.Join(a.home, "gz.bin")},
			},
		},
	}
	want := sha256.Sum256(data)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body, ct := c.body()
			status, b := do(t, a.http, http.MethodPost, filesURL(a, c.query), ct, body, c.hdr)
			if status != http.StatusOK {
				t.Fatalf("upload: %d %s", status, b)
			}
			var written []writtenFile
			if err := json.Unmarshal(b, &written); err != nil {
				t.Fatalf("upload answer %s: %v", b, err)
			}
			if diff := cmp.Diff(c.wantWritten, written); diff != "" {
				t.Errorf("upload answer (-want +got):\n%s", diff)
			}
			status, got := do(t, a.http, http.MethodGet, filesURL(a, written[0].Path), "", nil, nil)
			if status != http.StatusOK || sha256.Sum256(got) != want {
				t.Errorf("download: %d, %d bytes: want 200 and the %d bytes uploaded", status, len(got), len(data))
			}
		})
	}
}

func TestFilesErrors(t *testing.T) {
	a := newAgent(t)
	cases := []struct {
		name, method, query, contentType, body string
		want                                   int
	}{
		{"download missing", http.MethodGet, "nope.txt", "", "", http.StatusNotFound},
		{"download a directory", http.MethodGet, "/", "", "", http.StatusBadRequest},
		{"download without path", http.MethodGet, "", "", "", http.StatusBadRequest},
		{"octet-stream without path", http.MethodPost, "", "application/octet-stream", "x", http.StatusBadRequest},
		{"upload onto a directory", http.MethodPost, "/", "application/octet-stream", "x", http.StatusBadRequest},
		{"bad gzip", http.MethodPost, "x.gz", "application/octet-stream", "not gzip", http.StatusBadRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{}
			if c.name == "bad gzip" {
				hdr["Content-Encoding"] = "gzip"
			}
			status, b := do(t, a.http, c.method, filesURL(a, c.query), c.contentType, strings.NewReader(c.body), hdr)
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatalf("%d %s: not envd's JSON error: %v", status, b, err)
			}
			if status != c.want || e.Code != c.want || e.Message == "" {
				t.Errorf("%d %s: want %d with a message", status, b, c.want)
			}
		})
	}
}
