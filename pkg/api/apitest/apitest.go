// Package apitest holds the request fixture the packages' tests share.
package apitest

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

// Created is the fixed creation time of Spec.
var Created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Spec is a valid spec of sandbox 0123456789abcdef, as the door validates
// it: the tests start from it, and the builders' tests pin the objects it
// makes.
func Spec() api.Spec {
	return api.Spec{
		ID: "0123456789abcdef", ThreadID: "t1", UserID: "user-1",
		IdleTimeout: time.Hour, MaxLifetime: 24 * time.Hour,
		CPULimit: resource.MustParse("1"), MemoryLimit: resource.MustParse("1Gi"),
		Now: Created,
	}
}
