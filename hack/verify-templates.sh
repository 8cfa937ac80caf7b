#!/usr/bin/env bash
# Validates the sandbox templates under config/templates offline, with the
# provisioner's own checks (cmd/check-templates).
set -euo pipefail
cd "$(dirname "$0")/.."
go run ./cmd/check-templates config/templates
