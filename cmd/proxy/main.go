// Command proxy is the egress proxy of "allowlist" sandboxes (package
// proxy): it serves one namespace's sandboxes, knowing each caller by its
// Pod IP from an informer's cache.
//
// Environment:
//
//	PROXY_ADDR          listen address of the proxy (default :3128)
//	PROXY_METRICS_ADDR  /metrics, /healthz, /readyz (default :9090)
//	POD_NAMESPACE       the namespace whose sandboxes it serves (required)
//	PROXY_RESOLVER      ip:port of a DNS server to ask instead of the system's
//	PROXY_DENY_CIDRS    comma-separated ranges refused beside egress's own
//	PROXY_PORTS         comma-separated upstream ports (default 80,443)
//
// RBAC: a Role in POD_NAMESPACE granting get, list and watch on pods and
// services (apiGroups [""]), bound to the proxy's ServiceAccount; nothing
// else, and nothing cluster-wide.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/kube"
	"github.com/deerflow-sandbox/provisioner/pkg/monitor"
	"github.com/deerflow-sandbox/provisioner/pkg/proxy"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// shutdownGrace lets open tunnels finish after SIGTERM, within the Pod's
// default 30 s termination grace period.
const shutdownGrace = 20 * time.Second

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	if err := run(log); err != nil {
		fmt.Fprintln(os.Stderr, "egress proxy:", err)
		os.Exit(1)
	}
}

type settings struct {
	addr, metricsAddr, namespace, resolver string
	deny                                   []netip.Prefix
	ports                                  []uint16
}

func loadSettings(getenv func(string) string) (settings, error) {
	s := settings{
		addr:        or(getenv("PROXY_ADDR"), ":3128"),
		metricsAddr: or(getenv("PROXY_METRICS_ADDR"), ":9090"),
		namespace:   strings.TrimSpace(getenv("POD_NAMESPACE")),
		resolver:    strings.TrimSpace(getenv("PROXY_RESOLVER")),
	}
	if s.namespace == "" {
		return s, errors.New("POD_NAMESPACE is required (the namespace whose sandboxes the proxy serves)")
	}
	if s.resolver != "" {
		if _, err := netip.ParseAddrPort(s.resolver); err != nil {
			return s, fmt.Errorf("PROXY_RESOLVER %q: want ip:port, such as 10.96.0.10:53: %w", s.resolver, err)
		}
	}
	for _, f := range fields(getenv("PROXY_DENY_CIDRS")) {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return s, fmt.Errorf("PROXY_DENY_CIDRS: %q is no CIDR range, such as 203.0.113.0/24: %w", f, err)
		}
		s.deny = append(s.deny, p.Masked())
	}
	for _, f := range fields(or(getenv("PROXY_PORTS"), "80,443")) {
		n, err := strconv.ParseUint(f, 10, 16)
		if err != nil || n == 0 {
			return s, fmt.Errorf("PROXY_PORTS: %q is no port (1 to 65535)", f)
		}
		s.ports = append(s.ports, uint16(n))
	}
	if len(s.ports) == 0 {
		return s, errors.New("PROXY_PORTS names no port")
	}
	return s, nil
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
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithNamespace(set.namespace), informers.WithTransform(kube.StripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = keys.LabelApp + "=" + keys.LabelAppValue
		}))
	pods := factory.Core().V1().Pods().Informer()
	if err := pods.AddIndexers(cache.Indexers{podIPIndex: indexPodIPs}); err != nil {
		return fmt.Errorf("pod IP index: %w", err)
	}
	svcs := factory.Core().V1().Services().Lister()
	factory.Start(ctx.Done())
	var ready atomic.Bool
	go func() {
		if synced := factory.WaitForCacheSync(ctx.Done()); allTrue(synced) {
			ready.Store(true)
			log.Info("egress proxy ready: caches synced", "namespace", set.namespace)
		}
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := proxy.NewMetrics(reg)
	if err != nil {
		return err
	}
	resolver := &net.Resolver{PreferGo: true}
	if set.resolver != "" {
		resolver.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, set.resolver)
		}
	}
	srv := &proxy.Server{
		Lookup:        lookup(pods.GetIndexer(), svcs.Services(set.namespace), log),
		Resolver:      resolver,
		Deny:          set.deny,
		Ports:         set.ports,
		Log:           log,
		Metrics:       metrics,
		ShutdownGrace: shutdownGrace,
	}

	msrv := monitor.Start(ctx, set.metricsAddr, reg, ready.Load, "the Pod and Service caches have not synced", log, stop)

	ln, err := net.Listen("tcp", set.addr)
	if err != nil {
		return fmt.Errorf("listening on PROXY_ADDR %s: %w", set.addr, err)
	}
	log.Info("egress proxy listening", "addr", ln.Addr().String(), "metrics_addr", set.metricsAddr,
		"namespace", set.namespace, "ports", set.ports, "resolver", or(set.resolver, "system"))
	err = srv.Serve(ctx, ln)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msrv.Shutdown(sctx)
	log.Info("egress proxy stopped")
	return err
}

const podIPIndex = "podIP"

// indexPodIPs indexes a Pod under each of its IPs (both families).
func indexPodIPs(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	var ips []string
	for _, ip := range pod.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			ips = append(ips, a.Unmap().String())
		}
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			ips = append(ips, a.Unmap().String())
		}
	}
	return ips, nil
}

// lookup knows a caller by its Pod: the one running, not terminating
// sandbox Pod with that IP, whose Service (same id, selecting its token)
// holds the list and grants.
func lookup(pods cache.Indexer, svcs listerscorev1.ServiceNamespaceLister, log *slog.Logger) proxy.Lookup {
	return func(_ context.Context, src netip.Addr) (string, egress.Policy, error) {
		objs, err := pods.ByIndex(podIPIndex, src.Unmap().String())
		if err != nil {
			return "", egress.Policy{}, fmt.Errorf("pod index: %w", err)
		}
		var live []*corev1.Pod
		for _, o := range objs {
			if p, ok := o.(*corev1.Pod); ok && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				live = append(live, p)
			}
		}
		switch {
		case len(live) == 0:
			return "", egress.Policy{}, errors.New("no running sandbox Pod has this address")
		case len(live) > 1:
			return "", egress.Policy{}, fmt.Errorf("%d running sandbox Pods claim this address", len(live))
		}
		pod := live[0]
		if pod.Spec.HostNetwork {
			// Its IP is the node's: any process there would pass for it.
			return "", egress.Policy{}, fmt.Errorf("Pod %s uses the host network", pod.Name)
		}
		id := pod.Labels[keys.LabelID]
		if id == "" {
			return "", egress.Policy{}, fmt.Errorf("Pod %s is an unclaimed pooled Pod and belongs to no sandbox", pod.Name)
		}
		mode, err := egress.ParseMode(pod.Labels[keys.LabelEgress])
		if err != nil {
			return id, egress.Policy{}, fmt.Errorf("Pod %s: %w", pod.Name, err)
		}
		svc, err := svcs.Get(resources.ServiceName(id))
		if err != nil {
			if apierrors.IsNotFound(err) {
				return id, egress.Policy{}, fmt.Errorf("sandbox %s has no Service %s", id, resources.ServiceName(id))
			}
			return id, egress.Policy{}, fmt.Errorf("sandbox %s's Service: %w", id, err)
		}
		token := pod.Labels[keys.LabelToken]
		if svc.Labels[keys.LabelID] != id || token == "" || svc.Spec.Selector[keys.LabelToken] != token {
			return id, egress.Policy{}, fmt.Errorf("Pod %s is not the Pod sandbox %s's Service selects (id or token differ)", pod.Name, id)
		}
		allow, err := egress.ParseNames(svc.Annotations[keys.AnnotationEgressAllow])
		if err != nil {
			log.Error("bad egress list annotation", "sandbox", id, "service", svc.Name, "error", err.Error())
			return id, egress.Policy{}, fmt.Errorf("sandbox %s's %s annotation: %w", id, keys.AnnotationEgressAllow, err)
		}
		grants, err := egress.DecodeGrants(svc.Annotations[keys.AnnotationEgressGrants])
		if err != nil {
			log.Error("bad egress grants annotation", "sandbox", id, "service", svc.Name, "error", err.Error())
			return id, egress.Policy{}, fmt.Errorf("sandbox %s's %s annotation: %w", id, keys.AnnotationEgressGrants, err)
		}
		return id, egress.Policy{Mode: mode, Allow: allow, Grants: grants, Principal: pod.Labels[keys.LabelPrincipal]}, nil
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

func fields(csv string) []string {
	var out []string
	for _, f := range strings.Split(csv, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func or(s, def string) string {
	if s = strings.TrimSpace(s); s != "" {
		return s
	}
	return def
}
