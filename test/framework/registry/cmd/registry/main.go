// Command registry serves the test registry (test/framework/registry) until
// it is killed: `make deploy-local` pushes the function's images to it.
package main

import (
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/deerflow-sandbox/provisioner/test/framework/registry"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:5001", "address to listen on")
	dir := flag.String("dir", "", "directory for the blobs (in memory when empty)")
	flag.Parse()
	if *dir != "" {
		if err := os.MkdirAll(*dir, 0o700); err != nil {
			log.Fatalf("registry: %v", err)
		}
	}
	s, err := registry.Start(*addr, *dir, os.Stderr)
	if err != nil {
		log.Fatalf("registry: %v", err)
	}
	log.Printf("registry: serving on %s", s.Addr)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	if err := s.Close(); err != nil {
		log.Fatalf("registry: %v", err)
	}
}
