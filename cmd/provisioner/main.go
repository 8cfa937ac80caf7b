// Command provisioner serves the function outside the func tooling, exactly
// as the func Go runtime would scaffold around New().
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	function "github.com/deerflow-sandbox/provisioner"
	"github.com/deerflow-sandbox/provisioner/pkg/server"
)

func main() {
	// JSON from the first line on; Start refines the level and adds fields.
	slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, nil)))
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	addr := os.Getenv("LISTEN_ADDRESS")
	if addr == "" {
		addr = server.DefaultAddress
	}
	if err := server.Run(ctx, function.New(), addr, 30*time.Second); err != nil {
		slog.Error("provisioner stopped", "error", err)
		os.Exit(1)
	}
}
