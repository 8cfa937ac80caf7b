package template

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/lru"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// ErrNotFound is a named template that does not exist.
var ErrNotFound = errors.New("no such sandbox template")

// Store resolves templates. Once Run has started its watch of the sandbox
// PodTemplates and the watch has synced, a create finds its template in
// memory, with no round trip, and an edit with kubectl applies as soon as
// the watch delivers it. Until then (a cold replica's first requests), or
// if it never syncs (a Role without watch on podtemplates), templates are
// read on demand: a read is cached for TTL; after that the next use reads
// the object again. Either way a template is validated once per
// resourceVersion. The watch is not a loop: it does nothing between
// requests but hold the few templates (the function scales to zero).
type Store struct {
	client   kubernetes.Interface
	cfg      config.Objects
	ten      Tenancy
	ttl      time.Duration
	now      func() time.Time
	informer cache.SharedIndexInformer
	running  atomic.Bool
	// entries holds the validated templates by name (entry), the least
	// recently used dropped first: names come from requests, so a caller
	// naming templates that do not exist only pushes out the names it
	// made up, not the templates in use. It locks itself.
	entries *lru.Cache
}

// maxCached bounds the entries a Store holds.
const maxCached = 256

type entry struct {
	tmpl *Template // nil with err nil: the built-in default
	err  error
	// principals may use the template (nil: every principal), as written,
	// even when the template is refused.
	principals []string
	rv         string
	checked    time.Time
}

// Option customises a Store.
type Option func(*Store)

// WithTenancy judges templates for the principals ten says may create
// (TenancyOf the deployment's settings). Without it the tenancy is
// unknown: a template that mounts a claim read-write must name one
// principal.
func WithTenancy(ten Tenancy) Option { return func(s *Store) { s.ten = ten } }

// NewStore returns a Store reading PodTemplates in cfg.Namespace.
func NewStore(client kubernetes.Interface, cfg config.Objects, opts ...Option) *Store {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = keys.LabelTemplate }))
	s := &Store{client: client, cfg: cfg, ttl: cfg.TemplateCacheTTL, now: time.Now, entries: lru.New(maxCached),
		informer: factory.Core().V1().PodTemplates().Informer()}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Run starts the watch of the sandbox templates (once), until ctx ends.
func (s *Store) Run(ctx context.Context) {
	if s.running.CompareAndSwap(false, true) {
		go s.informer.Run(ctx.Done())
	}
}

// HasSynced reports whether the watch has started and holds every
// template (from then on, Get reads nothing for a template it holds).
func (s *Store) HasSynced() bool { return s.running.Load() && s.informer.HasSynced() }

// watched is name's PodTemplate as the synced watch holds it: known is
// false when the watch cannot answer (not started, not synced, or a named
// template it has not shown, perhaps made a moment ago), and pt is nil for
// a default template that does not exist.
func (s *Store) watched(name string) (pt *corev1.PodTemplate, known bool) {
	if !s.HasSynced() {
		return nil, false
	}
	obj, ok, err := s.informer.GetStore().GetByKey(s.cfg.Namespace + "/" + name)
	switch {
	case err != nil:
		return nil, false
	case ok:
		return obj.(*corev1.PodTemplate), true
	}
	return nil, name == Default
}

// Get returns the validated template called name ("" is the default),
// whoever may use it. It returns nil, nil for the default when no
// PodTemplate "default" exists: the built-in Pod applies. A missing named
// template is ErrNotFound; a refused one is an *Error naming the field.
func (s *Store) Get(ctx context.Context, name string) (*Template, error) {
	e, err := s.lookup(ctx, name)
	if err != nil {
		return nil, err
	}
	return e.tmpl, e.err
}

// GetFor is Get for a create of principal: a template it may not use is
// absent, with the answer of one that does not exist (the built-in Pod
// for the default, ErrNotFound for a named one, its message the same), so
// the answer tells nothing of the template or of who may use it.
func (s *Store) GetFor(ctx context.Context, name, principal string) (*Template, error) {
	e, err := s.lookup(ctx, name)
	switch {
	case err != nil:
		return nil, err
	case allows(e.principals, principal):
		return e.tmpl, e.err
	case name == "" || name == Default:
		return nil, nil
	}
	return nil, s.notFound(name)
}

// notFound is the error of a named template that does not exist.
func (s *Store) notFound(name string) error {
	return fmt.Errorf("%w: %q (GET /api/templates lists them; a template is a PodTemplate in %s labelled %s)", ErrNotFound, name, s.cfg.Namespace, keys.LabelTemplate)
}

// lookup is name's entry, from the watch or read on demand; the error is a
// failed read (transient), the entry's err the template's own verdict.
func (s *Store) lookup(ctx context.Context, name string) (entry, error) {
	if name == "" {
		name = Default
	}
	e, ok := s.cached(name)
	if pt, known := s.watched(name); known {
		if pt == nil {
			return entry{}, nil // no PodTemplate default: the built-in Pod
		}
		if !ok || e.rv != pt.ResourceVersion { // new, or edited since it was validated
			e = s.validated(pt, e, ok)
			s.remember(name, e)
		}
		return e, nil
	}
	if ok && s.now().Sub(e.checked) < s.ttl {
		return e, nil
	}
	pt, err := s.client.CoreV1().PodTemplates(s.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || err == nil && !isTemplate(pt):
		e = entry{}
		if name != Default {
			e.err = s.notFound(name)
		}
	case err != nil:
		return entry{}, fmt.Errorf("read sandbox template %q: %w", name, err) // not cached: transient
	default:
		e = s.validated(pt, e, ok)
	}
	e.checked = s.now()
	s.remember(name, e)
	return e, nil
}

// validated is pt's entry: e (cached is whether there is one) when it
// was validated at pt's resourceVersion, else pt validated anew.
func (s *Store) validated(pt *corev1.PodTemplate, e entry, cached bool) entry {
	if cached && e.rv == pt.ResourceVersion {
		return e // unchanged since it was validated
	}
	t, err := FromPodTemplateIn(pt, s.cfg, s.ten) // it copies what it keeps: pt may be the watch's
	return entry{tmpl: t, err: err, principals: principalsOf(pt), rv: pt.ResourceVersion}
}

// cached is name's entry, if the Store holds one.
func (s *Store) cached(name string) (entry, bool) {
	v, ok := s.entries.Get(name)
	if !ok {
		return entry{}, false
	}
	return v.(entry), true
}

// remember keeps the validated e for name.
func (s *Store) remember(name string, e entry) { s.entries.Add(name, e) }

// Summary is one template as GET /api/templates lists it.
type Summary struct {
	Name               string `json:"name"`
	Kind               string `json:"kind"`
	Image              string `json:"image,omitempty"`
	IdleTimeoutSeconds int64  `json:"idle_timeout_seconds,omitempty"`
	MaxLifetimeSeconds int64  `json:"max_lifetime_seconds,omitempty"`
	IdleAction         string `json:"idle_action"`
	DeerFlowMounts     bool   `json:"deerflow_mounts"`
	BuiltIn            bool   `json:"built_in,omitempty"`
	// Envd says its sandboxes carry the envd-compatible agent: E2B's SDK
	// can create them.
	Envd bool `json:"envd,omitempty"`
	// Egress is the sandboxes' egress mode when the template names one.
	Egress string `json:"egress,omitempty"`
	// Aliases are the template's other names for E2B's API.
	Aliases []string `json:"aliases,omitempty"`
	// Error is why the template is refused; creates with it get 422.
	Error string `json:"error,omitempty"`
	// Pool is the template's warm pool, when it asks for one.
	Pool *Pool `json:"pool,omitempty"`
}

// Pool describes a template's warm pool: the size asked for, how many
// pooled sandboxes stand Ready now, and why the pool is refused (the
// template itself still serves creates, cold).
type Pool struct {
	Size  int    `json:"size"`
	Ready int    `json:"ready"`
	Error string `json:"error,omitempty"`
}

// List returns every template, valid or not, in one API call, with the
// built-in default when no PodTemplate "default" exists.
func (s *Store) List(ctx context.Context) ([]Summary, error) {
	out, _, err := s.ListValid(ctx)
	return out, err
}

// ListValid is List that also returns the valid templates.
func (s *Store) ListValid(ctx context.Context) ([]Summary, []*Template, error) {
	return s.list(ctx, func([]string) bool { return true })
}

// ListValidFor is ListValid as principal sees it (GET /api/templates): only
// the templates it may use, valid or not, and the built-in default when it
// may use no PodTemplate "default" (GetFor).
func (s *Store) ListValidFor(ctx context.Context, principal string) ([]Summary, []*Template, error) {
	return s.list(ctx, func(principals []string) bool { return allows(principals, principal) })
}

// list lists the templates whose principals uses admits.
func (s *Store) list(ctx context.Context, uses func(principals []string) bool) ([]Summary, []*Template, error) {
	pts, err := s.podTemplates(ctx)
	if err != nil {
		return nil, nil, err
	}
	out := []Summary{}
	var valid []*Template
	haveDefault := false
	for _, pt := range pts {
		e := s.entryOf(pt)
		if !uses(e.principals) {
			continue // absent, for this caller
		}
		haveDefault = haveDefault || pt.Name == Default
		if e.err != nil {
			out = append(out, Summary{Name: pt.Name, Error: e.err.Error()})
			continue
		}
		valid = append(valid, e.tmpl)
		out = append(out, Summarize(e.tmpl))
	}
	if !haveDefault {
		out = append(out, Summary{Name: Default, Kind: KindPod, Image: s.cfg.SandboxImage, IdleAction: IdleDelete, DeerFlowMounts: true, BuiltIn: true,
			IdleTimeoutSeconds: int64(s.cfg.IdleTimeout / time.Second), MaxLifetimeSeconds: int64(s.cfg.MaxLifetime / time.Second)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, valid, nil
}

// podTemplates are the sandbox templates, by name: the synced watch's
// (GET /api/templates and /api/capabilities then cost no API call, however
// often a client asks), else one list from the API server.
func (s *Store) podTemplates(ctx context.Context) ([]*corev1.PodTemplate, error) {
	var pts []*corev1.PodTemplate
	if s.HasSynced() {
		for _, obj := range s.informer.GetStore().List() {
			pts = append(pts, obj.(*corev1.PodTemplate))
		}
	} else {
		list, err := s.client.CoreV1().PodTemplates(s.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: keys.LabelTemplate})
		if err != nil {
			return nil, fmt.Errorf("list sandbox templates: %w", err)
		}
		for i := range list.Items {
			pts = append(pts, &list.Items[i])
		}
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].Name < pts[j].Name })
	return pts, nil
}

// entryOf is pt's entry, validated once per resourceVersion (the entry a
// create's Get uses too), and remembered as read now.
func (s *Store) entryOf(pt *corev1.PodTemplate) entry {
	e, ok := s.cached(pt.Name)
	e = s.validated(pt, e, ok)
	e.checked = s.now()
	s.remember(pt.Name, e)
	return e
}

// Summarize describes a valid template.
func Summarize(t *Template) Summary {
	sum := Summary{Name: t.Name, Kind: t.Kind, IdleAction: t.IdleAction, DeerFlowMounts: t.DeerFlowMounts, Envd: t.Envd, Egress: string(t.Egress), Aliases: t.Aliases,
		IdleTimeoutSeconds: int64(t.IdleTimeout / time.Second), MaxLifetimeSeconds: int64(t.MaxLifetime / time.Second)}
	if c := t.Sandbox(); c != nil {
		sum.Image = c.Image
	}
	if t.PoolSize > 0 || t.PoolError != "" {
		sum.Pool = &Pool{Size: t.PoolSize, Error: t.PoolError}
	}
	return sum
}

// Sandbox returns the template's sandbox container.
func (t *Template) Sandbox() *corev1.Container {
	for i := range t.Pod.Spec.Containers {
		if t.Pod.Spec.Containers[i].Name == ContainerName {
			return &t.Pod.Spec.Containers[i]
		}
	}
	return nil
}

func isTemplate(pt *corev1.PodTemplate) bool {
	_, ok := pt.Labels[keys.LabelTemplate]
	return ok
}
