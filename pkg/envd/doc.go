// Package envd is an agent wire-compatible with E2B's envd: the process and
// filesystem Connect services and the HTTP /files and /health endpoints the
// e2b SDK calls on port 49983 inside a sandbox.
package envd
