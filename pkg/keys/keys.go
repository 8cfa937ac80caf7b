// Package keys is the provisioner's vocabulary on Kubernetes objects: every
// label and annotation key it reads or writes, each with the objects that
// carry it. It imports nothing, so every package (templates and
// configuration included) can share one spelling of each key.
//
// The comments name the objects as docs/architecture.md ("The objects")
// describes them: the sandbox Pod (bare, of a ReplicaSet sandbox, or
// claimed from a warm pool), the sandbox ReplicaSet and Service, the pool
// ReplicaSet, its pooled Pods and their wires, the ownership Leases, and
// the sandbox template (a PodTemplate).
package keys

// Prefix starts every key that is ours alone. Operators may not set keys
// under it through templates or SANDBOX_TEMPLATE_ANNOTATIONS: they are the
// provisioner's bookkeeping.
const Prefix = "sandbox.deerflow.dev/"

// DeerFlow's labels, on every sandbox Pod, ReplicaSet and Service (and on
// pooled Pods, which carry no id until claimed). DeerFlow's own provisioner
// writes the same four, so its tooling and ours see the same sandboxes.
const (
	LabelApp       = "app"
	LabelAppValue  = "deer-flow-sandbox"
	LabelID        = "sandbox-id"
	LabelName      = "app.kubernetes.io/name"
	LabelComponent = "app.kubernetes.io/component"
)

// Our labels on every sandbox Pod, ReplicaSet and Service.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "deerflow-sandbox-provisioner"
	// LabelUser and LabelThread hold the user and thread id, or a hash of
	// one that is no valid label value.
	LabelUser   = Prefix + "user"
	LabelThread = Prefix + "thread"
	// LabelPrincipal is a hash of the creating principal (a username is no
	// valid label value); list and the per-principal quota select on it.
	LabelPrincipal = Prefix + "principal"
	// LabelToken is a random value the function writes on a sandbox's
	// workload (a bare or claimed Pod, or a ReplicaSet's Pod template) when
	// it creates or claims it, and that the sandbox's Service selects
	// beside the id. The id is the caller's to choose, so a Pod of another
	// principal's failed create of the same id carries it too; the token
	// it cannot know, so that Pod never joins this sandbox's Service.
	LabelToken = Prefix + "token"
	// LabelPod is a bare sandbox Pod's own name (sandbox-<id>), which the
	// admission policy ties to the Pod's metadata.name: a Service that
	// selects it beside the id and token selects that one Pod, which the
	// API server keeps unique, and no other Pod that carries the token. A
	// Pod template (a ReplicaSet's) carries none.
	LabelPod = Prefix + "pod"
)

// Annotations on every sandbox workload (the bare Pod, or the ReplicaSet and
// its Pods) and, for the principal, on the Service too.
const (
	// AnnotationPrincipal is the creating principal in clear.
	AnnotationPrincipal        = Prefix + "principal"
	AnnotationUserID           = Prefix + "user-id"
	AnnotationThreadID         = Prefix + "thread-id"
	AnnotationCreatedAt        = Prefix + "created-at"
	AnnotationLastActivity     = Prefix + "last-activity"
	AnnotationIdleTimeout      = Prefix + "idle-timeout-seconds"
	AnnotationMaxLifetime      = Prefix + "max-lifetime-seconds"
	AnnotationExpiresAt        = Prefix + "expires-at"
	AnnotationMaxShellSessions = Prefix + "max-shell-sessions"
	// AnnotationTemplate names the template a sandbox was made from.
	AnnotationTemplate = Prefix + "template-name"
)

// On a sandbox ReplicaSet and its Pods.
const (
	// LabelWorkload marks the Pods of a ReplicaSet sandbox. The ReplicaSet
	// selects on it, so it never adopts a bare sandbox Pod of the same id,
	// and so does its Service: the admission policy lets no Pod the
	// provisioner writes carry it (only the ReplicaSet sandbox-<id>'s
	// template, which the API server keeps unique).
	LabelWorkload           = Prefix + "workload"
	WorkloadReplicaSetValue = "replicaset"
	// AnnotationIdleAction is what the reap does to an idle sandbox: delete
	// or pause. A sandbox ReplicaSet carries the value its template (a
	// PodTemplate, where operators set it) gave it.
	AnnotationIdleAction = Prefix + "idle-action"
	// AnnotationPausedTimeout is how long a paused sandbox ReplicaSet may
	// stay paused, in seconds; AnnotationPausedAt is since when it is.
	AnnotationPausedTimeout = Prefix + "paused-timeout-seconds"
	// AnnotationAutoResume ("true") on a paused sandbox ReplicaSet lets the
	// router resume it for a request that carries the sandbox's token
	// (E2B's lifecycle.autoResume).
	AnnotationAutoResume = Prefix + "auto-resume"
	AnnotationPausedAt   = Prefix + "paused-at"
)

// Warm pools: on pool ReplicaSets, their pooled Pods, and claimed Pods.
const (
	// LabelPool marks an unclaimed pooled Pod with its template (as a label
	// value); the pool's ReplicaSet selects on it, so a claim that removes
	// it takes the Pod out of the ReplicaSet, whose controller makes another.
	LabelPool = Prefix + "pool"
	// LabelPoolHash is the hash of a pooled Pod's shape: only a create whose
	// own Pod would have that shape may claim it.
	LabelPoolHash = Prefix + "pool-hash"
	// LabelPooled marks a sandbox Pod that was claimed from a pool.
	LabelPooled = Prefix + "pooled"
	// ComponentWireValue is app.kubernetes.io/component of a pooled Pod's
	// own Service (its wire, named as the Pod): it selects only the Pod's
	// token, so a claim finds the Pod already behind an endpoint that
	// kube-proxy has programmed, and the claimed sandbox keeps that URL.
	ComponentWireValue = "sandbox-wire"
	// AnnotationURLService, on a sandbox Service, names the Service whose
	// URL the sandbox answers with when it is not this one: the wire of
	// the pooled Pod the sandbox was claimed from. The sandbox Service
	// then reaches nothing itself (it is headless): it holds the id, the
	// owner and the quota's place, as every sandbox Service does.
	AnnotationURLService = Prefix + "url-service"
)

// On sandbox templates (PodTemplates), set by operators.
const (
	// LabelTemplate marks a PodTemplate as a sandbox template (any value).
	LabelTemplate = Prefix + "template"
	// TemplateKind is the workload kind: Pod (the default) or ReplicaSet.
	TemplateKind = Prefix + "kind"
	// TemplateIdleTimeout and TemplateMaxLifetime are default lifetimes (Go
	// durations, e.g. 30m) for the template's sandboxes.
	TemplateIdleTimeout = Prefix + "idle-timeout"
	TemplateMaxLifetime = Prefix + "max-lifetime"
	// TemplateIdleAction is AnnotationIdleAction: the template sets it, its
	// sandbox ReplicaSets carry it.
	TemplateIdleAction = AnnotationIdleAction
	// TemplatePausedTimeout is how long a sandbox may stay paused (a Go
	// duration; its ReplicaSets carry it in seconds as AnnotationPausedTimeout).
	TemplatePausedTimeout = Prefix + "paused-timeout"
	// TemplatePort is the sandbox container's port.
	TemplatePort = Prefix + "port"
	// TemplateDeerFlowMounts says whether DeerFlow's skills and user-data
	// mounts apply ("true", the default, or "false").
	TemplateDeerFlowMounts = Prefix + "deerflow-mounts"
	// TemplatePoolSize is how many Ready sandboxes of the template stand warm.
	TemplatePoolSize = Prefix + "pool-size"
)

// E2B sandboxes (docs/e2b.md).
const (
	// TemplateAliases ("a,b") are other names E2B's SDK may create a
	// template's sandboxes by (E2B's template aliases: DeerFlow's E2B
	// provider asks for code-interpreter-v1).
	TemplateAliases = Prefix + "aliases"
	// TemplateEnvd ("true") on a template puts the envd-compatible agent
	// (cmd/envd) into its sandbox container, so E2B's SDK can drive it.
	TemplateEnvd = Prefix + "envd"
	// LabelEnvd ("true") marks a sandbox Pod that carries the agent: the
	// router opens EnvdPort on those alone, and the router's policy admits
	// it to those alone.
	LabelEnvd = TemplateEnvd
	// AnnotationMetadata is an E2B sandbox's metadata, a JSON object of
	// strings, on its workload.
	AnnotationMetadata = Prefix + "metadata"
	// EnvdPort is the agent's port, as E2B's SDK knows it.
	EnvdPort = 49983
)

// On ownership Leases (coordination.k8s.io), one per user_id and one per
// thread_id that a principal has used (package ownership). The Lease's
// holderIdentity is the owning principal; the id itself is in
// AnnotationUserID or AnnotationThreadID, in clear, for operators.
const (
	// LabelOwns says what a Lease owns: OwnsUser or OwnsThread.
	LabelOwns  = Prefix + "owns"
	OwnsUser   = "user"
	OwnsThread = "thread"
)

// Egress (package egress): what a sandbox may reach outside the cluster.
const (
	// TemplateEgress (on a PodTemplate) and LabelEgress (on a sandbox's
	// Pods and Service) hold the mode: open, isolated or allowlist. The
	// NetworkPolicies select Pods by the label, so it is fixed at create.
	TemplateEgress = Prefix + "egress"
	LabelEgress    = TemplateEgress
	// TemplateEgressAllow (on a PodTemplate) and AnnotationEgressAllow (on
	// a sandbox's Service) hold the names an allowlist sandbox may reach
	// through the egress proxy, comma-separated.
	TemplateEgressAllow   = Prefix + "egress-allow"
	AnnotationEgressAllow = TemplateEgressAllow
	// AnnotationEgressGrants (on a sandbox's Service) holds the names
	// granted at run time, as JSON (egress.EncodeGrants).
	AnnotationEgressGrants = Prefix + "egress-grants"
)
