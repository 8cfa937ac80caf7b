// Package node holds the files operators install on, or for, the nodes that
// run sandboxes: the nftables node guard (sandbox-node-guard.nft) and the
// RuntimeClass for gVisor (runtimeclass-gvisor.yaml). Neither is part of
// config/kustomization.yaml. The RuntimeClass is embedded here so that the
// test framework's real node applies the very file operators are told to
// apply.
package node

import _ "embed"

// RuntimeClassGVisor is runtimeclass-gvisor.yaml: RuntimeClass gvisor, handler runsc.
//
//go:embed runtimeclass-gvisor.yaml
var RuntimeClassGVisor []byte
