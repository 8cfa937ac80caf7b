package envd

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem"
)

// TestFileMetadata: E2B's file metadata (envd 0.6.2). An upload's
// X-Metadata-<key> headers become the file's user.e2b.<key> extended
// attributes, in place of what it had; its answer, Stat, ListDir and a
// rename show them, and so do attributes a process set itself. Bad pairs
// are 400 and write nothing. The test directory's filesystem (the host's)
// keeps user extended attributes, as gVisor's root overlay does.
func TestFileMetadata(t *testing.T) {
	a := newAgent(t)
	ctx := ctxTimeout(t, 20*time.Second)
	upload := func(path string, hdr map[string]string) (int, []writtenFile, string) {
		t.Helper()
		status, b := do(t, a.http, http.MethodPost, filesURL(a, path), "application/octet-stream", strings.NewReader("content"), hdr)
		var w []writtenFile
		if status == http.StatusOK {
			if err := json.Unmarshal(b, &w); err != nil {
				t.Fatalf("upload answer %s: %v", b, err)
			}
		}
		return status, w, string(b)
	}
	stat := func(path string) map[string]string {
		t.Helper()
		st, err := a.fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: path}))
		if err != nil {
			t.Fatal(err)
		}
		return st.Msg.GetEntry().GetMetadata()
	}
	want := map[string]string{"author": "mish", "purpose": "an upload"}

	// The SDK sends X-Metadata-author; Go's client canonicalizes it.
	_, w, _ := upload("m.txt", map[string]string{"X-Metadata-author": "mish", "x-metadata-Purpose": "an upload"})
	if diff := cmp.Diff(want, w[0].Metadata); diff != "" {
		t.Errorf("upload answer's metadata (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, stat("m.txt")); diff != "" {
		t.Errorf("Stat's metadata (-want +got):\n%s", diff)
	}
	ls, err := a.fs.ListDir(ctx, connect.NewRequest(&pb.ListDirRequest{Path: a.home, Depth: 1}))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ls.Msg.GetEntries() {
		if e.GetName() == "m.txt" {
			if diff := cmp.Diff(want, e.GetMetadata()); diff != "" {
				t.Errorf("ListDir's metadata (-want +got):\n%s", diff)
			}
		}
	}
	mv, err := a.fs.Move(ctx, connect.NewRequest(&pb.MoveRequest{Source: "m.txt", Destination: "moved.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, mv.Msg.GetEntry().GetMetadata()); diff != "" {
		t.Errorf("the renamed file's metadata (-want +got):\n%s", diff)
	}

	// An upload replaces the metadata: fewer pairs, then none.
	if _, w, _ = upload("moved.txt", map[string]string{"X-Metadata-Author": "other"}); !cmp.Equal(map[string]string{"author": "other"}, w[0].Metadata) {
		t.Errorf("upload with one pair answered %v", w[0].Metadata)
	}
	if got := stat("moved.txt"); !cmp.Equal(map[string]string{"author": "other"}, got) {
		t.Errorf("after an upload with one pair: %v", got)
	}
	if _, w, _ = upload("moved.txt", nil); w[0].Metadata != nil {
		t.Errorf("upload with none answered %v", w[0].Metadata)
	}
	if got := stat("moved.txt"); got != nil {
		t.Errorf("after an upload with none: %v, want none", got)
	}

	// Set by a process in the sandbox, out of band.
	if err := unix.Setxattr(filepath.Join(a.home, "moved.txt"), "user.e2b.tag", []byte("set"), 0); err != nil {
		t.Fatal(err)
	}
	if got := stat("moved.txt"); !cmp.Equal(map[string]string{"tag": "set"}, got) {
		t.Errorf("an attribute set in the sandbox: %v", got)
	}

	for _, c := range []struct {
		name string
		hdr  map[string]string
	}{
		{"a value past US-ASCII", map[string]string{"X-Metadata-Good": "café"}},
		{"a value with a tab", map[string]string{"X-Metadata-Good": "a\tb"}},
		{"a key past 246 bytes", map[string]string{"X-Metadata-" + strings.Repeat("k", 247): "v"}},
		{"more than 4096 bytes in all", map[string]string{"X-Metadata-A": strings.Repeat("v", 2100), "X-Metadata-B": strings.Repeat("v", 2100)}},
	} {
		status, _, body := upload("refused.txt", c.hdr)
		if status != http.StatusBadRequest || !strings.Contains(body, "metadata") {
			t.Errorf("%s: %d %s, want 400 naming the metadata", c.name, status, body)
		}
		if _, err := os.Stat(filepath.Join(a.home, "refused.txt")); !os.IsNotExist(err) {
			t.Errorf("%s: the refused upload wrote its file (%v)", c.name, err)
		}
	}
}
