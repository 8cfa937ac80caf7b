package sandbox

import (
	"log/slog"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/isolation"
)

// isolationVerdict reports an isolation check's verdict: the metric always,
// and, when the verdict changes (m.failing), the log and a Kubernetes Event,
// not on every create that is refused meanwhile. The Event
// is about the shared NetworkPolicy (the namespace's isolation object): an
// Event about a cluster-scoped RuntimeClass would land in another namespace.
func (m *Manager) isolationVerdict(check string, err error) {
	m.observer.Isolation(check, err == nil)
	policy := &networkingv1.NetworkPolicy{TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: m.cfg.NetworkPolicyName, Namespace: m.cfg.Namespace}}
	reason := map[string]string{isolation.CheckNetworkPolicy: "NetworkPolicyNotInForce", isolation.CheckRuntimeClass: "RuntimeClassMissing", isolation.CheckIngress: "IngressPolicyNotInForce"}[check]
	if err != nil {
		if _, was := m.failing.LoadOrStore(check, struct{}{}); !was {
			slog.Error("sandboxes will not be created until they can be isolated", "check", check, "error", api.DetailOf(err))
			m.recorder.Eventf(policy, corev1.EventTypeWarning, reason, "%s", api.DetailOf(err))
		}
		return
	}
	if _, was := m.failing.LoadAndDelete(check); was {
		slog.Info("sandbox isolation is in force again; creates resume", "check", check)
		m.recorder.Eventf(policy, corev1.EventTypeNormal, "IsolationInForce", "%s is in force again; sandboxes are created", check)
	}
}
