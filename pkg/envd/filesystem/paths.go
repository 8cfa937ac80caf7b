// Package filesystem serves envd's filesystem.Filesystem Connect service
// (stat, list, make, move, remove and watch) on the sandbox's own
// filesystem, as the agent's own user, and holds the helpers the /files
// endpoints share with it: path resolution, entry info and the mapping of
// OS errors to Connect codes.
package filesystem

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"
)

// Home is the directory relative paths are resolved against: the agent's
// $HOME, which is the image user's home (E2B resolves a relative path
// against the user's home directory; the agent runs as that one user).
func Home() string {
	if h, err := os.UserHomeDir(); err == nil && h != "" {
		return h
	}
	return "/"
}

// Resolve makes path absolute and clean: "~" and "~/x" and relative paths
// are taken from the home directory. An empty path is an error, so a call
// that forgot its path never lands on the home directory by accident.
func Resolve(path string) (string, error) {
	if path == "" {
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the path is empty"))
	}
	switch {
	case path == "~":
		path = Home()
	case strings.HasPrefix(path, "~/"):
		path = filepath.Join(Home(), path[2:])
	case !filepath.IsAbs(path):
		path = filepath.Join(Home(), path)
	}
	return filepath.Clean(path), nil
}
