#!/usr/bin/env bash
# Generates the Go code of the envd agent's protos (pkg/envd/proto, the
# wire of E2B's envd as the e2b SDK speaks it) into pkg/envd/gen:
# messages with protoc-gen-go, Connect handlers and clients with
# protoc-gen-connect-go, both at the versions go.mod pins, so the generated
# code always matches the runtime libraries it is compiled against. The
# generated code is committed (it is source); hack/verify-codegen.sh checks
# that it is up to date.
#
#   hack/update-codegen.sh            regenerate into the repository
#   CODEGEN_OUT=DIR hack/update-codegen.sh
#                                     generate into DIR instead (verify)
#
# It installs what it needs: protoc (apt's protobuf-compiler and
# libprotobuf-dev, for google/protobuf/timestamp.proto) if missing, and
# the two plugins with `go install` into a cache outside the repository.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

module=$(go list -m)
out=${CODEGEN_OUT:-$REPO_ROOT}
proto_dir=pkg/envd/proto

as_root() { if [[ $(id -u) == 0 ]]; then "$@"; else sudo "$@"; fi; }

# protoc and the well-known types' .proto files. The include directory is
# asked of protoc's own installation (apt puts them in /usr/include).
include=${PROTOC_INCLUDE:-/usr/include}
if ! command -v protoc >/dev/null || [[ ! -f "$include/google/protobuf/timestamp.proto" ]]; then
  log "installing protoc (apt: protobuf-compiler libprotobuf-dev)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler libprotobuf-dev >/dev/null
fi
[[ -f "$include/google/protobuf/timestamp.proto" ]] ||
  die "google/protobuf/timestamp.proto is not under $include; set PROTOC_INCLUDE to protoc's include directory"

# The plugins, at the versions of the runtime libraries in go.mod.
pb_version=$(go list -m -f '{{.Version}}' google.golang.org/protobuf)
connect_version=$(go list -m -f '{{.Version}}' connectrpc.com/connect)
tools="$CACHE_DIR/tools/protoc-gen-go-$pb_version-connect-$connect_version"
if [[ ! -x "$tools/protoc-gen-go" || ! -x "$tools/protoc-gen-connect-go" ]]; then
  log "installing protoc-gen-go $pb_version and protoc-gen-connect-go $connect_version into $tools"
  mkdir -p "$tools"
  GOBIN="$tools" GOFLAGS=-mod=mod go install "google.golang.org/protobuf/cmd/protoc-gen-go@$pb_version"
  GOBIN="$tools" GOFLAGS=-mod=mod go install "connectrpc.com/connect/cmd/protoc-gen-connect-go@$connect_version"
fi

mapfile -t protos < <(cd "$proto_dir" && find . -name '*.proto' | sed 's|^\./||' | sort)
(( ${#protos[@]} > 0 )) || die "no .proto files under $proto_dir"
mkdir -p "$out"
# Old outputs go first, so a removed .proto leaves no stale code behind.
[[ "$out" != "$REPO_ROOT" ]] || rm -rf pkg/envd/gen
# The files are named relative to $proto_dir (process/process.proto), as
# the SDK's descriptors name them: the names are part of what a test
# compares.
PATH="$tools:$PATH" protoc -I "$proto_dir" -I "$include" \
  --go_out="$out" --go_opt=module="$module" \
  --connect-go_out="$out" --connect-go_opt=module="$module" \
  "${protos[@]}"
log "generated Go for ${protos[*]} into $out/pkg/envd/gen"
