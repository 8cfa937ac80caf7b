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
	c.runtime.store(nil, rc.ResourceVersion)
	c.report(CheckRuntimeClass, nil)
	return nil
}
