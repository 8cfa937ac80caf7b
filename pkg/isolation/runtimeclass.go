package isolation

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

// checkRuntimeClass reads the RuntimeClass that SANDBOX_RUNTIME_CLASS names
// and records the verdict. A Pod naming a class that does not exist is
// refused by the API server anyway; the check is here so that the function
// says so at start-up and a create is answered with the setting to fix,
// not with the API server's words. It never falls back to the node's
// default runtime. A failure to read is transient and not recorded.
func (c *Checker) checkRuntimeClass(ctx context.Context) error {
	rc, err := c.client.NodeV1().RuntimeClasses().Get(ctx, c.runtimeClass, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		verdict := &api.Error{Kind: api.KindUnavailable, Err: err, Detail: fmt.Sprintf(
			"the RuntimeClass %q that SANDBOX_RUNTIME_CLASS names does not exist, so no sandbox is created (none falls back to the node's own kernel); "+
				"install it (for gVisor: config/node/runtimeclass-gvisor.yaml on nodes with runsc), or set SANDBOX_RUNTIME_CLASS to a class the cluster has, or to \"\" to run sandboxes under the default runtime",
			c.runtimeClass)}
		c.runtime.store(verdict, "")
		c.report(CheckRuntimeClass, verdict)
		return verdict
	}
	if err != nil {
		return api.Classify(err, "read the RuntimeClass that SANDBOX_RUNTIME_CLASS names")
	}
	var verdict error
	if c.userNS && rc.Handler == GVisorHandler {
		// runsc's gofer cannot join the user namespace the kubelet made
		// for a hostUsers: false Pod (setns: invalid argument): every such
		// sandbox would stay Pending. Refuse creates, naming the settings,
		// rather than make Pods that never run or drop the user namespace
		// unasked (docs/security.md says why gVisor without one is the
		// stronger choice).
		verdict = &api.Error{Kind: api.KindUnavailable, Detail: fmt.Sprintf(
			"SANDBOX_USER_NAMESPACE=true (hostUsers: false) cannot run under the RuntimeClass %q, whose handler is gVisor's %s: its sandboxes would never start; "+
				"set SANDBOX_USER_NAMESPACE=false (and userNamespace: \"false\" in the admission parameters), as config/ does for gVisor", c.runtimeClass, rc.Handler)}
	}
	c.runtime.store(verdict, rc.ResourceVersion)
	c.report(CheckRuntimeClass, verdict)
	return verdict
}

// GVisorHandler is the container runtime handler of gVisor's runsc, as
// containerd registers it (and config/node/runtimeclass-gvisor.yaml names).
const GVisorHandler = "runsc"
