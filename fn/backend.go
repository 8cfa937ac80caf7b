package fn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/auth"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/eventlimit"
	"github.com/deerflow-sandbox/provisioner/pkg/grant"
	"github.com/deerflow-sandbox/provisioner/pkg/kube"
	"github.com/deerflow-sandbox/provisioner/pkg/lifetime"
	"github.com/deerflow-sandbox/provisioner/pkg/metrics"
	"github.com/deerflow-sandbox/provisioner/pkg/pool"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// backend is the sandbox.Operations the front doors call. Until the
// Kubernetes client exists it answers 503, so requests that arrive during
// start-up get a clear, retryable answer instead of blocking.
type backend struct {
	cfg     *config.Config
	metrics *metrics.Metrics
	log     *slog.Logger

	mgr    atomic.Pointer[sandbox.Manager]
	client atomic.Value // kubernetes.Interface
	// reviews is the client TokenReviews go through: its own rate limit
	// (AUTH_TOKEN_REVIEW_QPS/BURST), so forged tokens cannot use up the
	// one sandbox operations need (K8S_CLIENT_QPS/BURST).
	reviews     atomic.Value // kubernetes.Interface
	audit       *slog.Logger
	lastErr     atomic.Value // string
	broadcaster record.EventBroadcaster

	readyMu    sync.Mutex
	readyAt    time.Time
	readyErr   error
	readyKnown bool
}

func newBackend(cfg *config.Config, m *metrics.Metrics, log, audit *slog.Logger) *backend {
	b := &backend{cfg: cfg, metrics: m, log: log, audit: audit}
	b.lastErr.Store("connecting to the Kubernetes API server")
	return b
}

// connect builds the client, retrying until it can (a kubeconfig may be
// mounted after we start). It never blocks the caller of Start.
func (b *backend) connect(ctx context.Context) {
	for attempt := 0; ; attempt++ {
		err := b.tryConnect(ctx)
		if err == nil {
			return
		}
		b.lastErr.Store(err.Error())
		if attempt == 0 || attempt%30 == 0 {
			b.log.Warn("cannot build a Kubernetes client yet; retrying", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

func (b *backend) tryConnect(ctx context.Context) error {
	rc, err := kube.RESTConfig(b.cfg.ClientConfig)
	if err != nil {
		return err
	}
	client, err := kube.NewClient(rc, b.metrics.WrapTransport)
	if err != nil {
		return err
	}
	rrc := rest.CopyConfig(rc)
	rrc.QPS, rrc.Burst = b.cfg.TokenReviewQPS, b.cfg.TokenReviewBurst
	reviews, err := kube.NewClient(rrc, b.metrics.WrapTransport)
	if err != nil {
		return err
	}
	if b.cfg.CreateNamespace {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.cfg.Namespace}}
		_, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
		switch {
		case err == nil:
			// The API server refuses Pods in a namespace until the controller
			// manager has made its default ServiceAccount, a moment after the
			// namespace. Ready means a create works, so wait for it here
			// (only for a namespace just made: a start-up pays nothing else).
			if err := waitServiceAccount(ctx, client, b.cfg.Namespace); err != nil {
				return err
			}
		case !apierrors.IsAlreadyExists(err):
			return err
		}
	}
	opts := []sandbox.Option{sandbox.WithObserver(b.metrics), sandbox.WithAuditLog(b.audit),
		sandbox.WithPool(pool.New(b.cfg, client, b.metrics.PoolClaim, b.log))}
	if b.cfg.EmitKubernetesEvents {
		b.broadcaster = record.NewBroadcaster(record.WithContext(ctx))
		b.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events(b.cfg.Namespace)})
		recorder := b.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: kube.UserAgent})
		opts = append(opts, sandbox.WithRecorder(eventlimit.New(recorder, b.cfg.EventsQPS, b.cfg.EventsBurst, b.metrics.EventDropped)))
	}
	mgr := sandbox.NewManager(b.cfg, client, opts...)
	// The quota's Service cache fills while the first requests arrive; a
	// create that finds it not yet filled lists instead.
	mgr.Run(ctx)
	// Fail closed: until the shared NetworkPolicy exists, creates are
	// refused (each retries this check), other operations go on. It is
	// checked before the client is published, so a ready replica has
	// already made the policy when it may.
	if err := mgr.EnsureIsolation(ctx); err != nil {
		b.log.Error("sandboxes will not be created until they can be isolated", "error", err)
	}
	b.client.Store(client)
	b.reviews.Store(reviews)
	b.mgr.Store(mgr)
	b.log.Info("connected to the Kubernetes API server", "host", rc.Host)
	return nil
}

func (b *backend) shutdown() {
	if b.broadcaster != nil {
		b.broadcaster.Shutdown()
	}
}

// ready pings the API server, at most once per readyCacheTTL.
func (b *backend) ready(ctx context.Context) error {
	c, _ := b.client.Load().(kubernetes.Interface)
	if c == nil {
		return errors.New(b.lastErr.Load().(string))
	}
	b.readyMu.Lock()
	defer b.readyMu.Unlock()
	if b.readyKnown && time.Since(b.readyAt) < readyCacheTTL {
		return b.readyErr
	}
	b.readyErr = kube.Ping(ctx, c, 2*time.Second)
	b.readyAt, b.readyKnown = time.Now(), true
	return b.readyErr
}

func (b *backend) manager() (*sandbox.Manager, error) {
	if m := b.mgr.Load(); m != nil {
		return m, nil
	}
	return nil, &api.Error{Kind: api.KindUnavailable, Detail: "not connected to the Kubernetes API server yet (" + b.lastErr.Load().(string) + "); retry shortly"}
}

func (b *backend) Create(ctx context.Context, s api.Spec, wait time.Duration) (api.Sandbox, error) {
	m, err := b.manager()
	if err != nil {
		return api.Sandbox{}, err
	}
	return m.Create(ctx, s, wait)
}

func (b *backend) Get(ctx context.Context, id string, wait time.Duration) (api.Sandbox, error) {
	m, err := b.manager()
	if err != nil {
		return api.Sandbox{}, err
	}
	return m.Get(ctx, id, wait)
}

func (b *backend) List(ctx context.Context) ([]api.Sandbox, error) {
	m, err := b.manager()
	if err != nil {
		return nil, err
	}
	return m.List(ctx)
}

func (b *backend) Destroy(ctx context.Context, id string) error {
	m, err := b.manager()
	if err != nil {
		return err
	}
	return m.Destroy(ctx, id)
}

func (b *backend) Reap(ctx context.Context) (api.Reaped, error) {
	m, err := b.manager()
	if err != nil {
		return api.Reaped{}, err
	}
	return m.Reap(ctx)
}

func (b *backend) Pause(ctx context.Context, id string) (api.Sandbox, error) {
	return withManager(b, func(m *sandbox.Manager) (api.Sandbox, error) { return m.Pause(ctx, id) })
}

func (b *backend) Egress(ctx context.Context, id string, c api.EgressChange) (api.Sandbox, error) {
	return withManager(b, func(m *sandbox.Manager) (api.Sandbox, error) {
		client, _ := b.client.Load().(kubernetes.Interface) // set before the manager
		return grant.New(b.cfg, client, m, b.audit, b.metrics).Egress(ctx, id, c)
	})
}

func (b *backend) SetTimeout(ctx context.Context, id string, d time.Duration) (api.Sandbox, error) {
	return withManager(b, func(m *sandbox.Manager) (api.Sandbox, error) {
		client, _ := b.client.Load().(kubernetes.Interface) // set before the manager
		return lifetime.New(b.cfg, client, m, b.audit).SetTimeout(ctx, id, d)
	})
}

func (b *backend) Resume(ctx context.Context, id string, wait time.Duration) (api.Sandbox, error) {
	return withManager(b, func(m *sandbox.Manager) (api.Sandbox, error) { return m.Resume(ctx, id, wait) })
}

func (b *backend) Templates(ctx context.Context) ([]template.Summary, error) {
	return withManager(b, func(m *sandbox.Manager) ([]template.Summary, error) { return m.Templates(ctx) })
}

// withManager runs op once connected, or answers 503.
func withManager[T any](b *backend, op func(*sandbox.Manager) (T, error)) (T, error) {
	m, err := b.manager()
	if err != nil {
		var zero T
		return zero, err
	}
	return op(m)
}

// Review verifies a bearer token with the API server once connected.
func (b *backend) Review(ctx context.Context, token, audience string) (auth.Review, error) {
	c, _ := b.reviews.Load().(kubernetes.Interface)
	if c == nil {
		return auth.Review{}, errors.New(b.lastErr.Load().(string))
	}
	return auth.TokenReviewer{Client: c}.Review(ctx, token, audience)
}

// waitServiceAccount waits, bounded, for the namespace's default
// ServiceAccount, which sandbox Pods are admitted under.
func waitServiceAccount(ctx context.Context, client kubernetes.Interface, ns string) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("waiting for the ServiceAccount %s/default that the controller manager creates: %w", ns, err)
	}
	return nil
}
