// Command knative-up brings up the local Knative cluster for `make knative`
// (package test/framework/knative): a kwok control plane, the real node on
// this machine, CoreDNS, Traefik, Knative Serving and Eventing. Once it is up
// it writes the kubeconfig's path to <state>/kubeconfig-path, then holds the
// node until SIGINT or SIGTERM (make knative-down) and takes it all down.
//
// It is a test cluster, not a production installer: one node, this
// machine, root.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/deerflow-sandbox/provisioner/test/framework/knative"
)

func main() {
	if err := run(); err != nil {
		slog.Error("knative-up", "err", err)
		os.Exit(1)
	}
}

func run() error {
	state := flag.String("state", "", "directory for the kubeconfig path and the pid")
	name := flag.String("name", "sandbox-knative", "the cluster's name")
	repo := flag.String("repo", ".", "the repository's root (hack/knative, hack/tools)")
	grace := flag.String("scale-to-zero-grace-period", "6s", "config-autoscaler's scale-to-zero-grace-period (upstream: 30s)")
	flag.Parse()
	if *state == "" {
		return fmt.Errorf("-state is required")
	}
	if err := os.MkdirAll(*state, 0o700); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	upCtx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	start := time.Now()
	env, err := knative.Up(upCtx, *name, *repo, knative.Settings{ScaleToZeroGracePeriod: *grace},
		func(format string, args ...any) { slog.Info(fmt.Sprintf(format, args...)) })
	cancel()
	if err != nil {
		return err
	}
	defer env.Down()
	slog.Info("Knative cluster up", "after", time.Since(start).Round(time.Second), "kubeconfig", env.Cluster.Kubeconfig)
	file := filepath.Join(*state, "kubeconfig-path")
	if err := os.WriteFile(file+".tmp", []byte(env.Cluster.Kubeconfig+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		return err
	}
	<-ctx.Done()
	slog.Info("taking the Knative cluster down")
	_ = os.Remove(file)
	return nil
}
