package kube

import "k8s.io/apimachinery/pkg/api/meta"

// StripManagedFields is an informer transform (informers.WithTransform)
// that drops each object's managedFields before the cache stores it:
// nothing here reads them, and on a sandbox's small Pod or Service they
// are a large part of what a cache of thousands holds. What is not an
// object (a deletion's tombstone) passes unchanged.
func StripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
