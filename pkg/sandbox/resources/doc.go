// Package resources builds a sandbox's objects and names them: pure
// functions of the object settings (config.Objects) and a request
// (api.Spec), with no context, no client and no I/O (hack/verify-layout.sh
// checks), so that the builder tests pin them. docs/architecture.md
// describes these objects, who owns what, the order a create writes them
// in, and the chain checks (chain.go) that every reader runs; its glossary
// defines slot, token, wire and reference.
package resources
