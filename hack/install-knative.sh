#!/usr/bin/env bash
# Builds real Knative for the real node from the Go module proxy (nothing can
# be pulled from an image registry here): Knative Serving, Knative Eventing
# (core, the multi-tenant channel-based Broker, the in-memory channel, the
# PingSource adapter), Traefik (its Knative provider is the KIngress) and
# CoreDNS (cluster DNS). Each project is one wrapper module under hack/tools
# and one go build, so the packages its commands share compile once. The
# binaries are cached outside the repository, keyed by version, and each is
# packed into a single-binary image archive (test/images/mkimage) that
# containerd on the real node imports. A warm cache returns at once.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export CGO_ENABLED=0
mkdir -p "$KNATIVE_BIN_DIR" "$KNATIVE_IMAGES_DIR"
# One build at a time: make test starts one in the background (hack/test.sh),
# and its Knative tier's own call waits here, then finds everything built.
exec 9>"$KNATIVE_BIN_DIR/.lock"
flock 9

# build MODULE_DIR VERSION_TAG [GO_BUILD_FLAG...] -- PKG... builds the packages
# into $KNATIVE_BIN_DIR/<tag>/<last path element>, unless all are there.
build() {
  local mod=$1 tag=$2 flags=(); shift 2
  while [[ $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  local dir="$KNATIVE_BIN_DIR/$tag" missing=() p
  for p in "$@"; do [[ -x "$dir/${p##*/}" ]] || missing+=("$p"); done
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "$tag cached in $dir"
    return
  fi
  mkdir -p "$dir"
  local tmp
  tmp=$(mktemp -d "$dir/.build-XXXXXX")
  log "building $tag: ${missing[*]##*/} (minutes on 2 cores the first time)"
  (cd "$REPO_ROOT/hack/tools/$mod" && retrying run_with_progress "$tag" go build -trimpath -ldflags "-s -w" "${flags[@]}" -o "$tmp/" "${missing[@]}")
  for p in "${missing[@]}"; do mv "$tmp/${p##*/}" "$dir/${p##*/}"; done
  rm -rf "$tmp"
}

serving=(activator autoscaler controller queue webhook)
eventing=(controller webhook mtchannel_broker broker/ingress broker/filter
  in_memory/channel_controller in_memory/channel_dispatcher mtping)
build_serving() { build knative-serving "serving-$KNATIVE_SERVING_VERSION" -- "${serving[@]/#/knative.dev/serving/cmd/}"; }
build_eventing() { build knative-eventing "eventing-$KNATIVE_EVENTING_VERSION" -- "${eventing[@]/#/knative.dev/eventing/cmd/}"; }
# CoreDNS with the Corefile's plugins alone (hack/tools/coredns/main.go).
build_coredns() { build coredns "$COREDNS_TAG" -- sandbox-provisioner/hack/tools/coredns; }
# Traefik without lego's DNS-01 providers: a copy of lego's module whose
# providers/dns is hack/tools/traefik/legodns, put in place by a replace in a
# copy of the wrapper's go.mod (-modfile). The module cache is read-only, and
# go build -overlay refuses files in it.
build_traefik() {
  local mod=$REPO_ROOT/hack/tools/traefik lego scratch
  # go mod download, not go list: on a cold module cache go list names no
  # directory, as the module is not downloaded yet.
  lego=$(cd "$mod" && retrying go mod download -json github.com/go-acme/lego/v4 | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -d $lego ]] || die "go mod download gave no directory for github.com/go-acme/lego/v4 (hack/tools/traefik)"
  scratch=$(mktemp -d "$KNATIVE_BIN_DIR/.traefik-XXXXXX")
  cp -r "$lego" "$scratch/lego" && chmod -R u+w "$scratch/lego"
  cp "$mod/legodns/zz_gen_dns_providers.go" "$scratch/lego/providers/dns/zz_gen_dns_providers.go"
  cp "$mod/go.mod" "$scratch/go.mod" && cp "$mod/go.sum" "$scratch/go.sum"
  go mod edit -modfile="$scratch/go.mod" -replace "github.com/go-acme/lego/v4=$scratch/lego"
  build traefik "$TRAEFIK_TAG" -modfile="$scratch/go.mod" -- github.com/traefik/traefik/v3/cmd/traefik
  rm -rf "$scratch"
}
side_by_side serving=build_serving eventing=build_eventing coredns=build_coredns traefik=build_traefik
mkimage="$KNATIVE_BIN_DIR/mkimage"
[[ -x $mkimage ]] || (cd "$REPO_ROOT" && go build -trimpath -ldflags "-s -w" -o "$mkimage" ./test/images/mkimage)
image() { # image NAME TAG BINARY
  local out="$KNATIVE_IMAGES_DIR/$1-$2.tar"
  [[ -s $out && $out -nt $3 ]] && return
  "$mkimage" -ref "dev.local/$1:$2" -out "$out" -user 65532:65532 "$3"
}
for c in "${serving[@]}"; do
  image "knative-serving-$c" "$KNATIVE_SERVING_VERSION" "$KNATIVE_BIN_DIR/serving-$KNATIVE_SERVING_VERSION/$c"
done
for c in "${eventing[@]}"; do
  image "knative-eventing-${c##*/}" "$KNATIVE_EVENTING_VERSION" "$KNATIVE_BIN_DIR/eventing-$KNATIVE_EVENTING_VERSION/${c##*/}"
done
image coredns "$COREDNS_VERSION" "$KNATIVE_BIN_DIR/$COREDNS_TAG/coredns"
image traefik "$TRAEFIK_VERSION" "$KNATIVE_BIN_DIR/$TRAEFIK_TAG/traefik"
log "knative images in $KNATIVE_IMAGES_DIR: $(cd "$KNATIVE_IMAGES_DIR" && ls | tr '\n' ' ')"
