package envd

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem"
)

func TestFilesystem(t *testing.T) {
	a := newAgent(t)
	ctx := ctxTimeout(t, 20*time.Second)
	h := a.home
	if err := os.WriteFile(filepath.Join(h, "file.txt"), []byte("12345"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("file.txt", filepath.Join(h, "link")); err != nil {
		t.Fatal(err)
	}

	// Stat: absolute, relative (under home), missing, a symlink.
	st, err := a.fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: "file.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	e := st.Msg.GetEntry()
	type entry struct {
		Name, Path, Permissions string
		Type                    pb.FileType
		Size                    int64
		Mode                    uint32
		Target                  string
	}
	brief := func(e *pb.EntryInfo) entry {
		return entry{e.GetName(), e.GetPath(), e.GetPermissions(), e.GetType(), e.GetSize(), e.GetMode(), e.GetSymlinkTarget()}
	}
	if diff := cmp.Diff(entry{"file.txt", filepath.Join(h, "file.txt"), "-rw-r-----", pb.FileType_FILE_TYPE_FILE, 5, 0o640, ""}, brief(e)); diff != "" {
		t.Errorf("Stat (-want +got):\n%s", diff)
	}
	if e.GetOwner() == "" || e.GetModifiedTime() == nil {
		t.Errorf("Stat: owner %q, modified %v: want both", e.GetOwner(), e.GetModifiedTime())
	}
	st, err = a.fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: filepath.Join(h, "link")}))
	if err != nil {
		t.Fatal(err)
	}
	if got := brief(st.Msg.GetEntry()); got.Type != pb.FileType_FILE_TYPE_SYMLINK || got.Target != filepath.Join(h, "file.txt") {
		t.Errorf("Stat of a symlink: %+v: want a symlink to %s", got, filepath.Join(h, "file.txt"))
	}

	// MakeDir: made, then AlreadyExists (the SDK's makeDir answers false).
	md, err := a.fs.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: "a/b/c"}))
	if err != nil {
		t.Fatal(err)
	}
	if md.Msg.GetEntry().GetType() != pb.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("MakeDir's entry %v: want a directory", md.Msg.GetEntry())
	}
	if err := os.WriteFile(filepath.Join(h, "a/b/deep.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	// Move makes the destination's parents.
	mv, err := a.fs.Move(ctx, connect.NewRequest(&pb.MoveRequest{Source: "file.txt", Destination: "moved/to/file2.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	if mv.Msg.GetEntry().GetPath() != filepath.Join(h, "moved/to/file2.txt") {
		t.Errorf("Move's entry %v", mv.Msg.GetEntry())
	}

	list := func(depth uint32) []string {
		t.Helper()
		l, err := a.fs.ListDir(ctx, connect.NewRequest(&pb.ListDirRequest{Path: h, Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range l.Msg.GetEntries() {
			rel, _ := filepath.Rel(h, e.GetPath())
			out = append(out, rel)
		}
		sort.Strings(out)
		return out
	}
	if diff := cmp.Diff([]string{"a", "link", "moved"}, list(0)); diff != "" {
		t.Errorf("ListDir depth 0 (as 1) (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a", "a/b", "link", "moved", "moved/to"}, list(2)); diff != "" {
		t.Errorf("ListDir depth 2 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a", "a/b", "a/b/c", "a/b/deep.txt", "link", "moved", "moved/to", "moved/to/file2.txt"}, list(10)); diff != "" {
		t.Errorf("ListDir depth 10 (-want +got):\n%s", diff)
	}

	if _, err := a.fs.Remove(ctx, connect.NewRequest(&pb.RemoveRequest{Path: "a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h, "a")); !os.IsNotExist(err) {
		t.Errorf("after Remove, a: %v", err)
	}

	// Errors, with the codes the SDK maps.
	errs := []struct {
		name string
		call func() error
		want connect.Code
	}{
		{"stat missing", func() error {
			_, err := a.fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: "/nonexistent/x"}))
			return err
		}, connect.CodeNotFound},
		{"stat empty path", func() error {
			_, err := a.fs.Stat(ctx, connect.NewRequest(&pb.StatRequest{}))
			return err
		}, connect.CodeInvalidArgument},
		{"make existing", func() error {
			_, err := a.fs.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: "moved"}))
			return err
		}, connect.CodeAlreadyExists},
		{"make over a file", func() error {
			_, err := a.fs.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: "moved/to/file2.txt"}))
			return err
		}, connect.CodeAlreadyExists},
		{"make under a file", func() error {
			_, err := a.fs.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: "moved/to/file2.txt/d"}))
			return err
		}, connect.CodeInvalidArgument},
		{"move missing", func() error {
			_, err := a.fs.Move(ctx, connect.NewRequest(&pb.MoveRequest{Source: "nope", Destination: "x"}))
			return err
		}, connect.CodeNotFound},
		{"list missing", func() error {
			_, err := a.fs.ListDir(ctx, connect.NewRequest(&pb.ListDirRequest{Path: "nope"}))
			return err
		}, connect.CodeNotFound},
		{"list a file", func() error {
			_, err := a.fs.ListDir(ctx, connect.NewRequest(&pb.ListDirRequest{Path: "moved/to/file2.txt"}))
			return err
		}, connect.CodeInvalidArgument},
		// Removing what is not there succeeds, as E2B's envd does (its own
		// suite: files/remove "remove non-existing file").
		{"remove missing", func() error {
			_, err := a.fs.Remove(ctx, connect.NewRequest(&pb.RemoveRequest{Path: "nope"}))
			return err
		}, 0},
		{"watch missing", func() error {
			_, err := a.fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: "nope"}))
			return err
		}, connect.CodeNotFound},
		{"events of no watcher", func() error {
			_, err := a.fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: "nope"}))
			return err
		}, connect.CodeNotFound},
	}
	for _, c := range errs {
		if got := code(c.call()); got != c.want {
			t.Errorf("%s: code %v, want %v", c.name, got, c.want)
		}
	}
}

func TestWatchDir(t *testing.T) {
	a := newAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := os.Mkdir(filepath.Join(a.home, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	stream, err := a.fs.WatchDir(ctx, connect.NewRequest(&pb.WatchDirRequest{Path: a.home, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("no start event: %v %v", stream.Msg(), stream.Err())
	}
	if err := os.WriteFile(filepath.Join(a.home, "sub", "new.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
		ev := stream.Msg().GetFilesystem()
		if ev.GetType() == pb.EventType_EVENT_TYPE_CREATE && ev.GetName() == "sub/new.txt" {
			cancel()
			return
		}
	}
	t.Fatalf("no create event for sub/new.txt: %v", stream.Err())
}

func TestWatcher(t *testing.T) {
	a := newAgent(t)
	ctx := ctxTimeout(t, 20*time.Second)
	cw, err := a.fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: a.home}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	if err := os.WriteFile(filepath.Join(a.home, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(a.home, "f")); err != nil {
		t.Fatal(err)
	}
	var got []string
	eventually(t, "the watcher's create and remove events", func() bool {
		evs, err := a.fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Msg.GetEvents() {
			got = append(got, e.GetName()+" "+e.GetType().String())
		}
		return len(got) > 0 && got[len(got)-1] == "f EVENT_TYPE_REMOVE"
	})
	if got[0] != "f EVENT_TYPE_CREATE" {
		t.Errorf("events %v: want f's create first", got)
	}
	if _, err := a.fs.RemoveWatcher(ctx, connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := a.fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id})); code(err) != connect.CodeNotFound {
		t.Errorf("events of a removed watcher: %v, want NotFound", err)
	}
}
