package filesystem

import (
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// A file's metadata is E2B's: user-defined key and value pairs, kept as
// extended attributes in the user.e2b. namespace of the file itself, so
// that they travel with it (a rename keeps them) and a process in the
// sandbox may read and set them too (setxattr user.e2b.<key>).
const metadataNamespace = "user.e2b."

// The bounds of E2B's envd: a key within the kernel's xattr name limit
// (255) less the namespace, and all of a file's pairs (keys with their
// namespace, and values) within a page, what a filesystem's inode keeps.
const (
	maxMetadataKey   = 255 - len(metadataNamespace)
	maxMetadataTotal = 4096
)

// metadataHeader is the prefix of the upload headers that carry metadata:
// X-Metadata-<key>: <value>.
const metadataHeader = "X-Metadata-"

// errMetadata is a metadata pair an upload may not carry.
var errMetadata = errors.New("invalid file metadata")

// MetadataFrom is the metadata an upload's headers carry: each
// X-Metadata-<key>, the key lower-cased (HTTP header names are not case
// sensitive), the first value when one is sent twice. Keys and values must
// be printable US-ASCII, within E2B's bounds.
func MetadataFrom(h http.Header) (map[string]string, error) {
	m := map[string]string{}
	total := 0
	for name, values := range h {
		if len(name) <= len(metadataHeader) || !strings.EqualFold(name[:len(metadataHeader)], metadataHeader) {
			continue
		}
		key, value := strings.ToLower(name[len(metadataHeader):]), values[0]
		switch {
		case len(key) > maxMetadataKey:
			return nil, fmt.Errorf("%w: the key %q is longer than %d bytes", errMetadata, key, maxMetadataKey)
		case !printable(key) || !printable(value):
			return nil, fmt.Errorf("%w: the pair %q must be printable US-ASCII (0x20 to 0x7e)", errMetadata, key)
		}
		m[key] = value
		total += len(metadataNamespace) + len(key) + len(value)
	}
	if total > maxMetadataTotal {
		return nil, fmt.Errorf("%w: %d bytes in all, more than %d", errMetadata, total, maxMetadataTotal)
	}
	return m, nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// SetMetadata makes path's metadata m exactly: pairs it had that m lacks
// go. A filesystem without extended attributes takes no metadata (an
// error), and has none to clear (no error).
func SetMetadata(path string, m map[string]string) error {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real // what the upload wrote through a symlink
	}
	had, err := Metadata(path)
	if err != nil {
		if len(m) == 0 && errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		return fmt.Errorf("reading the metadata of %q: %w", path, err)
	}
	for key := range had {
		if _, keep := m[key]; !keep {
			if err := unix.Removexattr(path, metadataNamespace+key); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("removing the metadata %q of %q: %w", key, path, err)
			}
		}
	}
	for key, value := range m {
		if err := unix.Setxattr(path, metadataNamespace+key, []byte(value), 0); err != nil {
			return fmt.Errorf("setting the metadata %q of %q: %w", key, path, err)
		}
	}
	return nil
}

// Metadata is path's metadata (nil when it has none), not following a
// final symlink.
func Metadata(path string) (map[string]string, error) {
	names, err := listxattr(path)
	if err != nil {
		return nil, err
	}
	var m map[string]string
	for _, name := range names {
		key, ok := strings.CutPrefix(name, metadataNamespace)
		if !ok || key == "" {
			continue
		}
		value, err := getxattr(path, name)
		if errors.Is(err, unix.ENODATA) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("reading the metadata %q of %q: %w", key, path, err)
		}
		if m == nil {
			m = map[string]string{}
		}
		m[key] = value
	}
	return m, nil
}

// listxattr is path's extended attribute names, sorted.
func listxattr(path string) ([]string, error) {
	b, err := readXattr(func(buf []byte) (int, error) { return unix.Llistxattr(path, buf) })
	if err != nil {
		return nil, err
	}
	names := strings.FieldsFunc(string(b), func(r rune) bool { return r == 0 })
	sort.Strings(names)
	return names, nil
}

func getxattr(path, name string) (string, error) {
	b, err := readXattr(func(buf []byte) (int, error) { return unix.Lgetxattr(path, name, buf) })
	return string(b), err
}

// readXattr reads a list or a value the kernel sizes: asked with no
// buffer, it says how large one must be; a change between the two calls
// is ERANGE, and the read starts over (a few times).
func readXattr(read func([]byte) (int, error)) ([]byte, error) {
	for try := 0; ; try++ {
		n, err := read(nil)
		if err != nil || n == 0 {
			return nil, err
		}
		buf := make([]byte, n)
		if n, err = read(buf); errors.Is(err, unix.ERANGE) && try < 3 {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}
