// Command realnode-up joins the real test node (package realnode) to a
// running kwok cluster for `make run NODE=real`, so that the local function's
// sandboxes run in real containers and their URLs answer. It writes the
// function's settings for that node to -env-file once the node is Ready,
// then holds the node until SIGINT or SIGTERM and takes it down.
//
// It is the test suite's node, not a production component: one node, on this
// machine, as root.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

func main() {
	if err := run(); err != nil {
		// Plain, not a log line: hack/run.sh shows it as it is, with the
		// kubelet's log lines some errors carry.
		fmt.Fprintf(os.Stderr, "error: the real node did not start: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "the kwok cluster's kubeconfig")
	pki := flag.String("pki-dir", "", "the cluster's PKI directory (ca.crt, ca.key)")
	base := flag.String("host-base", "", "DeerFlow's base directory for the sandboxes' host mounts (made if missing)")
	envFile := flag.String("env-file", "", "where to write the function's settings for this node")
	imageTar := flag.String("image-tar", "", "an image archive (docker save or OCI) to import as the sandbox image")
	imageRef := flag.String("image", "", "the sandbox image's reference inside -image-tar")
	proxyManifest := flag.String("proxy-manifest", "", "the egress proxy's manifest (config/300-egress-proxy.yaml) to deploy onto the node; none when empty")
	var e e2bFlags
	flag.StringVar(&e.routerManifest, "router-manifest", "", "the E2B router's manifest (config/310-router.yaml) to deploy onto the node; no E2B when empty")
	flag.StringVar(&e.policy, "router-policy", "", "the router's sandbox NetworkPolicy (config/702-networkpolicy-router.yaml), with -router-manifest")
	flag.StringVar(&e.keyFile, "e2b-key-file", "", "where to write the function's copy of the E2B token key (E2B_TOKEN_KEY_FILE), with -router-manifest")
	flag.StringVar(&e.clientFile, "e2b-client-file", "", "where to write E2B_SANDBOX_URL for an E2B client on this machine, with -router-manifest")
	flag.Parse()
	if *kubeconfig == "" || *pki == "" || *base == "" || *envFile == "" {
		return fmt.Errorf("-kubeconfig, -pki-dir, -host-base and -env-file are required")
	}
	if err := e.check(); err != nil {
		return err
	}
	if (*imageTar == "") != (*imageRef == "") {
		return fmt.Errorf("-image-tar and -image go together: the archive and the reference to run from it")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", *kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	upCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	start := time.Now()
	node, err := realnode.Up(upCtx, realnode.DefaultPaths(cluster.CacheDir()), realnode.Cluster{Host: cfg.Host, PKIDir: *pki, Client: client})
	cancel()
	if err != nil {
		return err
	}
	defer node.Down()
	slog.Info("real node Ready", "after", time.Since(start).Round(time.Millisecond))
	if err := node.GVisor(); err != nil {
		slog.Warn("no gVisor on the real node: Pods of RuntimeClass "+realnode.GVisorRuntimeClass+" cannot run", "err", err)
	} else {
		slog.Info("gVisor on the real node: RuntimeClass "+realnode.GVisorRuntimeClass+", handler "+realnode.GVisorHandler, "platform", realnode.GVisorPlatform)
	}

	env := realnode.FunctionEnv(*base)
	// The function's namespace (its K8S_NAMESPACE default), where the
	// proxy, the router and the sandboxes run, as config/ deploys them.
	ns := os.Getenv("K8S_NAMESPACE")
	if ns == "" {
		ns = "deer-flow"
	}
	if *proxyManifest != "" {
		// The proxy allowlist sandboxes go through, always on beside the
		// function, as config/ deploys it.
		pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := realnode.DeployProxy(pctx, client, *proxyManifest, ns)
		cancel()
		if err != nil {
			return fmt.Errorf("the egress proxy did not start: %w", err)
		}
		slog.Info("egress proxy Ready", "namespace", ns, "resolver", realnode.PublicResolver)
	}
	if e.routerManifest != "" {
		ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := e.setUp(ectx, client, ns, env)
		cancel()
		if err != nil {
			return fmt.Errorf("E2B (the router, its key, its policy and the base template): %w", err)
		}
	}
	if *imageTar != "" {
		if err := node.ImportArchive(ctx, *imageTar, *imageRef); err != nil {
			return fmt.Errorf("importing %s: %w", *imageTar, err)
		}
		env["SANDBOX_IMAGE"] = *imageRef
	}
	if _, err := realnode.HostBase(*base); err != nil {
		return err
	}
	var lines []string
	for k, v := range env {
		lines = append(lines, k+"="+v)
	}
	slices.Sort(lines)
	tmp := *envFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, *envFile); err != nil {
		return err
	}
	slog.Info("settings for the function written", "file", filepath.Clean(*envFile))
	<-ctx.Done()
	slog.Info("taking the real node down")
	return nil
}
