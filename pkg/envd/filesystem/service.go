package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"connectrpc.com/connect"

	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem/filesystemconnect"
)

// maxListEntries bounds one ListDir answer: a deep listing of a large tree
// would otherwise build an unbounded message in memory.
const maxListEntries = 100_000

// Service implements filesystemconnect.FilesystemHandler.
type Service struct {
	log *slog.Logger

	mu       sync.Mutex
	watchers map[string]*bufferedWatcher
}

var _ filesystemconnect.FilesystemHandler = (*Service)(nil)

// New is a filesystem service; Close stops its watchers.
func New(log *slog.Logger) *Service {
	return &Service{log: log, watchers: map[string]*bufferedWatcher{}}
}

// Stat answers the entry info of a path (NotFound if it does not exist).
func (s *Service) Stat(_ context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	path, err := Resolve(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := Stat(path)
	if err != nil {
		return nil, Error("stat", path, err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

// MakeDir makes a directory and its parents; AlreadyExists if the path
// exists (the SDK's makeDir then answers false).
func (s *Service) MakeDir(_ context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	path, err := Resolve(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %q already exists", path))
		}
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%q already exists and is not a directory", path))
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, Error("making directory", path, err)
	}
	e, err := Stat(path)
	if err != nil {
		return nil, Error("stat", path, err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, making destination's parent
// directories (as E2B's envd does).
func (s *Service) Move(_ context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	src, err := Resolve(req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := Resolve(req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, Error("moving", src, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return nil, Error("making the parent directory of", dst, err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, Error("moving "+strconvQuote(src)+" to", dst, err)
	}
	e, err := Stat(dst)
	if err != nil {
		return nil, Error("stat", dst, err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

// ListDir lists a directory's entries, descending into subdirectories up
// to depth levels (1: the directory's own entries). Symlinked directories
// are listed as symlinks, not followed, so a link cycle cannot loop.
func (s *Service) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	path, err := Resolve(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth < 1 {
		depth = 1
	}
	// The directory itself may be reached through a symlink (/tmp -> /private/tmp).
	fi, err := os.Stat(path)
	if err != nil {
		return nil, Error("listing", path, err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("listing %q: not a directory", path))
	}
	n := newNames()
	var entries []*pb.EntryInfo
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		des, err := os.ReadDir(dir)
		if err != nil {
			return Error("listing", dir, err)
		}
		for _, de := range des {
			p := filepath.Join(dir, de.Name())
			info, err := de.Info()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue // removed while we listed
				}
				return Error("stat", p, err)
			}
			if len(entries) >= maxListEntries {
				return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("listing %q: more than %d entries; list with a smaller depth", path, maxListEntries))
			}
			entries = append(entries, entryInfo(p, info, n))
			if de.IsDir() && level < depth {
				if err := walk(p, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(path, 1); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.ListDirResponse{Entries: entries}), nil
}

// Remove removes a file, a symlink or a directory with its contents;
// nothing there is no error (E2B's envd answers so).
func (s *Service) Remove(_ context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	path, err := Resolve(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	// What is not there is removed already, as E2B's envd answers.
	if err := os.RemoveAll(path); err != nil {
		return nil, Error("removing", path, err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

func strconvQuote(s string) string { return fmt.Sprintf("%q", s) }
