// Command router is the sandbox router of E2B's data plane (package
// router): one address for every sandbox (E2B_SANDBOX_URL) that forwards a
// request to the Pod its E2b-Sandbox-Id header names, on the port its
// E2b-Sandbox-Port header names, once the sandbox's token checks out. It
// serves one namespace's sandboxes from informer caches.
//
// Environment:
//
//	POD_NAMESPACE        the namespace whose sandboxes it serves (required)
//	E2B_TOKEN_KEY_FILE   the file holding the token key the function uses
//	                     (Secret sandbox-e2b-key, data key "key"; required,
//	                     at least 32 bytes)
//	ROUTER_ADDR          listen address of the router (default :8080);
//	                     HTTP/1.1 and HTTP/2 without TLS (h2c, prior knowledge)
//	ROUTER_METRICS_ADDR  /metrics, /healthz, /readyz (default :9090)
//	E2B_DOMAIN           E2B's addressing: a Host <port>-<sandbox id>.<domain>
//	                     names the sandbox and port (default: unset, the
//	                     headers alone); the function's own E2B_DOMAIN
//
// RBAC: a Role in POD_NAMESPACE granting get, list and watch on pods and
// services (apiGroups [""]), and get, list, watch and patch on replicasets
// (apiGroups ["apps"]: it resumes a paused sandbox that resumes on traffic,
// the one change an admission policy lets it make), bound to the router's
// ServiceAccount; nothing else, and nothing cluster-wide.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/fairness"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/kube"
	"github.com/deerflow-sandbox/provisioner/pkg/monitor"
	"github.com/deerflow-sandbox/provisioner/pkg/router"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// shutdownGrace lets open streams finish after SIGTERM, within the Pod's
// default 30 s termination grace period.
const shutdownGrace = 20 * time.Second

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	if err := run(log); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox router:", err)
		os.Exit(1)
	}
}

type settings struct {
	addr, metricsAddr, namespace, domain string
	key                                  access.Key
	// fairness: the function's settings of the same names, with the
	// router's defaults (router.DefaultFairness).
	fairness fairness.Limits
}

// fairnessFrom reads PRINCIPAL_REQUESTS_PER_SECOND, PRINCIPAL_REQUEST_BURST
// and PRINCIPAL_MAX_CONCURRENT_REQUESTS, each router.DefaultFairness's
// when unset.
func fairnessFrom(getenv func(string) string) (fairness.Limits, error) {
	d := router.DefaultFairness
	c := config.FairnessConfig{PrincipalRequestsPerSecond: d.RequestsPerSecond, PrincipalRequestBurst: d.Burst, PrincipalMaxConcurrentRequests: d.MaxInProgress}
	var err error
	if v := strings.TrimSpace(getenv("PRINCIPAL_REQUESTS_PER_SECOND")); v != "" {
		if c.PrincipalRequestsPerSecond, err = strconv.ParseFloat(v, 64); err != nil {
			return d, fmt.Errorf("PRINCIPAL_REQUESTS_PER_SECOND: %q is not a number", v)
		}
	}
	for name, to := range map[string]*int{"PRINCIPAL_REQUEST_BURST": &c.PrincipalRequestBurst, "PRINCIPAL_MAX_CONCURRENT_REQUESTS": &c.PrincipalMaxConcurrentRequests} {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			if *to, err = strconv.Atoi(v); err != nil {
				return d, fmt.Errorf("%s: %q is not a whole number", name, v)
			}
		}
	}
	if err := c.Validate(); err != nil {
		return d, err
	}
	return fairness.Limits{RequestsPerSecond: c.PrincipalRequestsPerSecond, Burst: c.PrincipalRequestBurst, MaxInProgress: c.PrincipalMaxConcurrentRequests}, nil
}

func loadSettings(getenv func(string) string) (settings, error) {
	s := settings{
		addr:        or(getenv("ROUTER_ADDR"), ":8080"),
		metricsAddr: or(getenv("ROUTER_METRICS_ADDR"), ":9090"),
		namespace:   strings.TrimSpace(getenv("POD_NAMESPACE")),
	}
	if s.namespace == "" {
		return s, errors.New("POD_NAMESPACE is required (the namespace whose sandboxes the router serves)")
	}
	s.domain = strings.TrimSpace(getenv("E2B_DOMAIN"))
	if err := config.ValidE2BDomain(s.domain); err != nil {
		return s, fmt.Errorf("E2B_DOMAIN: %w", err)
	}
	path := strings.TrimSpace(getenv("E2B_TOKEN_KEY_FILE"))
	if path == "" {
		return s, errors.New("E2B_TOKEN_KEY_FILE is required (the file holding the token key, from the Secret sandbox-e2b-key)")
	}
	k, err := access.LoadKey(path)
	if err != nil {
		return s, fmt.Errorf("E2B_TOKEN_KEY_FILE: %w", err)
	}
	s.key = k
	s.fairness, err = fairnessFrom(getenv)
	return s, err
}

func run(log *slog.Logger) error {
	set, err := loadSettings(os.Getenv)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	cs, err := kube.InClusterClient()
	if err != nil {
		return err
	}
	c, err := newCaches(cs, set.namespace)
	if err != nil {
		return err
	}
	c.start(ctx.Done())
	var ready atomic.Bool
	go func() {
		if c.sync(ctx.Done()) {
			ready.Store(true)
			log.Info("sandbox router ready: caches synced", "namespace", set.namespace)
		}
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := router.NewMetrics(reg)
	if err != nil {
		return err
	}
	h := router.New(router.Options{Resolver: c.resolver, Key: set.key, Log: log, Metrics: metrics, CacheGrace: router.DefaultCacheGrace, Domain: set.domain, Fairness: set.fairness,
		Waker: router.Scaler{Client: cs, Namespace: set.namespace}})

	msrv := monitor.Start(ctx, set.metricsAddr, reg, ready.Load, "the Pod and Service caches have not synced", log, stop)

	srv := newServer(h)
	ln, err := net.Listen("tcp", set.addr)
	if err != nil {
		return fmt.Errorf("listening on ROUTER_ADDR %s: %w", set.addr, err)
	}
	log.Info("sandbox router listening", "addr", ln.Addr().String(), "metrics_addr", set.metricsAddr, "namespace", set.namespace, "e2b_domain", set.domain)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		log.Warn("streams still open at shutdown", "error", serr.Error())
	}
	msrv.Shutdown(sctx)
	log.Info("sandbox router stopped")
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// caches are the router's informers: sandbox Pods (indexed by id),
// Services and ReplicaSets, and pooled Pods' wires, of one namespace.
type caches struct {
	resolver  router.Cache
	factories []informers.SharedInformerFactory
}

// newCaches narrows each informer by label. Sandbox Pods, Services and
// ReplicaSets carry app=deer-flow-sandbox; pooled Pods' wires do not (they carry the wire
// component), so they have an informer of their own. Nothing else in the
// namespace is cached.
func newCaches(cs kubernetes.Interface, namespace string) (*caches, error) {
	sandboxes := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithNamespace(namespace), informers.WithTransform(kube.StripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = keys.LabelApp + "=" + keys.LabelAppValue
		}))
	wires := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithNamespace(namespace), informers.WithTransform(kube.StripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = resources.SelectorWires }))
	pods := sandboxes.Core().V1().Pods().Informer()
	if err := pods.AddIndexers(cache.Indexers{router.IDIndex: router.IndexByID}); err != nil {
		return nil, fmt.Errorf("pod id index: %w", err)
	}
	return &caches{
		resolver: router.Cache{
			Pods:        pods.GetIndexer(),
			Services:    sandboxes.Core().V1().Services().Lister().Services(namespace),
			Wires:       wires.Core().V1().Services().Lister().Services(namespace),
			ReplicaSets: sandboxes.Apps().V1().ReplicaSets().Lister().ReplicaSets(namespace),
		},
		factories: []informers.SharedInformerFactory{sandboxes, wires},
	}, nil
}

func (c *caches) start(stop <-chan struct{}) {
	for _, f := range c.factories {
		f.Start(stop)
	}
}

// sync waits for every cache's first list; false if stopped first.
func (c *caches) sync(stop <-chan struct{}) bool {
	for _, f := range c.factories {
		if !allTrue(f.WaitForCacheSync(stop)) {
			return false
		}
	}
	return true
}

// newServer serves h over HTTP/1.1 and over HTTP/2 without TLS (h2c with
// prior knowledge), so a client may multiplex its streams on one
// connection. No write or read timeout: streams last as long as a sandbox's
// process; headers must come in time.
func newServer(h http.Handler) *http.Server {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         &p,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

func allTrue[K comparable](m map[K]bool) bool {
	for _, v := range m {
		if !v {
			return false
		}
	}
	return len(m) > 0
}

func or(s, def string) string {
	if s = strings.TrimSpace(s); s != "" {
		return s
	}
	return def
}
