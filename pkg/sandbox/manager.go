package sandbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/audit"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/envsecret"
	"github.com/deerflow-sandbox/provisioner/pkg/follow"
	"github.com/deerflow-sandbox/provisioner/pkg/isolation"
	"github.com/deerflow-sandbox/provisioner/pkg/ownership"
	"github.com/deerflow-sandbox/provisioner/pkg/poolapi"
	"github.com/deerflow-sandbox/provisioner/pkg/pooled"
	"github.com/deerflow-sandbox/provisioner/pkg/quota"
	"github.com/deerflow-sandbox/provisioner/pkg/reap"
	"github.com/deerflow-sandbox/provisioner/pkg/remove"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/slot"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	"github.com/deerflow-sandbox/provisioner/pkg/waitlimit"
)

// Recorder is the subset of client-go's record.EventRecorder we use.
type Recorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...interface{})
}

// Observer receives lifecycle measurements (metrics live outside this package).
type Observer interface {
	CreateToReady(d time.Duration)
	Reaped(reason string)
	QuotaRefused(scope string)
	// Isolation says whether one isolation check (isolation.Check*) is in
	// force in this replica.
	Isolation(check string, inForce bool)
}

// Manager runs the sandbox operations against the Kubernetes API. It holds no
// state about sandboxes: every answer comes from the cluster, so any number of
// replicas can serve at once.
type Manager struct {
	cfg      *config.Config
	client   kubernetes.Interface
	rm       remove.Remover    // deletes with preconditions
	slots    slot.Slots        // a cold create's slots, with one writer each
	env      envsecret.Secrets // the env Secrets of creates that send env
	recorder Recorder
	observer Observer
	// waits counts the requests of this replica that are waiting for
	// readiness (each holds an API watch), in all and per principal.
	waits     *waitlimit.Limiter
	isolation *isolation.Checker
	// failing holds the isolation checks whose last verdict failed.
	failing   sync.Map // check name -> struct{}
	templates *template.Store
	pool      poolapi.Pool
	claims    *pooled.Maker // a pooled create's Service
	reaper    *reap.Reaper
	audit     audit.Log
	// quota counts sandboxes for the limits (package quota).
	quota *quota.Counter
	// owners binds user and thread ids to principals (package ownership).
	owners *ownership.Registry
	// nameWait bounds a create's wait for its name (awaitName) when it
	// asked for no wait for Ready.
	nameWait time.Duration
}

// Option customises a Manager.
type Option func(*Manager)

// WithRecorder makes the Manager emit Kubernetes Events.
func WithRecorder(r Recorder) Option { return func(m *Manager) { m.recorder = r } }

// WithAuditLog sends the audit trail (package audit) to l.
func WithAuditLog(l *slog.Logger) Option { return func(m *Manager) { m.audit = audit.Log{Logger: l} } }

// WithObserver makes the Manager report lifecycle measurements.
func WithObserver(o Observer) Option { return func(m *Manager) { m.observer = o } }

// NewManager returns a Manager over client.
func NewManager(cfg *config.Config, client kubernetes.Interface, opts ...Option) *Manager {
	m := &Manager{cfg: cfg, client: client, rm: remove.Remover{Client: client, Namespace: cfg.Namespace}, recorder: nopRecorder{}, observer: nopObserver{},
		waits: waitlimit.New(cfg.MaxConcurrentWaits), templates: template.NewStore(client, cfg.Objects(), template.WithTenancy(template.TenancyOf(&cfg.AuthConfig))),
		nameWait: follow.DefaultNameWait}
	for _, o := range opts {
		o(m)
	}
	m.slots = slot.Slots{Client: client, Namespace: cfg.Namespace, Remover: &m.rm, UndoTimeout: cfg.RequestTimeout}
	m.env = envsecret.Secrets{Client: client, Namespace: cfg.Namespace}
	m.quota = quota.New(cfg.QuotaConfig, cfg.Namespace, client)
	m.owners = ownership.New(cfg.Namespace, &cfg.AuthConfig, cfg.MaxOwnedIDsPerPrincipal, client)
	m.isolation = isolation.New(&cfg.IsolationConfig, &cfg.PodSecurityConfig, cfg.Namespace, cfg.RequestTimeout, resources.SharedPolicies(cfg.Objects()), client,
		isolation.WithReport(m.isolationVerdict), isolation.WithIngress(ingressPolicies(cfg)))
	m.claims = &pooled.Maker{Client: client, Namespace: cfg.Namespace, Objects: cfg.Objects(), QuotaConfig: cfg.QuotaConfig,
		Quota: m.quota, Owners: m.owners, Pool: m.pool, Ensure: m.ensureService}
	m.reaper = m.newReaper()
	return m
}

// ingressPolicies builds the policies that admit a principal's backends to
// its sandboxes: its own, and, for the principal that owns the sandboxes
// that record none ("default", or the one principal there is), the legacy
// one, with "default"'s sources.
//
// The settings do not change while the function runs, so each principal's
// policies are built once and kept (one entry per principal that created):
// a create only looks them up. Their users copy before writing.
func ingressPolicies(cfg *config.Config) func(principal string) []*networkingv1.NetworkPolicy {
	multi := cfg.MultiplePrincipals()
	var built sync.Map // principal → []*networkingv1.NetworkPolicy
	return func(principal string) []*networkingv1.NetworkPolicy {
		if nps, ok := built.Load(principal); ok {
			return nps.([]*networkingv1.NetworkPolicy)
		}
		objs := cfg.Objects()
		out := []*networkingv1.NetworkPolicy{resources.BuildIngressPolicy(objs, principal, cfg.IngressSources(principal, multi))}
		if principal == api.LegacyPrincipal || !multi {
			out = append(out, resources.BuildLegacyIngressPolicy(objs, cfg.IngressSources(api.LegacyPrincipal, multi)))
		}
		built.Store(principal, out)
		return out
	}
}

// Run starts the Manager's background work, until ctx ends: the watch of
// the sandbox templates (see template.Store) and the quota's Service cache
// (a watch, not a loop: see package quota). Without it, templates are read on
// demand and every quota count lists the Services.
func (m *Manager) Run(ctx context.Context) {
	m.templates.Run(ctx)
	m.quota.Run(ctx)
}

// admitWait takes a wait permit for the principal (package waitlimit), or
// refuses at once; "" (no caller: it fails closed further on) waits in a
// share of its own. The caller calls release when done.
func (m *Manager) admitWait(principal string, wait time.Duration) (release func(), err error) {
	if wait <= 0 {
		return func() {}, nil
	}
	return m.waits.Take(principal)
}

type nopRecorder struct{}

func (nopRecorder) Eventf(runtime.Object, string, string, string, ...interface{}) {}

type nopObserver struct{}

func (nopObserver) CreateToReady(time.Duration) {}
func (nopObserver) Reaped(string)               {}
func (nopObserver) QuotaRefused(string)         {}
func (nopObserver) Isolation(string, bool)      {}

// found is what exists of one sandbox: its Service and either a bare Pod or
// a ReplicaSet and (unless paused or between Pods) its current Pod.
type found struct {
	pod *corev1.Pod
	rs  *appsv1.ReplicaSet
	svc *corev1.Service
	// stray is a bare Pod of the id beside its ReplicaSet.
	stray *corev1.Pod
	// wire is the Service svc names for the sandbox's URL
	// (resources.URLService): the wire of the pooled Pod it was claimed
	// from; nil when svc names none, or it is gone.
	wire *corev1.Service
	// ending: the pooled Pod svc names carries the id and is being
	// deleted. Its claim landed; svc holds the id for nothing to come.
	ending bool
}

// pending reports whether svc holds id for a workload still to come
// (resources.Pending), not for one already going.
func (f found) pending(id string) bool {
	return f.svc != nil && !f.ending && resources.Pending(f.svc, id)
}

// workload is the object that carries the sandbox's identity and lifecycle
// annotations: the ReplicaSet, or the bare Pod.
func (f found) workload() workloadObject {
	if f.rs != nil {
		return f.rs
	}
	if f.pod != nil {
		return f.pod
	}
	return nil
}

// view joins what exists of a sandbox into a Sandbox (resources.View).
func (m *Manager) view(id string, f found) api.Sandbox {
	objs := m.cfg.Objects()
	sb := resources.View(objs, id, f.pod, f.rs, resources.Exposing(objs, f.svc, f.wire, f.pod))
	var w metav1.Object
	switch {
	case f.rs != nil:
		w = f.rs
	case f.pod != nil:
		w = f.pod
	}
	sb.Egress = resources.EgressView(objs, w, f.svc, time.Now())
	return sb
}

// Templates lists the sandbox templates (GET /api/templates, and the names
// in /api/capabilities), with each pool's ready count. A read: it writes
// nothing, pools included (the reap keeps them).
func (m *Manager) Templates(ctx context.Context) ([]template.Summary, error) {
	// A request without a caller fails closed: it sees the templates that
	// name no principal (and the built-in default).
	c, _ := api.CallerFrom(ctx)
	list, valid, err := m.templates.ListValidFor(ctx, c.Principal)
	if err == nil && m.pool != nil {
		m.pool.Describe(ctx, list, valid)
	}
	return list, api.Classify(err, "list sandbox templates")
}

// EnsureIsolation checks now that the shared NetworkPolicy is in force (see
// isolation.Checker.Ensure); it runs at start-up.
func (m *Manager) EnsureIsolation(ctx context.Context) error { return m.isolation.Ensure(ctx) }
