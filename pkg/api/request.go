package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"io"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// CreateRequest is the body DeerFlow's backend sends to create a sandbox, plus
// our optional fields. Unknown fields are ignored, as DeerFlow's server does.
type CreateRequest struct {
	SandboxID               string       `json:"sandbox_id"`
	ThreadID                *string      `json:"thread_id"`
	UserID                  *string      `json:"user_id"`
	ExtraMounts             []ExtraMount `json:"extra_mounts"`
	IncludeLegacySkills     bool         `json:"include_legacy_skills"`
	ProvisionLarkCLIRuntime bool         `json:"provision_lark_cli_runtime"`
	ProvisionLarkCLIBroker  bool         `json:"provision_lark_cli_broker"`
	MaxShellSessions        *int         `json:"max_shell_sessions"`

	// Ours: lifecycle and resources within operator bounds.
	IdleTimeoutSeconds *int64 `json:"idle_timeout_seconds"`
	MaxLifetimeSeconds *int64 `json:"max_lifetime_seconds"`
	CPU                string `json:"cpu"`
	Memory             string `json:"memory"`
	// Template names the sandbox template (a PodTemplate); empty is the default.
	Template string `json:"template"`
	// Env is passed to the sandbox container as environment variables
	// (Agent-Sandbox's envVars): plain values only, bounded (see validateEnv).
	Env Env `json:"env"`
}

// Env is a request's environment variables, names to plain string values.
type Env map[string]string

// UnmarshalJSON takes only a JSON object of strings, and names the entry
// that is not one: a reference such as Kubernetes' valueFrom is an object,
// and refused like any other non-string.
func (e *Env) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return Invalidf("field \"env\" must be a JSON object of names to string values")
	}
	if raw == nil {
		*e = nil
		return nil
	}
	out := make(Env, len(raw))
	for _, name := range slices.Sorted(maps.Keys(raw)) {
		var v string
		if err := json.Unmarshal(raw[name], &v); err != nil {
			return Invalidf("env.%s must be a JSON string: values only, never references to Secrets or fields", Truncate(name))
		}
		out[name] = v
	}
	*e = out
	return nil
}

// ExtraMount is one host directory DeerFlow asks to mount into the sandbox.
type ExtraMount struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	// ReadOnly defaults to true when omitted: a mount is writable only when asked.
	ReadOnly *bool `json:"read_only"`
}

// Spec is a validated, normalised create request: everything the builders need.
type Spec struct {
	ID                  string
	ThreadID            string
	UserID              string
	Mounts              []Mount
	IncludeLegacySkills bool
	LarkCLIRuntime      bool
	LarkCLIBroker       bool
	MaxShellSessions    int // 0: not set
	IdleTimeout         time.Duration
	MaxLifetime         time.Duration
	CPULimit            resource.Quantity
	MemoryLimit         resource.Quantity
	Now                 time.Time // creation time, so builders stay pure
	// Template is the requested template's name ("" is the default);
	// Resolved is that template once read (nil: the built-in default).
	Template string
	Resolved *template.Template
	// Requested says which of the bounded fields the request set itself, so
	// that a template's defaults fill only the others.
	Requested Requested
	// Caller is who creates the sandbox (set by Create from the request's
	// context); its principal is recorded on every object (owner.go).
	Caller Caller
	// Env is the request's environment variables for the sandbox container,
	// validated (nil: none).
	Env map[string]string
	// Token is the sandbox's selector token (keys.LabelToken), set by
	// Create: a new one for a new sandbox, the workload's for an existing
	// one. Empty: a sandbox from before tokens, selected by id alone.
	Token string
	// Egress is what the sandbox may reach outside the cluster (its
	// template's, or the deployment's), set by Create.
	Egress Egress
	// EnvdTokenHash is the SHA-256 (hex) of the sandbox's envd access token
	// (package access), given to the agent of a template that carries it;
	// empty, the agent answers nothing. Metadata is an E2B sandbox's
	// metadata (keys.AnnotationMetadata). Both are set by the E2B API.
	EnvdTokenHash string
	Metadata      map[string]string
	// AutoResume: once paused, the sandbox resumes on a request to any of
	// its ports through the router (E2B's lifecycle.autoResume; a
	// ReplicaSet template that pauses). Set by the E2B API.
	AutoResume bool
}

// Egress is a sandbox's egress: its mode, the names an allowlist sandbox
// may reach, and the proxy it reaches them through (host:port, the proxy
// Service's ClusterIP).
type Egress struct {
	Mode  egress.Mode
	Allow []string
	Proxy string
}

// Requested marks the request fields that win over a template.
type Requested struct{ IdleTimeout, MaxLifetime, CPU, Memory bool }

// Mount is a validated extra mount.
type Mount struct {
	HostPath      string
	ContainerPath string
	ReadOnly      bool
}

// DefaultUserID is the user_id of a create that sends none, as in DeerFlow.
const DefaultUserID = "default"

const (
	maxExtraMounts     = 10
	maxMaxShellSession = 1024
	// MaxIDLen keeps "sandbox-<id>-svc" within the 63 characters of a DNS label.
	MaxIDLen = 63 - len("sandbox-") - len("-svc")
)

var (
	safeNamePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	quantityPattern = regexp.MustCompile(`^[0-9]{1,9}(\.[0-9]{1,6})?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$`)
)

// ValidateID checks a sandbox id as it comes from a path or an event.
func ValidateID(id string) error {
	switch {
	case id == "":
		return Invalidf("sandbox_id is required")
	case len(id) > MaxIDLen:
		return Invalidf("sandbox_id %q is %d characters; at most %d fit the Service name sandbox-<id>-svc", Truncate(id), len(id), MaxIDLen)
	case len(validation.IsDNS1123Label(id)) > 0: // what a Pod and Service name needs
		return Invalidf("sandbox_id %q must be lowercase letters, digits and '-', starting and ending with a letter or digit", Truncate(id))
	}
	return nil
}

// DecodeCreateRequest parses a JSON create body. It refuses trailing data and
// reports type errors with the field name, so the caller can say what to fix.
func DecodeCreateRequest(body []byte) (CreateRequest, error) {
	var req CreateRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return req, Malformedf("request body is empty; send a JSON object with at least sandbox_id")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&req); err != nil {
		var invalid *Error
		if errors.As(err, &invalid) {
			return req, invalid // from a field's own decoder (Env)
		}
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field == "" {
			return req, Invalidf("request body must be a JSON object, not %s", typeErr.Value)
		}
		if errors.As(err, &typeErr) {
			return req, Invalidf("field %q must be of JSON type %s, not %s", typeErr.Field, jsonTypeName(typeErr.Type.String()), typeErr.Value)
		}
		return req, Malformedf("request body is not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return req, Malformedf("request body has data after the JSON object")
	}
	return req, nil
}

func jsonTypeName(goType string) string {
	switch {
	case strings.Contains(goType, "string"):
		return "string"
	case strings.Contains(goType, "bool"):
		return "boolean"
	case strings.Contains(goType, "int"):
		return "integer"
	case strings.HasPrefix(goType, "[]"):
		return "array"
	}
	return "object"
}

// Validate turns a request into a Spec, or explains what is wrong with it.
func (r CreateRequest) Validate(cfg config.Objects, now time.Time) (Spec, error) {
	if err := ValidateID(r.SandboxID); err != nil {
		return Spec{}, err
	}
	s := Spec{
		ID:                  r.SandboxID,
		ThreadID:            r.SandboxID, // DeerFlow: a null thread_id means "use sandbox_id"
		UserID:              DefaultUserID,
		IncludeLegacySkills: r.IncludeLegacySkills,
		LarkCLIRuntime:      r.ProvisionLarkCLIRuntime && cfg.LarkCLIInitImage != "",
		LarkCLIBroker:       r.ProvisionLarkCLIBroker && cfg.LarkCLIBrokerImage != "",
		IdleTimeout:         cfg.IdleTimeout,
		MaxLifetime:         cfg.MaxLifetime,
		CPULimit:            resource.MustParse(cfg.CPULimit),
		MemoryLimit:         resource.MustParse(cfg.MemoryLimit),
		Now:                 now.UTC().Truncate(time.Second),
		Template:            r.Template,
		Requested: Requested{IdleTimeout: r.IdleTimeoutSeconds != nil, MaxLifetime: r.MaxLifetimeSeconds != nil,
			CPU: r.CPU != "", Memory: r.Memory != ""},
	}
	if r.Template != "" {
		if msgs := validation.IsDNS1123Subdomain(r.Template); len(msgs) > 0 {
			return Spec{}, Invalidf("template %q must be the name of a sandbox template (GET /api/templates lists them): %s", Truncate(r.Template), strings.Join(msgs, "; "))
		}
	}
	if r.ThreadID != nil {
		if !safeNamePattern.MatchString(*r.ThreadID) {
			return Spec{}, Invalidf("thread_id %q must be 1-64 letters, digits, '_' or '-'", Truncate(*r.ThreadID))
		}
		s.ThreadID = *r.ThreadID
	}
	if r.UserID != nil {
		if !safeNamePattern.MatchString(*r.UserID) {
			return Spec{}, Invalidf("user_id %q must be 1-64 letters, digits, '_' or '-'", Truncate(*r.UserID))
		}
		s.UserID = *r.UserID
	}
	if r.MaxShellSessions != nil {
		n := *r.MaxShellSessions
		if n < 1 || n > maxMaxShellSession {
			return Spec{}, Invalidf("max_shell_sessions must be between 1 and %d, not %d", maxMaxShellSession, n)
		}
		s.MaxShellSessions = n
	}
	var err error
	if s.IdleTimeout, err = boundedSeconds("idle_timeout_seconds", r.IdleTimeoutSeconds, cfg.IdleTimeout, cfg.MaxIdleTimeout); err != nil {
		return Spec{}, err
	}
	if s.MaxLifetime, err = boundedSeconds("max_lifetime_seconds", r.MaxLifetimeSeconds, cfg.MaxLifetime, cfg.MaxMaxLifetime); err != nil {
		return Spec{}, err
	}
	if s.CPULimit, err = boundedQuantity("cpu", r.CPU, cfg.CPULimit, cfg.CPURequest, cfg.MaxCPULimit); err != nil {
		return Spec{}, err
	}
	if s.MemoryLimit, err = boundedQuantity("memory", r.Memory, cfg.MemoryLimit, cfg.MemoryRequest, cfg.MaxMemoryLimit); err != nil {
		return Spec{}, err
	}
	if s.Mounts, err = validateMounts(cfg, r.ExtraMounts, s.UserID, s.ThreadID); err != nil {
		return Spec{}, err
	}
	if s.Env, err = validateEnv(r.Env); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// Bounds of a request's env: enough for an agent's API keys and settings,
// small enough that a Pod stays far below etcd's object size limit.
const (
	maxEnvEntries    = 32
	maxEnvNameBytes  = 128
	maxEnvValueBytes = 4 << 10
	maxEnvTotalBytes = 32 << 10
)

var envNamePattern = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)

// ReservedEnv says why a request may not set name, or "" if it may. Refused
// are the names the provisioner sets (MAX_SHELL_SESSIONS, DeerFlow's and the
// Lark CLI's), the names Kubernetes injects (KUBERNETES_*, and the service
// link variables *_SERVICE_HOST/_PORT, off in sandboxes but not to be faked),
// and the few that change how the sandbox's own server starts (PATH,
// HOSTNAME, the dynamic loader's LD_*). A template's own env is checked
// against the request later (resolveTemplate).
func ReservedEnv(name string) string {
	switch {
	case name == "MAX_SHELL_SESSIONS" || strings.HasPrefix(name, "DEERFLOW_") || strings.HasPrefix(name, "DEER_FLOW_") || strings.HasPrefix(name, "LARK_CLI_"):
		return "the provisioner sets it"
	case strings.HasPrefix(name, "KUBERNETES_") || strings.HasSuffix(name, "_SERVICE_HOST") || strings.HasSuffix(name, "_SERVICE_PORT") || strings.Contains(name, "_SERVICE_PORT_"):
		return "Kubernetes sets names of this form"
	case name == "PATH" || name == "HOSTNAME" || strings.HasPrefix(name, "LD_"):
		return "it changes how the sandbox itself starts"
	}
	return ""
}

// validateEnv checks the request's env entry by entry, in name order so
// that the first offending entry is always the one named.
func validateEnv(env map[string]string) (map[string]string, error) {
	if len(env) == 0 {
		return nil, nil
	}
	if len(env) > maxEnvEntries {
		return nil, Invalidf("env has %d entries; at most %d are allowed", len(env), maxEnvEntries)
	}
	total := 0
	for _, name := range slices.Sorted(maps.Keys(env)) {
		value := env[name]
		switch {
		case len(name) > maxEnvNameBytes:
			return nil, Invalidf("env name %q is %d bytes; at most %d are allowed", Truncate(name), len(name), maxEnvNameBytes)
		case !envNamePattern.MatchString(name):
			return nil, Invalidf("env name %q must be upper-case letters, digits and '_', not starting with a digit", Truncate(name))
		case ReservedEnv(name) != "":
			return nil, Invalidf("env.%s is reserved (%s); choose another name", name, ReservedEnv(name))
		case len(value) > maxEnvValueBytes:
			return nil, Invalidf("env.%s is %d bytes; at most %d are allowed", name, len(value), maxEnvValueBytes)
		case strings.ContainsRune(value, 0):
			return nil, Invalidf("env.%s contains a NUL byte, which no process environment can hold", name)
		}
		total += len(name) + len(value)
	}
	if total > maxEnvTotalBytes {
		return nil, Invalidf("env totals %d bytes of names and values; at most %d are allowed", total, maxEnvTotalBytes)
	}
	return maps.Clone(env), nil
}

func boundedSeconds(field string, v *int64, def, max time.Duration) (time.Duration, error) {
	if v == nil {
		return def, nil
	}
	d := time.Duration(*v) * time.Second
	if *v < 1 || d > max || *v > int64(max/time.Second) {
		return 0, Invalidf("%s must be between 1 and %d", field, int64(max/time.Second))
	}
	return d, nil
}

func boundedQuantity(field, v, def, min, max string) (resource.Quantity, error) {
	if v == "" {
		return resource.MustParse(def), nil
	}
	// Only plain quantities: a scientific exponent such as 1E99999999 makes
	// the comparison below run for a minute (found by fuzzing).
	if !quantityPattern.MatchString(v) {
		return resource.Quantity{}, Invalidf("%s %q must be a plain quantity such as 500m, 2 or 4Gi", field, Truncate(v))
	}
	q, err := resource.ParseQuantity(v)
	lo, hi := resource.MustParse(min), resource.MustParse(max)
	if err != nil || q.Cmp(lo) < 0 || q.Cmp(hi) > 0 {
		return resource.Quantity{}, Invalidf("%s %q must be a quantity between %s and %s", field, Truncate(v), min, max)
	}
	return q, nil
}

// validateMounts enforces DeerFlow's rules: at most ten, host paths absolute,
// clean and under the DeerFlow base directory, container paths from the
// allow-list, and no container path twice. A host path inside DeerFlow's
// per-user or per-thread layout must belong to the requesting user and thread.
func validateMounts(cfg config.Objects, in []ExtraMount, user, thread string) ([]Mount, error) {
	if len(in) > maxExtraMounts {
		return nil, Invalidf("extra_mounts has %d entries; at most %d are allowed", len(in), maxExtraMounts)
	}
	base := cfg.HostBaseDir
	out := make([]Mount, 0, len(in))
	seen := map[string]bool{}
	for i, m := range in {
		where := fmt.Sprintf("extra_mounts[%d]", i)
		hp := m.HostPath
		switch {
		case hp == "":
			return nil, Invalidf("%s.host_path is required", where)
		case !path.IsAbs(hp):
			return nil, Invalidf("%s.host_path %q must be absolute", where, Truncate(hp))
		case strings.ContainsAny(hp, "\x00\\:") || hasDotSegment(hp) || path.Clean(hp) != hp:
			return nil, Invalidf("%s.host_path %q must be a clean path without '.', '..', '\\' or ':'", where, Truncate(hp))
		case hp != base && !strings.HasPrefix(hp, base+"/") || hp == base:
			return nil, Invalidf("%s.host_path %q must lie under %s", where, Truncate(hp), base)
		}
		if root := heldRoot(cfg, hp); root != "" {
			return nil, Invalidf("%s.host_path %q holds %s, where every tenant's data is; a sandbox may mount only its own user's and thread's data", where, Truncate(hp), root)
		}
		if owner := foreignOwner(cfg, hp, user, thread); owner != "" {
			return nil, Invalidf("%s.host_path %q lies outside the requesting %s's directory; a sandbox may mount only its own user's and thread's data", where, Truncate(hp), owner)
		}
		cp := m.ContainerPath
		if !slices.Contains(config.AllowedExtraMountPaths, cp) {
			return nil, Invalidf("%s.container_path %q is not allowed; use one of %s", where, Truncate(cp), strings.Join(config.AllowedExtraMountPaths, ", "))
		}
		if seen[cp] {
			return nil, Invalidf("%s.container_path %q appears twice", where, cp)
		}
		seen[cp] = true
		ro := true
		if m.ReadOnly != nil {
			ro = *m.ReadOnly
		}
		out = append(out, Mount{HostPath: hp, ContainerPath: cp, ReadOnly: ro})
	}
	return out, nil
}

// TenantRoots are the host directories that hold every tenant's trees, one
// tree per user or thread below each: <base>/users, THREADS_HOST_PATH, and
// SKILLS_HOST_PATH when set (start-up refuses it, but a root it would be).
func TenantRoots(cfg config.Objects) []string {
	roots := []string{path.Join(cfg.HostBaseDir, "users"), cfg.ThreadsHostPath}
	if cfg.SkillsHostPath != "" {
		roots = append(roots, cfg.SkillsHostPath)
	}
	return roots
}

// heldRoot is the tenant root (TenantRoots) that hp is a parent of, or "".
// foreignOwner judges the roots themselves and what lies below them, but
// not what lies above: THREADS_HOST_PATH may be nested below the base
// (<base>/data/threads), and a mount of <base>/data would hold every
// thread's tree. The admission policy refuses it too; this answers 422
// before anything is written, naming the entry.
func heldRoot(cfg config.Objects, hp string) string {
	for _, root := range TenantRoots(cfg) {
		if strings.HasPrefix(root, hp+"/") {
			return root
		}
	}
	return ""
}

// foreignOwner says which of "user" or "thread" hp belongs to another of,
// in DeerFlow's layout: <base>/users/<user>/..., <base>/users/<user>/threads/
// <thread>/..., and <THREADS_HOST_PATH>/<thread>/.... A path that stops at a
// directory holding everyone's data (<base>/users) counts as foreign too.
func foreignOwner(cfg config.Objects, hp, user, thread string) string {
	if rest, ok := strings.CutPrefix(hp, cfg.ThreadsHostPath+"/"); ok || hp == cfg.ThreadsHostPath {
		if seg := strings.Split(rest, "/"); seg[0] != thread {
			return "thread"
		}
		return ""
	}
	rest, ok := strings.CutPrefix(hp, cfg.HostBaseDir+"/users")
	if !ok || (rest != "" && rest[0] != '/') {
		return ""
	}
	seg := strings.Split(strings.TrimPrefix(rest, "/"), "/")
	switch {
	case seg[0] != user:
		return "user"
	case len(seg) >= 2 && seg[1] == "threads" && (len(seg) < 3 || seg[2] != thread):
		return "thread"
	}
	return ""
}

func hasDotSegment(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// Truncate keeps error messages short when a client sends a huge value.
func Truncate(s string) string {
	const max = 80
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

// CheckEnvAgainstTemplate refuses a request env entry that the template's
// sandbox container sets in its env: the operator's value (a proxy, a
// licence server) is not the request's to replace. Names a template loads
// through envFrom cannot be known here; Kubernetes lets env win over them,
// so a template that must pin a variable lists it under env.
func CheckEnvAgainstTemplate(t *template.Template, env map[string]string) error {
	for _, c := range t.Pod.Spec.Containers {
		if c.Name != template.ContainerName {
			continue
		}
		for _, e := range c.Env {
			if _, ok := env[e.Name]; ok {
				return Invalidf("env.%s is set by sandbox template %q and cannot be replaced by a request; choose another name", e.Name, t.Name)
			}
		}
	}
	return nil
}
