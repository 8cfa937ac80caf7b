// Package envd is an agent wire-compatible with E2B's envd, so the
// unmodified e2b SDK drives a sandbox through it: the process and
// filesystem Connect services (connect-go; the Connect, gRPC and gRPC-Web
// protocols, JSON or binary, over HTTP/1.1 or h2c) and the HTTP endpoints
// /files (upload and download) and /health, on port 49983 inside the
// sandbox.
//
// It runs as the image's own user and checks every call but /health for
// the sandbox's envd access token (X-Access-Token), of which it holds only
// the SHA-256 (ENVD_ACCESS_TOKEN_SHA256, pkg/access): with none configured,
// it refuses every call.
//
// Pseudo-terminals (sandbox.pty) are real terminals (github.com/creack/pty):
// a size, typed input, resize, reattach and kill, the output streamed as pty
// data.
//
// What it does not do (and Version is chosen so that the SDK does not ask):
// file metadata
// (envd 0.6.2), entries in watch events and watches of network mounts
// (0.6.3, 0.6.4), and the check of signed /files URLs (downloadUrl,
// uploadUrl), whose signature needs the token itself: the router checks it
// and hands the agent the token.
package envd
