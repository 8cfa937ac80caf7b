package resources

import (
	"encoding/json"
	"net"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/status"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// View joins what exists of a sandbox (its bare or current Pod, its
// ReplicaSet, its Service; nil when absent) into the Sandbox answered for it.
func View(cfg config.Objects, id string, pod *corev1.Pod, rs *appsv1.ReplicaSet, svc *corev1.Service) api.Sandbox {
	sb := api.Sandbox{ID: id, Status: api.StatusNotFound}
	if svc != nil {
		sb.URL = URL(cfg, svc)
	} else {
		sb.Missing = append(sb.Missing, "service")
	}
	var w metav1.Object
	switch {
	case rs != nil:
		w = rs
	case pod != nil:
		w = pod
	}
	if w != nil {
		if n, err := strconv.Atoi(w.GetAnnotations()[keys.AnnotationMaxShellSessions]); err == nil {
			sb.MaxShellSessions = &n
		}
		sb.ExpiresAt = w.GetAnnotations()[keys.AnnotationExpiresAt]
		a := w.GetAnnotations()
		sb.Template, sb.CreatedAt, sb.Principal = a[keys.AnnotationTemplate], a[keys.AnnotationCreatedAt], api.PrincipalOf(w)
		sb.Metadata = Metadata(w)
		sb.Envd = w.GetLabels()[keys.LabelEnvd] == "true"
		if rs != nil {
			sb.Envd = rs.Spec.Template.Labels[keys.LabelEnvd] == "true"
			sb.Pauses = a[keys.AnnotationIdleAction] == template.IdlePause
		}
	}
	switch {
	case rs != nil && Paused(rs):
		sb.Status = api.StatusPaused
		return sb
	case rs != nil && pod == nil:
		// The ReplicaSet is (re)creating its Pod.
		sb.Status = string(corev1.PodPending)
		return sb
	case pod == nil:
		sb.Missing = append(sb.Missing, "pod")
		return sb
	}
	sb.Pooled = pod.Labels[keys.LabelPooled] == "true"
	sb.Status = string(pod.Status.Phase)
	if sb.Status == "" {
		sb.Status = string(corev1.PodPending)
	}
	sb.Ready = status.Ready(pod) && svc != nil
	// A Pod that DeerFlow cannot reach is not alive to it: without a Service
	// it reports Pending, so the backend's next create repairs it.
	if svc == nil && sb.Status == string(corev1.PodRunning) {
		sb.Status = string(corev1.PodPending)
	}
	return sb
}

// URL is how the agent backend reaches the sandbox of svc: the node port
// on NODE_HOST, or the Service's cluster DNS name.
func URL(cfg config.Objects, svc *corev1.Service) string {
	if svc.Spec.Type == corev1.ServiceTypeNodePort {
		for _, p := range svc.Spec.Ports {
			if p.NodePort != 0 {
				return "http://" + joinHostPort(cfg.NodeHost, p.NodePort)
			}
		}
		return ""
	}
	return "http://" + joinHostPort(svc.Name+"."+svc.Namespace+".svc.cluster.local", cfg.ContainerPort)
}

func joinHostPort(host string, port int32) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// EgressView is the egress of the sandbox whose workload is w and whose
// Service is svc (either may be nil), at now: the mode its workload's
// label records (a sandbox from before modes has the deployment's default),
// and, in allowlist mode, the list and the live grants its Service holds,
// which the egress proxy judges by.
func EgressView(cfg config.Objects, w metav1.Object, svc *corev1.Service, now time.Time) *api.EgressView {
	var labels map[string]string
	switch {
	case w != nil:
		labels = w.GetLabels()
	case svc != nil:
		labels = svc.Labels
	}
	mode, err := egress.ParseMode(labels[keys.LabelEgress])
	if err != nil || labels[keys.LabelEgress] == "" {
		mode = cfg.DefaultEgress()
	}
	v := &api.EgressView{Mode: mode, Allow: []string{}}
	if mode != egress.Allowlist || svc == nil {
		return v
	}
	if names, err := egress.ParseNames(svc.Annotations[keys.AnnotationEgressAllow]); err == nil {
		v.Allow = names
	}
	grants, _ := egress.DecodeGrants(svc.Annotations[keys.AnnotationEgressGrants])
	for _, g := range grants {
		if g.Live(now) {
			v.Grants = append(v.Grants, g)
		}
	}
	return v
}

// Metadata is an E2B sandbox's metadata as its workload records it (nil:
// none, or a value that is not a JSON object of strings, which only a hand
// edit makes).
func Metadata(w metav1.Object) map[string]string {
	raw := w.GetAnnotations()[keys.AnnotationMetadata]
	if raw == "" {
		return nil
	}
	var m map[string]string
	if json.Unmarshal([]byte(raw), &m) != nil {
		return nil
	}
	return m
}
