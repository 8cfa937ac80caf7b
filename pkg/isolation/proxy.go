package isolation

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

// CheckEgressProxy is the check, as Report names it, that the egress proxy
// allowlist sandboxes go through has an address.
const CheckEgressProxy = "egress_proxy"

// proxyCheck keeps the last verdict on the egress proxy's Service, and the
// address it gave.
type proxyCheck struct {
	v    verdict
	mu   sync.Mutex
	addr string // host:port, set with a nil verdict
}

func (p *proxyCheck) address() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// proxyChecks is the check an allowlist create adds: its sandbox is
// given the proxy's ClusterIP (it has no DNS, so no name would do), so a
// proxy without one, or without the port, refuses the create rather than
// making a sandbox that reaches nothing. That the proxy's Pods are up is
// not judged: while they are down, an allowlist sandbox reaches nothing
// (fail closed), and reaches its names once they are back.
func (c *Checker) proxyChecks() []check {
	return []check{{&c.proxy.v, "check the egress proxy's Service", c.checkProxy}}
}

func (c *Checker) checkProxy(ctx context.Context) error {
	name := c.namespace + "/" + c.cfg.EgressProxyService
	svc, err := c.client.CoreV1().Services(c.namespace).Get(ctx, c.cfg.EgressProxyService, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil && !apierrors.IsNotFound(err) {
		return api.Classify(err, "check the egress proxy's Service "+name)
	}
	addr, verdict := "", error(nil)
	if err == nil {
		addr, verdict = proxyAddress(svc, c.cfg.EgressProxyPort)
	} else {
		verdict = fmt.Errorf("it does not exist")
	}
	if verdict != nil {
		verdict = &api.Error{Kind: api.KindUnavailable, Err: verdict, Detail: fmt.Sprintf("the egress proxy's Service %s cannot be used (%v), so no allowlist sandbox is created; "+
			"apply config/300-egress-proxy.yaml, or set SANDBOX_EGRESS_PROXY_SERVICE and SANDBOX_EGRESS_PROXY_PORT to the proxy's", name, verdict)}
	}
	c.proxy.mu.Lock()
	c.proxy.addr = addr
	c.proxy.mu.Unlock()
	c.proxy.v.store(verdict, "")
	c.report(CheckEgressProxy, verdict)
	return verdict
}

// proxyAddress is the ClusterIP and port by which a sandbox reaches the
// proxy's Service.
func proxyAddress(svc *corev1.Service, port int32) (string, error) {
	ip := svc.Spec.ClusterIP
	if ip == "" || ip == corev1.ClusterIPNone {
		return "", fmt.Errorf("it has no ClusterIP")
	}
	for _, p := range svc.Spec.Ports {
		if p.Port == port && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
			return net.JoinHostPort(ip, strconv.Itoa(int(port))), nil
		}
	}
	return "", fmt.Errorf("it has no TCP port %d", port)
}
