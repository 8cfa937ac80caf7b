package resources

import (
	"crypto/sha256"
	"encoding/hex"
	"path"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// Container paths of the built-in mounts and of DeerFlow's Lark CLI
// integration (its provisioner's constants, same values).
const (
	mountSkills       = "/mnt/skills"
	mountSkillsPublic = "/mnt/skills/public"
	mountSkillsCustom = "/mnt/skills/custom"
	mountSkillsLegacy = "/mnt/skills/legacy"
	mountUserData     = "/mnt/user-data"
	mountLarkRuntime  = "/mnt/integrations/lark-cli/runtime"
	mountLarkConfig   = "/mnt/integrations/lark-cli/config"
	mountLarkLocks    = "/mnt/integrations/lark-cli/config/locks"
	mountLarkData     = "/mnt/integrations/lark-cli/data"

	// Where the broker sidecar reads the user's Lark credentials, and where
	// the sandbox's shim reaches it.
	brokerConfigDir = "/var/lark/config"
	brokerLocksDir  = "/var/lark/config/locks"
	brokerDataDir   = "/var/lark/data"
	brokerURL       = "http://127.0.0.1:8788"

	// claimPrefix is the directory on DeerFlow's user-data claim that holds
	// what lies under DEER_FLOW_HOST_BASE_DIR in host-path mode.
	claimPrefix = "deer-flow"
)

// Volume names the provisioner adds. Host-path volumes all start with
// template.ReservedVolumePrefix, which templates may not use.
const (
	hostUserVolume    = template.ReservedVolumePrefix + "user"
	hostThreadVolume  = template.ReservedVolumePrefix + "thread"
	skillsVolume      = "skills"
	userDataVolume    = "user-data"
	larkRuntimeVolume = "lark-cli-runtime"
)

// mountEntry is one volume at one container path.
type mountEntry struct {
	path     string
	volume   corev1.Volume
	subPath  string
	readOnly bool
}

// mountTable keeps one entry per container path, in insertion order. Keying
// by container path is what makes duplicates impossible: DeerFlow always
// sends /mnt/skills/custom as an extra mount, which DeerFlow's own
// provisioner then mounts twice (and the API server rejects the Pod); here
// the extra one replaces the built-in one, which in DeerFlow's layout is the
// same directory.
type mountTable []mountEntry

func (t *mountTable) set(e mountEntry) {
	for i := range *t {
		if (*t)[i].path == e.path {
			(*t)[i] = e
			return
		}
	}
	*t = append(*t, e)
}

// apply writes the table into a container and adds its volumes to the Pod
// (each volume once, whichever container names it first).
func (t mountTable) apply(spec *corev1.PodSpec, c *corev1.Container) {
	for _, m := range t {
		if !hasVolume(spec.Volumes, m.volume.Name) {
			spec.Volumes = append(spec.Volumes, m.volume)
		}
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{
			Name: m.volume.Name, MountPath: m.path, SubPath: m.subPath, ReadOnly: m.readOnly,
		})
	}
}

func hasVolume(vs []corev1.Volume, name string) bool {
	for _, v := range vs {
		if v.Name == name {
			return true
		}
	}
	return false
}

// sandboxMounts is what the sandbox container mounts, by DeerFlow's rules
// (its provisioner's _build_volumes and _build_volume_mounts):
//   - skills: with SKILLS_PVC_NAME, the skills claim once at /mnt/skills,
//     read-only, at SKILLS_PVC_SUBPATH_TEMPLATE when set; otherwise the
//     public, the user's custom and the user's legacy skills, always all
//     three (include_legacy_skills changes nothing), read-only;
//   - user data: with USERDATA_PVC_NAME the claim at
//     deer-flow/users/<user>/threads/<thread>/user-data, otherwise
//     THREADS_HOST_PATH/<thread>/user-data;
//   - extra mounts, less those the Lark init container or broker provide;
//   - the Lark runtime emptyDir, read-only, when either is on.
func sandboxMounts(cfg *config.DeerFlowConfig, s api.Spec) mountTable {
	var t mountTable
	if s.Resolved == nil || s.Resolved.DeerFlowMounts {
		if cfg.SkillsPVCName != "" {
			t.set(mountEntry{path: mountSkills, volume: pvcVolume(skillsVolume, cfg.SkillsPVCName, true),
				subPath: skillsClaimSubPath(cfg, s), readOnly: true})
		} else {
			base := cfg.HostBaseDir
			t.set(hostEntry(cfg, mountSkillsPublic, path.Join(base, "skills_view", "public"), true))
			t.set(hostEntry(cfg, mountSkillsCustom, path.Join(base, "users", s.UserID, "skills_view", "custom"), true))
			t.set(hostEntry(cfg, mountSkillsLegacy, path.Join(base, "users", s.UserID, "skills_view", "legacy"), true))
		}
		if cfg.UserdataPVCName != "" {
			t.set(mountEntry{path: mountUserData, volume: pvcVolume(userDataVolume, cfg.UserdataPVCName, false),
				subPath: path.Join(claimPrefix, "users", s.UserID, "threads", s.ThreadID, "user-data")})
		} else {
			t.set(hostEntry(cfg, mountUserData, path.Join(cfg.ThreadsHostPath, s.ThreadID, "user-data"), false))
		}
	}
	dropped := larkSuperseded(s)
	for _, m := range s.Mounts {
		if !dropped[m.ContainerPath] {
			t.set(extraEntry(cfg, m.ContainerPath, m))
		}
	}
	if s.LarkCLIRuntime || s.LarkCLIBroker {
		t.set(mountEntry{path: mountLarkRuntime, volume: emptyDirVolume(larkRuntimeVolume), readOnly: true})
	}
	return t
}

// larkSuperseded are the extra mounts the Lark containers replace: the
// broker holds the runtime shim and every credential directory (so the
// sandbox never sees plaintext credentials); the init container only the
// runtime.
func larkSuperseded(s api.Spec) map[string]bool {
	switch {
	case s.LarkCLIBroker:
		return map[string]bool{mountLarkRuntime: true, mountLarkConfig: true, mountLarkLocks: true, mountLarkData: true}
	case s.LarkCLIRuntime:
		return map[string]bool{mountLarkRuntime: true}
	}
	return nil
}

// brokerMounts are the broker sidecar's: the credential extra mounts the
// request carried, at the sidecar's own paths.
func brokerMounts(cfg *config.DeerFlowConfig, s api.Spec) mountTable {
	var t mountTable
	for _, p := range []struct{ from, to string }{
		{mountLarkConfig, brokerConfigDir}, {mountLarkLocks, brokerLocksDir}, {mountLarkData, brokerDataDir},
	} {
		for _, m := range s.Mounts {
			if m.ContainerPath == p.from {
				t.set(extraEntry(cfg, p.to, m))
			}
		}
	}
	return t
}

// extraEntry mounts an extra mount's host path at container path at: in
// PVC mode from the user-data claim at deer-flow/<path under the base>, as
// DeerFlow does; otherwise from the node. A path outside the requester's
// own tree is shared with other tenants and is read-only whatever the
// request says.
func extraEntry(cfg *config.DeerFlowConfig, at string, m api.Mount) mountEntry {
	readOnly := m.ReadOnly || hostRootOf(cfg, m.HostPath).shared
	if cfg.UserdataPVCName != "" {
		return mountEntry{path: at, volume: pvcVolume(userDataVolume, cfg.UserdataPVCName, false),
			subPath: claimSubPath(cfg, m.HostPath), readOnly: readOnly}
	}
	e := hostEntry(cfg, at, m.HostPath, readOnly)
	return e
}

// claimSubPath is DeerFlow's _extra_mount_pvc_sub_path: the host path's
// place under the base, below deer-flow/ on the claim.
func claimSubPath(cfg *config.DeerFlowConfig, hostPath string) string {
	return path.Join(claimPrefix, strings.TrimPrefix(hostPath, cfg.HostBaseDir+"/"))
}

// skillsClaimSubPath formats SKILLS_PVC_SUBPATH_TEMPLATE as DeerFlow does
// (str.format with user_id and thread_id); empty mounts the whole claim.
func skillsClaimSubPath(cfg *config.DeerFlowConfig, s api.Spec) string {
	return strings.NewReplacer("{user_id}", s.UserID, "{thread_id}", s.ThreadID).Replace(cfg.SkillsPVCSubpathTemplate)
}

// hostRoot is the hostPath volume a host path is mounted from, and the path
// below it.
type hostRoot struct {
	volume corev1.Volume
	sub    string
	shared bool
}

// hostRootOf roots every host mount at the narrowest directory that holds
// it and that no sandbox can rename: the requester's thread directory
// (THREADS_HOST_PATH/<thread>), the requester's user directory
// (<base>/users/<user>), or, for everything else under the base (shared by
// every tenant and never writable by a sandbox), the base's child that holds
// it. The rest of the path is a subPath, which the kubelet resolves without
// leaving the volume: a link that alice plants in her data pointing at bob's
// tree (or at /) is refused, because the volume is alice's tree, not the
// base. Sandboxes write only below these roots (shared paths are read-only,
// and a mount of <base>/users or THREADS_HOST_PATH itself is refused), so no
// sandbox can replace a root with a link.
//
// The request's validation has already checked that user and thread paths
// are the requester's own.
func hostRootOf(cfg *config.DeerFlowConfig, hostPath string) hostRoot {
	if rest, ok := below(hostPath, cfg.ThreadsHostPath); ok {
		owner, sub, _ := strings.Cut(rest, "/")
		return hostRoot{volume: hostPathVolume(hostThreadVolume, path.Join(cfg.ThreadsHostPath, owner), corev1.HostPathDirectoryOrCreate), sub: sub}
	}
	users := path.Join(cfg.HostBaseDir, "users")
	if rest, ok := below(hostPath, users); ok {
		owner, sub, _ := strings.Cut(rest, "/")
		return hostRoot{volume: hostPathVolume(hostUserVolume, path.Join(users, owner), corev1.HostPathDirectoryOrCreate), sub: sub}
	}
	rest, _ := below(hostPath, cfg.HostBaseDir)
	top, sub, _ := strings.Cut(rest, "/")
	root := path.Join(cfg.HostBaseDir, top)
	return hostRoot{volume: hostPathVolume(sharedVolumeName(top, root), root, corev1.HostPathDirectory), sub: sub, shared: true}
}

func hostEntry(cfg *config.DeerFlowConfig, at, hostPath string, readOnly bool) mountEntry {
	r := hostRootOf(cfg, hostPath)
	return mountEntry{path: at, volume: r.volume, subPath: r.sub, readOnly: readOnly || r.shared}
}

// below returns p's path under dir ("a/b" for dir/a/b).
func below(p, dir string) (string, bool) {
	rest, ok := strings.CutPrefix(p, dir+"/")
	return rest, ok && rest != ""
}

var nonLabel = regexp.MustCompile(`[^a-z0-9]+`)

// sharedVolumeName names the volume of a shared root after its directory
// (skills_view: host-shared-skills-view-<hash>), with a hash of the root so
// that two directories that read alike never share a name.
func sharedVolumeName(top, root string) string {
	name := strings.Trim(nonLabel.ReplaceAllString(strings.ToLower(top), "-"), "-")
	if len(name) > 32 {
		name = strings.Trim(name[:32], "-")
	}
	sum := sha256.Sum256([]byte(root))
	if name == "" {
		return template.ReservedVolumePrefix + "shared-" + hex.EncodeToString(sum[:])[:8]
	}
	return template.ReservedVolumePrefix + "shared-" + name + "-" + hex.EncodeToString(sum[:])[:8]
}

// addLarkContainers adds DeerFlow's Lark CLI containers, when the operator
// configured their images and the request asked for them. The broker
// (pattern B) supersedes the init container (pattern A): its image installs
// a shim into the runtime directory, and its sidecar holds the user's
// credentials, which the sandbox container never mounts.
func addLarkContainers(cfg config.Objects, s api.Spec, pod *corev1.Pod) {
	none := []string{}
	runtimeRW := []corev1.VolumeMount{{Name: larkRuntimeVolume, MountPath: mountLarkRuntime}}
	runtimeEnv := []corev1.EnvVar{{Name: "LARK_CLI_RUNTIME_DEST", Value: mountLarkRuntime}}
	switch {
	case s.LarkCLIBroker:
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{
			Name: "lark-cli-shim-init", Image: cfg.LarkCLIBrokerImage, ImagePullPolicy: corev1.PullIfNotPresent,
			Args: []string{"install-shim", mountLarkRuntime}, Env: runtimeEnv,
			VolumeMounts: runtimeRW, SecurityContext: containerSecurityContext(cfg.PodSecurityConfig, none),
		})
	case s.LarkCLIRuntime:
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{
			Name: "lark-cli-init", Image: cfg.LarkCLIInitImage, ImagePullPolicy: corev1.PullIfNotPresent,
			Env: runtimeEnv, VolumeMounts: runtimeRW, SecurityContext: containerSecurityContext(cfg.PodSecurityConfig, none),
		})
	}
	if !s.LarkCLIBroker {
		return
	}
	env := []corev1.EnvVar{
		{Name: "LARKSUITE_CLI_CONFIG_DIR", Value: brokerConfigDir},
		{Name: "LARKSUITE_CLI_DATA_DIR", Value: brokerDataDir},
	}
	if cfg.LarkBrokerDenySubcommands != "" {
		env = append(env, corev1.EnvVar{Name: "DEERFLOW_LARK_BROKER_DENY_SUBCOMMANDS", Value: cfg.LarkBrokerDenySubcommands})
	}
	broker := corev1.Container{
		Name: "lark-cli-broker", Image: cfg.LarkCLIBrokerImage, ImagePullPolicy: corev1.PullIfNotPresent,
		Args: []string{"serve"}, Env: env, SecurityContext: containerSecurityContext(cfg.PodSecurityConfig, none),
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		},
	}
	brokerMounts(cfg.DeerFlowConfig, s).apply(&pod.Spec, &broker)
	pod.Spec.Containers = append(pod.Spec.Containers, broker)
	sb := &pod.Spec.Containers[0]
	sb.Env = append(sb.Env, corev1.EnvVar{Name: "DEERFLOW_LARK_BROKER_URL", Value: brokerURL})
}

func hostPathVolume(name, p string, t corev1.HostPathType) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p, Type: ptr.To(t)}}}
}

func pvcVolume(name, claim string, readOnly bool) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
		ClaimName: claim, ReadOnly: readOnly,
	}}}
}

func emptyDirVolume(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
}
