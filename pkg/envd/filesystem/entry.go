package filesystem

import (
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem"
)

// names caches uid and gid lookups for one call (a ListDir of many entries
// reads /etc/passwd once per owner, not once per entry).
type names struct {
	users, groups map[uint32]string
}

func newNames() *names {
	return &names{users: map[uint32]string{}, groups: map[uint32]string{}}
}

func (n *names) user(uid uint32) string {
	if s, ok := n.users[uid]; ok {
		return s
	}
	s := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(s); err == nil {
		s = u.Username
	}
	n.users[uid] = s
	return s
}

func (n *names) group(gid uint32) string {
	if s, ok := n.groups[gid]; ok {
		return s
	}
	s := strconv.FormatUint(uint64(gid), 10)
	if g, err := user.LookupGroupId(s); err == nil {
		s = g.Name
	}
	n.groups[gid] = s
	return s
}

// Stat is the entry info of path (absolute), not following a final symlink.
func Stat(path string) (*pb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return entryInfo(path, fi, newNames()), nil
}

// FileType is the entry type of a file mode.
func FileType(m fs.FileMode) pb.FileType {
	switch {
	case m.IsDir():
		return pb.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		return pb.FileType_FILE_TYPE_SYMLINK
	}
	// Devices, sockets and pipes are files to the SDK, which knows only
	// file, dir and symlink (and skips entries of any other type).
	return pb.FileType_FILE_TYPE_FILE
}

func entryInfo(path string, fi fs.FileInfo, n *names) *pb.EntryInfo {
	e := &pb.EntryInfo{
		Name:         fi.Name(),
		Type:         FileType(fi.Mode()),
		Path:         path,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	if fi.Mode().IsRegular() || fi.IsDir() {
		// Best effort, as the rest: a filesystem without extended
		// attributes has none.
		e.Metadata, _ = Metadata(path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = n.user(st.Uid)
		e.Group = n.group(st.Gid)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		// The target as the SDK shows it: absolute, resolved when it
		// resolves, else the link's own text made absolute.
		if t, err := filepath.EvalSymlinks(path); err == nil {
			e.SymlinkTarget = &t
		} else if t, err := os.Readlink(path); err == nil {
			if !filepath.IsAbs(t) {
				t = filepath.Join(filepath.Dir(path), t)
			}
			e.SymlinkTarget = &t
		}
	}
	return e
}
