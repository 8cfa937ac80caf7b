//go:build tools

// Package kube pins the control-plane commands, kubectl, and the real
// node's kubelet and kube-proxy so that go mod tidy keeps their
// dependencies; hack/install-kube.sh builds them by import path.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
