// Package config holds the provisioner's whole configuration: one struct, read
// once at start-up from the environment (and the func runtime's cfg map), then
// passed down. Nothing else in the program reads the environment.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ServiceHeadless is the SANDBOX_SERVICE_TYPE of sandbox Services without a
// virtual IP (clusterIP: None): the Service's DNS name resolves to the
// sandbox Pod itself. For large fleets: the API server's ClusterIP
// allocator costs more per Service the more there are, and kube-proxy
// programs nothing for a headless Service on any node.
const ServiceHeadless = "Headless"

// Config mirrors every variable of DeerFlow's Python provisioner (same names,
// defaults and meanings) and adds our own hardening, lifecycle and quota knobs.
type Config struct {
	// DeerFlow's variables.
	Namespace    string `envconfig:"K8S_NAMESPACE" default:"deer-flow"`
	SandboxImage string `envconfig:"SANDBOX_IMAGE" default:"enterprise-public-cn-beijing.cr.volces.com/vefaas-public/all-in-one-sandbox:latest"`
	// SkillsHostPath is the seed's single skills directory. DeerFlow no
	// longer reads it (skills come from the base directory's skills_view
	// layout); start-up refuses it, saying so, rather than ignore a setting
	// an operator believes is in force.
	SkillsHostPath           string `envconfig:"SKILLS_HOST_PATH"`
	ThreadsHostPath          string `envconfig:"THREADS_HOST_PATH" default:"/.deer-flow/threads"`
	HostBaseDir              string `envconfig:"DEER_FLOW_HOST_BASE_DIR" default:"/.deer-flow"`
	SkillsPVCName            string `envconfig:"SKILLS_PVC_NAME"`
	UserdataPVCName          string `envconfig:"USERDATA_PVC_NAME"`
	SkillsPVCSubpathTemplate string `envconfig:"SKILLS_PVC_SUBPATH_TEMPLATE"`
	ContainerPort            int32  `envconfig:"SANDBOX_CONTAINER_PORT" default:"8080"`
	ServiceType              string `envconfig:"SANDBOX_SERVICE_TYPE" default:"NodePort"` // NodePort, ClusterIP or ServiceHeadless
	KubeconfigPath           string `envconfig:"KUBECONFIG_PATH"`
	NodeHost                 string `envconfig:"NODE_HOST" default:"host.docker.internal"`
	APIServer                string `envconfig:"K8S_API_SERVER"`
	APIKey                   string `envconfig:"PROVISIONER_API_KEY"`
	LarkCLIInitImage         string `envconfig:"LARK_CLI_INIT_IMAGE"`
	LarkCLIBrokerImage       string `envconfig:"LARK_CLI_BROKER_IMAGE"`
	// LarkBrokerDenySubcommands is passed to the broker sidecar as is.
	LarkBrokerDenySubcommands string `envconfig:"DEERFLOW_LARK_BROKER_DENY_SUBCOMMANDS"`

	// APIKeys are named API keys, "name=key,name2=key2": each name is a
	// principal (see principals.go). PROVISIONER_API_KEY is principal "default".
	APIKeys string `envconfig:"PROVISIONER_API_KEYS"`
	// Admins lists the principals that see every sandbox (key names or
	// service-account usernames).
	Admins []string `envconfig:"PROVISIONER_ADMINS"`
	// PrincipalOperations narrows what listed principals may run:
	// "principal=op,op;principal2=op". Unlisted principals may run every
	// operation, unless a "*" entry says otherwise.
	PrincipalOperations string `envconfig:"PROVISIONER_PRINCIPAL_OPERATIONS"`
	// PrincipalGroups makes several credentials one owner:
	// "group=member,member;…". Behind a Knative Broker every event arrives
	// with its Trigger's identity, one per operation; grouped, what the
	// create Trigger made the destroy Trigger can destroy. Operations and
	// administrators are still judged by each member's own name.
	PrincipalGroups string `envconfig:"PROVISIONER_PRINCIPAL_GROUPS"`
	// TokenReviewQPS and TokenReviewBurst bound the TokenReviews a replica
	// sends, on a client of their own: a flood of forged tokens cannot
	// take the rate that sandbox operations use. The honest tokens are few
	// (one per Trigger and PingSource, reused for an hour, each verified
	// once a minute at most), so a few per second is plenty.
	TokenReviewQPS   float32 `envconfig:"AUTH_TOKEN_REVIEW_QPS" default:"5"`
	TokenReviewBurst int     `envconfig:"AUTH_TOKEN_REVIEW_BURST" default:"10"`

	// AuthDisabled accepts every request without credentials. It is a
	// development switch: start-up refuses it unless LISTEN_ADDRESS is a
	// loopback address, and whenever the process runs under Knative
	// (K_SERVICE; queue-proxy reaches the container over loopback) or in a
	// cluster (KUBERNETES_SERVICE_HOST), so a deployed function can never
	// run with it.
	AuthDisabled bool `envconfig:"PROVISIONER_AUTH_DISABLED" default:"false"`
	// KubernetesServiceHost is set by the kubelet in every container.
	KubernetesServiceHost string `envconfig:"KUBERNETES_SERVICE_HOST"`
	// TokenAudience is the audience a bearer token must be issued for (the
	// Triggers' subscriber.audience, the PingSource's sink.audience). Empty
	// turns bearer tokens off.
	TokenAudience string `envconfig:"AUTH_TOKEN_AUDIENCE"`
	// AllowedSubjects lists the service accounts whose verified tokens may
	// act: system:serviceaccount:<ns>:<name>, or <ns>:* for a whole namespace.
	AllowedSubjects []string `envconfig:"AUTH_ALLOWED_SUBJECTS"`
	// APIServerInsecure skips TLS verification for K8S_API_SERVER. Off unless
	// asked for: DeerFlow's provisioner always skipped it, we never do silently.
	APIServerInsecure bool `envconfig:"K8S_API_SERVER_INSECURE" default:"false"`
	// CreateNamespace lets the function create K8S_NAMESPACE; off so that the
	// default Role needs no cluster-wide verbs.
	CreateNamespace bool `envconfig:"CREATE_NAMESPACE" default:"false"`

	// Pod hardening.
	RuntimeClassName string            `envconfig:"SANDBOX_RUNTIME_CLASS"`
	NodeSelector     map[string]string `envconfig:"SANDBOX_NODE_SELECTOR"`
	Tolerations      []string          `envconfig:"SANDBOX_TOLERATIONS"`
	CapabilitiesAdd  []string          `envconfig:"SANDBOX_CAPABILITIES_ADD" default:"CHOWN,DAC_OVERRIDE,FOWNER,FSETID,KILL,NET_BIND_SERVICE,SETGID,SETUID"`
	RunAsNonRoot     bool              `envconfig:"SANDBOX_RUN_AS_NON_ROOT" default:"true"`
	RunAsUser        int64             `envconfig:"SANDBOX_RUN_AS_USER" default:"1000"`
	ReadOnlyRootFS   bool              `envconfig:"SANDBOX_READ_ONLY_ROOT_FS" default:"false"`
	// UserNamespace runs sandboxes with hostUsers: false: root inside is an
	// unprivileged user on the node.
	UserNamespace bool `envconfig:"SANDBOX_USER_NAMESPACE" default:"true"`
	// MemoryRequestEqualsLimit requests the memory a sandbox may use, so no
	// sandbox can overcommit its node.
	MemoryRequestEqualsLimit bool `envconfig:"SANDBOX_MEMORY_REQUEST_EQUALS_LIMIT" default:"true"`

	// Resources: defaults as DeerFlow's Pod, and the bounds a request may ask within.
	CPURequest       string `envconfig:"SANDBOX_CPU_REQUEST" default:"100m"`
	CPULimit         string `envconfig:"SANDBOX_CPU_LIMIT" default:"1"`
	MemoryRequest    string `envconfig:"SANDBOX_MEMORY_REQUEST" default:"256Mi"`
	MemoryLimit      string `envconfig:"SANDBOX_MEMORY_LIMIT" default:"1Gi"`
	EphemeralStorage string `envconfig:"SANDBOX_EPHEMERAL_STORAGE" default:"500Mi"`
	MaxCPULimit      string `envconfig:"SANDBOX_MAX_CPU_LIMIT" default:"4"`
	MaxMemoryLimit   string `envconfig:"SANDBOX_MAX_MEMORY_LIMIT" default:"8Gi"`

	// Lifecycle.
	IdleTimeout      time.Duration `envconfig:"SANDBOX_IDLE_TIMEOUT" default:"1h"`
	MaxLifetime      time.Duration `envconfig:"SANDBOX_MAX_LIFETIME" default:"24h"`
	MaxIdleTimeout   time.Duration `envconfig:"SANDBOX_MAX_IDLE_TIMEOUT" default:"24h"`
	MaxMaxLifetime   time.Duration `envconfig:"SANDBOX_MAX_MAX_LIFETIME" default:"168h"`
	ActivityThrottle time.Duration `envconfig:"SANDBOX_ACTIVITY_THROTTLE" default:"1m"`
	TerminatingWait  time.Duration `envconfig:"SANDBOX_TERMINATING_WAIT" default:"20s"`
	// A request's deadline is REQUEST_TIMEOUT plus the wait it asked for; the
	// two together must fit the func runtime's 30 s write timeout, or the
	// answer is lost (see RuntimeWriteBudget).
	MaxReadyWait   time.Duration `envconfig:"SANDBOX_MAX_READY_WAIT" default:"20s"`
	RequestTimeout time.Duration `envconfig:"REQUEST_TIMEOUT" default:"8s"`

	// TemplateCacheTTL is how long a sandbox template read from the API
	// server is reused before it is read again (and re-validated only when
	// its resourceVersion changed): an edit applies to creates this much later.
	TemplateCacheTTL time.Duration `envconfig:"SANDBOX_TEMPLATE_CACHE_TTL" default:"1s"`
	// MaxPoolSize caps the warm pool a template may ask for
	// (sandbox.deerflow.dev/pool-size): pooled Pods stand Ready with nobody
	// using them, outside MAX_SANDBOXES, so they have a limit of their own.
	MaxPoolSize int `envconfig:"SANDBOX_MAX_POOL_SIZE" default:"10"`

	// What a template may add beyond the provisioner's own settings, each by
	// allow-list (config/800-admission-policy.yaml's parameters must admit
	// the same): tolerations (key[=value]:Effect, as SANDBOX_TOLERATIONS),
	// Pod annotations (exact keys, or prefixes ending in *), and priority
	// classes (none by default).
	TemplateTolerations     []string `envconfig:"SANDBOX_TEMPLATE_TOLERATIONS"`
	TemplateAnnotations     []string `envconfig:"SANDBOX_TEMPLATE_ANNOTATIONS" default:"kubectl.kubernetes.io/default-container,cluster-autoscaler.kubernetes.io/safe-to-evict,prometheus.io/scrape,prometheus.io/port,prometheus.io/path"`
	TemplatePriorityClasses []string `envconfig:"SANDBOX_TEMPLATE_PRIORITY_CLASSES"`

	// NetworkPolicyCheckTTL is how long a create trusts the last check of the
	// shared NetworkPolicy (present, and what the function would build)
	// before it reads the policy again: a deleted or altered policy stops
	// creates this much later at most.
	NetworkPolicyCheckTTL time.Duration `envconfig:"SANDBOX_NETWORK_POLICY_CHECK_TTL" default:"2s"`

	// Quotas; 0 means no limit.
	MaxSandboxes        int `envconfig:"MAX_SANDBOXES" default:"500"`
	MaxSandboxesPerUser int `envconfig:"MAX_SANDBOXES_PER_USER" default:"0"`
	// MaxSandboxesPerPrincipal limits the sandboxes each principal (API key
	// name or token subject) has created, counted as the per-user limit is.
	MaxSandboxesPerPrincipal int `envconfig:"MAX_SANDBOXES_PER_PRINCIPAL" default:"0"`

	// Isolation.
	// One shared NetworkPolicy isolates every sandbox (see
	// sandbox.BuildNetworkPolicy and config/701-networkpolicy-sandboxes.yaml).
	// With SANDBOX_NETWORK_POLICY on, no sandbox is created until it exists.
	NetworkPolicy        bool              `envconfig:"SANDBOX_NETWORK_POLICY" default:"true"`
	NetworkPolicyName    string            `envconfig:"SANDBOX_NETWORK_POLICY_NAME" default:"deer-flow-sandbox-isolation"`
	EnsureNetworkPolicy  bool              `envconfig:"SANDBOX_NETWORK_POLICY_ENSURE" default:"false"`
	IngressFromPodLabels map[string]string `envconfig:"SANDBOX_INGRESS_FROM_POD_LABELS" default:"app.kubernetes.io/name:deer-flow-backend"`
	IngressFromNamespace map[string]string `envconfig:"SANDBOX_INGRESS_FROM_NAMESPACE_LABELS"`
	IngressNodeCIDRs     []string          `envconfig:"SANDBOX_INGRESS_NODE_CIDRS"`
	EgressMode           string            `envconfig:"SANDBOX_EGRESS_MODE" default:"internet"`
	EgressDenyCIDRs      []string          `envconfig:"SANDBOX_EGRESS_DENY_CIDRS" default:"10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,169.254.0.0/16,100.64.0.0/10,169.254.169.254/32,169.254.170.2/32,100.100.100.200/32,168.63.129.16/32,fc00::/7,fe80::/10,fd00:ec2::254/128"`
	EgressAllowCIDRs     []string          `envconfig:"SANDBOX_EGRESS_ALLOW_CIDRS" default:"0.0.0.0/0,::/0"`
	DNSNamespaceLabels   map[string]string `envconfig:"SANDBOX_DNS_NAMESPACE_LABELS" default:"kubernetes.io/metadata.name:kube-system"`
	DNSPodLabels         map[string]string `envconfig:"SANDBOX_DNS_POD_LABELS" default:"k8s-app:kube-dns"`
	EventSourceAllowlist []string          `envconfig:"EVENT_SOURCE_ALLOWLIST"`
	EventsDisabled       bool              `envconfig:"EVENTS_DISABLED" default:"false"`
	EmitKubernetesEvents bool              `envconfig:"EMIT_KUBERNETES_EVENTS" default:"true"`
	// Events are advice and every one is a write to the shared API server:
	// at most this many per second per replica (bursts of EventsBurst);
	// beyond, they are dropped and counted.
	EventsQPS           float64 `envconfig:"K8S_EVENTS_QPS" default:"1"`
	EventsBurst         int     `envconfig:"K8S_EVENTS_BURST" default:"10"`
	ServiceAccountName  string  `envconfig:"SANDBOX_SERVICE_ACCOUNT"`
	ListenAddress       string  `envconfig:"LISTEN_ADDRESS" default:"[::]:8080"`
	LogLevel            string  `envconfig:"LOG_LEVEL" default:"info"`
	MaxRequestBodyBytes int64   `envconfig:"MAX_REQUEST_BODY_BYTES" default:"65536"`
	// Client-side rate limit towards the API server, per replica. The API
	// server's priority and fairness is the real guard; this keeps one busy
	// replica from crowding out the rest of the cluster. Sized for the work:
	// a create or a destroy is two calls (the quota reads a watch-backed
	// cache), so 200/s lets a replica create about 100 sandboxes a second,
	// more than one API server here accepts; 50/s capped it near 12.
	ClientQPS   float32 `envconfig:"K8S_CLIENT_QPS" default:"200"`
	ClientBurst int     `envconfig:"K8S_CLIENT_BURST" default:"400"`
	// MaxConcurrentWaits caps the requests of one replica that wait for
	// readiness at once (each holds an API watch); beyond it, 429.
	MaxConcurrentWaits int    `envconfig:"MAX_CONCURRENT_WAITS" default:"32"`
	KService           string `envconfig:"K_SERVICE"` // set by Knative Serving
}

// RuntimeWriteBudget is how long a request may take before the func
// runtime's 30 s write timeout drops its answer, less a margin for writing it.
const RuntimeWriteBudget = 28 * time.Second

var subjectPattern = regexp.MustCompile(`^system:serviceaccount:[a-z0-9]([-a-z0-9]*[a-z0-9])?:(\*|[a-z0-9]([-a-z0-9.]*[a-z0-9])?)$`)

// AllowedCapabilities are the only capabilities a sandbox may be given: the
// file-ownership and process ones a package manager or a shell needs (the
// container runtime's defaults, less NET_RAW, MKNOD, SYS_CHROOT, SETFCAP,
// SETPCAP and AUDIT_WRITE). The README says why each is there. Anything else
// (NET_ADMIN, BPF, SYS_RAWIO, DAC_READ_SEARCH, SYS_ADMIN, ...) is refused at
// start-up, and the admission policy in config/ refuses it again.
var AllowedCapabilities = []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID"}

// CapabilityAllowed reports whether a sandbox may add capability, named as
// Kubernetes and the admission policy in config/ name it (CHOWN).
func CapabilityAllowed(capability string) bool {
	return slices.Contains(AllowedCapabilities, capability)
}

// AllowedExtraMountPaths is DeerFlow's allow-list of container paths that an
// extra mount may target. Anything else is refused.
var AllowedExtraMountPaths = []string{
	"/mnt/acp-workspace",
	"/mnt/skills/custom",
	"/mnt/skills/integrations",
	"/mnt/integrations/lark-cli/config",
	"/mnt/integrations/lark-cli/config/locks",
	"/mnt/integrations/lark-cli/data",
	"/mnt/integrations/lark-cli/runtime",
}

// Load reads the configuration from the environment and validates it. Every
// error names the variable to fix.
func Load() (*Config, error) {
	var c Config
	if err := envconfig.Process("", &c); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate checks values that envconfig's types cannot, so that a bad value
// fails start-up instead of the first create.
func (c *Config) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
	}
	if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		bad("K8S_NAMESPACE", "%q is not a namespace name: %s", c.Namespace, strings.Join(msgs, "; "))
	}
	if strings.TrimSpace(c.SandboxImage) == "" || strings.ContainsAny(c.SandboxImage, " \t\n") {
		bad("SANDBOX_IMAGE", "%q is not an image reference", c.SandboxImage)
	}
	if c.SkillsHostPath != "" {
		bad("SKILLS_HOST_PATH", "is no longer used, as in DeerFlow's provisioner: skills are mounted from DEER_FLOW_HOST_BASE_DIR "+
			"(<base>/skills_view/public, <base>/users/<user_id>/skills_view/custom and .../legacy), or with SKILLS_PVC_NAME from that claim; unset it")
	}
	for name, p := range map[string]string{"THREADS_HOST_PATH": c.ThreadsHostPath, "DEER_FLOW_HOST_BASE_DIR": c.HostBaseDir} {
		if !path.IsAbs(p) || path.Clean(p) != p {
			bad(name, "%q must be an absolute, clean path", p)
		}
	}
	// Every host-backed mount is rooted at a tenant's directory under the
	// base (see sandbox.hostRootOf), so the threads directory must lie under
	// the base, and not inside a user's tree, which that user's sandboxes
	// may write.
	switch users := path.Join(c.HostBaseDir, "users"); {
	case !strings.HasPrefix(c.ThreadsHostPath, c.HostBaseDir+"/"):
		bad("THREADS_HOST_PATH", "%q must lie under DEER_FLOW_HOST_BASE_DIR %q", c.ThreadsHostPath, c.HostBaseDir)
	case c.ThreadsHostPath == users || strings.HasPrefix(c.ThreadsHostPath, users+"/"):
		bad("THREADS_HOST_PATH", "%q must not lie in %s, where each user's own tree is", c.ThreadsHostPath, users)
	}
	if c.HostBaseDir == "/" {
		bad("DEER_FLOW_HOST_BASE_DIR", "must not be the node's root")
	}
	for name, v := range map[string]string{"SKILLS_PVC_NAME": c.SkillsPVCName, "USERDATA_PVC_NAME": c.UserdataPVCName} {
		if v == "" {
			continue
		}
		if msgs := validation.IsDNS1123Subdomain(v); len(msgs) > 0 {
			bad(name, "%q is not a PVC name: %s", v, strings.Join(msgs, "; "))
		}
	}
	if err := validSubPathTemplate(c.SkillsPVCSubpathTemplate); err != nil {
		bad("SKILLS_PVC_SUBPATH_TEMPLATE", "%q %v", c.SkillsPVCSubpathTemplate, err)
	}
	if c.ContainerPort < 1 || c.ContainerPort > 65535 {
		bad("SANDBOX_CONTAINER_PORT", "%d is not a port", c.ContainerPort)
	}
	if c.ServiceType != "NodePort" && c.ServiceType != "ClusterIP" && c.ServiceType != ServiceHeadless {
		bad("SANDBOX_SERVICE_TYPE", "%q must be NodePort, ClusterIP or %s", c.ServiceType, ServiceHeadless)
	}
	if c.APIServer != "" {
		if u, err := url.Parse(c.APIServer); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			bad("K8S_API_SERVER", "%q must be an http(s) URL", c.APIServer)
		}
	}
	if c.RuntimeClassName != "" {
		if msgs := validation.IsDNS1123Subdomain(c.RuntimeClassName); len(msgs) > 0 {
			bad("SANDBOX_RUNTIME_CLASS", "%q: %s", c.RuntimeClassName, strings.Join(msgs, "; "))
		}
	}
	if _, err := ParseTolerations(c.Tolerations); err != nil {
		bad("SANDBOX_TOLERATIONS", "%v", err)
	}
	for _, q := range []struct{ name, v string }{
		{"SANDBOX_CPU_REQUEST", c.CPURequest}, {"SANDBOX_CPU_LIMIT", c.CPULimit},
		{"SANDBOX_MEMORY_REQUEST", c.MemoryRequest}, {"SANDBOX_MEMORY_LIMIT", c.MemoryLimit},
		{"SANDBOX_EPHEMERAL_STORAGE", c.EphemeralStorage},
		{"SANDBOX_MAX_CPU_LIMIT", c.MaxCPULimit}, {"SANDBOX_MAX_MEMORY_LIMIT", c.MaxMemoryLimit},
	} {
		if qty, err := resource.ParseQuantity(q.v); err != nil || qty.Sign() <= 0 {
			bad(q.name, "%q is not a positive quantity", q.v)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"SANDBOX_IDLE_TIMEOUT", c.IdleTimeout}, {"SANDBOX_MAX_LIFETIME", c.MaxLifetime},
		{"SANDBOX_MAX_IDLE_TIMEOUT", c.MaxIdleTimeout}, {"SANDBOX_MAX_MAX_LIFETIME", c.MaxMaxLifetime},
		{"REQUEST_TIMEOUT", c.RequestTimeout}, {"SANDBOX_MAX_READY_WAIT", c.MaxReadyWait},
	} {
		if d.v <= 0 {
			bad(d.name, "%s must be positive", d.v)
		}
	}
	if c.IdleTimeout > c.MaxIdleTimeout {
		bad("SANDBOX_IDLE_TIMEOUT", "%s exceeds SANDBOX_MAX_IDLE_TIMEOUT %s", c.IdleTimeout, c.MaxIdleTimeout)
	}
	if c.MaxLifetime > c.MaxMaxLifetime {
		bad("SANDBOX_MAX_LIFETIME", "%s exceeds SANDBOX_MAX_MAX_LIFETIME %s", c.MaxLifetime, c.MaxMaxLifetime)
	}
	if c.RunAsNonRoot && c.RunAsUser == 0 {
		bad("SANDBOX_RUN_AS_USER", "0 (root) contradicts SANDBOX_RUN_AS_NON_ROOT=true")
	}
	if c.RunAsUser < -1 {
		bad("SANDBOX_RUN_AS_USER", "%d must be a user id, or -1 for the image's user", c.RunAsUser)
	}
	if c.EgressMode != "internet" && c.EgressMode != "deny-all" {
		bad("SANDBOX_EGRESS_MODE", "%q must be internet or deny-all", c.EgressMode)
	}
	if c.NetworkPolicy && len(c.IngressFromPodLabels) == 0 {
		bad("SANDBOX_INGRESS_FROM_POD_LABELS", "must select the agent backend's Pods (an empty selector would admit every Pod, sandboxes included)")
	}
	if c.IngressFromPodLabels["app"] == "deer-flow-sandbox" {
		bad("SANDBOX_INGRESS_FROM_POD_LABELS", "selects sandboxes; a sandbox must never reach another")
	}
	if msgs := validation.IsDNS1123Subdomain(c.NetworkPolicyName); len(msgs) > 0 {
		bad("SANDBOX_NETWORK_POLICY_NAME", "%q: %s", c.NetworkPolicyName, strings.Join(msgs, "; "))
	}
	if c.RequestTimeout+c.MaxReadyWait > RuntimeWriteBudget {
		bad("SANDBOX_MAX_READY_WAIT", "%s plus REQUEST_TIMEOUT %s exceeds %s: the func runtime drops answers after 30 s", c.MaxReadyWait, c.RequestTimeout, RuntimeWriteBudget)
	}
	if c.TemplateCacheTTL < 0 || c.TemplateCacheTTL > time.Minute {
		bad("SANDBOX_TEMPLATE_CACHE_TTL", "%s must be between 0 (read on every create) and 1m", c.TemplateCacheTTL)
	}
	if c.MaxPoolSize < 0 {
		bad("SANDBOX_MAX_POOL_SIZE", "%d must be 0 (no pools) or positive", c.MaxPoolSize)
	}
	errs = append(errs, c.validateTemplateAllowLists()...)
	if c.NetworkPolicyCheckTTL < 0 || c.NetworkPolicyCheckTTL > time.Minute {
		bad("SANDBOX_NETWORK_POLICY_CHECK_TTL", "%s must be between 0 (read on every create) and 1m", c.NetworkPolicyCheckTTL)
	}
	if c.MaxConcurrentWaits < 1 {
		bad("MAX_CONCURRENT_WAITS", "%d must be at least 1", c.MaxConcurrentWaits)
	}
	if c.EventsQPS <= 0 || c.EventsBurst < 1 {
		bad("K8S_EVENTS_QPS", "K8S_EVENTS_QPS and K8S_EVENTS_BURST must be positive (set EMIT_KUBERNETES_EVENTS=false for none)")
	}
	if c.ClientQPS <= 0 || c.ClientBurst < 1 {
		bad("K8S_CLIENT_QPS", "QPS and K8S_CLIENT_BURST must be positive")
	}
	for _, s := range c.AllowedSubjects {
		if !subjectPattern.MatchString(s) {
			bad("AUTH_ALLOWED_SUBJECTS", "%q must be system:serviceaccount:<namespace>:<name> or system:serviceaccount:<namespace>:*", s)
		}
	}
	if c.TokenAudience != "" && strings.ContainsAny(c.TokenAudience, " \t\n,") {
		bad("AUTH_TOKEN_AUDIENCE", "%q must be one audience without spaces or commas", c.TokenAudience)
	}
	switch {
	case c.AuthDisabled && c.KService != "":
		bad("PROVISIONER_AUTH_DISABLED", "is a development switch and is refused under Knative (K_SERVICE=%q): queue-proxy reaches the container over loopback, so every caller would pass", c.KService)
	case c.AuthDisabled && c.KubernetesServiceHost != "":
		bad("PROVISIONER_AUTH_DISABLED", "is a development switch and is refused in a cluster (KUBERNETES_SERVICE_HOST is set): every Pod that reaches this one would pass")
	case c.AuthDisabled && !IsLoopback(c.ListenAddress):
		bad("PROVISIONER_AUTH_DISABLED", "is a development switch and needs a loopback LISTEN_ADDRESS (127.0.0.1:8080), not %q", c.ListenAddress)
	}
	if _, err := ParseAPIKeys(c.APIKeys, c.APIKey); err != nil {
		bad("PROVISIONER_API_KEYS", "%v", err)
	}
	for _, a := range c.Admins {
		if err := validPrincipal(a); err != nil {
			bad("PROVISIONER_ADMINS", "%v", err)
		}
	}
	if _, err := ParsePrincipalOperations(c.PrincipalOperations); err != nil {
		bad("PROVISIONER_PRINCIPAL_OPERATIONS", "%v", err)
	}
	if _, err := ParsePrincipalGroups(c.PrincipalGroups); err != nil {
		bad("PROVISIONER_PRINCIPAL_GROUPS", "%v", err)
	}
	if c.TokenReviewQPS <= 0 || c.TokenReviewBurst < 1 {
		bad("AUTH_TOKEN_REVIEW_QPS", "AUTH_TOKEN_REVIEW_QPS and AUTH_TOKEN_REVIEW_BURST must be positive")
	}
	if c.MaxLifetime < time.Second {
		bad("SANDBOX_MAX_LIFETIME", "%s is under one second", c.MaxLifetime)
	}
	if c.MaxSandboxes < 0 || c.MaxSandboxesPerUser < 0 {
		bad("MAX_SANDBOXES", "quotas must be 0 (no limit) or positive")
	}
	if c.MaxSandboxesPerPrincipal < 0 {
		bad("MAX_SANDBOXES_PER_PRINCIPAL", "must be 0 (no limit) or positive")
	}
	if c.MaxRequestBodyBytes < 1024 {
		bad("MAX_REQUEST_BODY_BYTES", "%d is below 1024", c.MaxRequestBodyBytes)
	}
	for _, list := range []struct {
		name  string
		cidrs []string
	}{{"SANDBOX_EGRESS_DENY_CIDRS", c.EgressDenyCIDRs}, {"SANDBOX_EGRESS_ALLOW_CIDRS", c.EgressAllowCIDRs}, {"SANDBOX_INGRESS_NODE_CIDRS", c.IngressNodeCIDRs}} {
		for _, cidr := range list.cidrs {
			ip, network, err := net.ParseCIDR(cidr)
			switch {
			case err != nil:
				bad(list.name, "%q is not a CIDR such as 169.254.169.254/32", cidr)
			case !ip.Equal(network.IP):
				// The API server refuses a NetworkPolicy ipBlock with host
				// bits set, so every create would fail later.
				bad(list.name, "%q has host bits set; write the network, %s", cidr, network)
			}
		}
	}
	for _, capability := range c.CapabilitiesAdd {
		if !CapabilityAllowed(capability) {
			bad("SANDBOX_CAPABILITIES_ADD", "%q is not on the allow-list %s; a sandbox may not add it", capability, strings.Join(AllowedCapabilities, ","))
		}
	}
	if c.NodeHost == "" || strings.ContainsAny(c.NodeHost, "/ @?#") {
		bad("NODE_HOST", "%q must be a bare host name or address", c.NodeHost)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		bad("LOG_LEVEL", "%q must be debug, info, warn or error", c.LogLevel)
	}
	return errors.Join(errs...)
}

// validSubPathTemplate accepts what DeerFlow formats with user_id and
// thread_id: a relative path whose only placeholders are {user_id} and
// {thread_id}, with no '.' or '..' segment, so that no value can climb out.
func validSubPathTemplate(t string) error {
	if t == "" {
		return nil
	}
	bare := strings.NewReplacer("{user_id}", "u", "{thread_id}", "t").Replace(t)
	switch {
	case strings.ContainsAny(bare, "{}"):
		return errors.New("may use only the placeholders {user_id} and {thread_id}")
	case strings.HasPrefix(bare, "/") || strings.ContainsAny(bare, "\\\x00"):
		return errors.New("must be a relative path")
	case path.Clean(bare) != bare || slices.Contains(strings.Split(bare, "/"), ".."):
		return errors.New("must be a clean path without '.' or '..' segments")
	}
	return nil
}

// IsLoopback reports whether a listen address binds only to loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
