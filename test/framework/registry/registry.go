// Package registry serves an OCI registry (the distribution API that func,
// crane and containerd speak) on 127.0.0.1, for the tests and for `make
// deploy-local` to push to. It is go-containerregistry's registry, already
// a dependency of the test images: a stand-in for the operator's own
// registry, whose push and pull (blobs, manifests, indexes, tags, the
// Docker-Content-Digest a deploy pins) it implements. Building the
// reference registry (distribution) for this alone cost a cold CI run
// minutes of both cores.
package registry

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
)

// Handler is a registry whose blobs are files under dir (in memory when dir
// is empty) and whose manifests live in memory: a restart forgets the tags,
// and the next push writes them again.
func Handler(dir string, logs io.Writer) http.Handler {
	blobs := ggcr.NewInMemoryBlobHandler()
	if dir != "" {
		blobs = ggcr.NewDiskBlobHandler(dir)
	}
	return ggcr.New(ggcr.WithBlobHandler(blobs), ggcr.Logger(log.New(logs, "registry: ", log.LstdFlags)))
}

// Server is a registry listening on a loopback address.
type Server struct {
	Addr string // host:port
	srv  *http.Server
	done chan error
}

// Start serves Handler(dir, logs) on addr ("127.0.0.1:0" picks a port).
func Start(addr, dir string, logs io.Writer) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for the registry on %s: %w", addr, err)
	}
	s := &Server{Addr: l.Addr().String(), done: make(chan error, 1),
		srv: &http.Server{Handler: Handler(dir, logs), ReadHeaderTimeout: 10 * time.Second}}
	go func() { s.done <- s.srv.Serve(l) }()
	return s, nil
}

// Close stops the registry.
func (s *Server) Close() error {
	if err := s.srv.Close(); err != nil {
		return fmt.Errorf("stop the registry on %s: %w", s.Addr, err)
	}
	<-s.done
	return nil
}
