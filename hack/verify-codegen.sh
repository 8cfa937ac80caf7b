#!/usr/bin/env bash
# Checks that pkg/envd/gen is what hack/update-codegen.sh makes of
# pkg/envd/proto: it generates into a temporary directory and compares.
# The one line that names protoc's version is left out of the comparison,
# so another protoc release (the same wire) does not fail it.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
CODEGEN_OUT="$work" "$REPO_ROOT/hack/update-codegen.sh"
strip() { mkdir -p "$2" && (cd "$1" && find . -type f) | while read -r f; do
  mkdir -p "$2/$(dirname "$f")"; grep -v '^// 	protoc  *v' "$1/$f" > "$2/$f" || true; done; }
strip "$work/pkg/envd/gen" "$work/want"
strip pkg/envd/gen "$work/have"
if ! diff -ru "$work/have" "$work/want"; then
  die "pkg/envd/gen is out of date: run hack/update-codegen.sh"
fi
log "pkg/envd/gen matches pkg/envd/proto"
