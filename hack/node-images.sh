#!/usr/bin/env bash
# Builds the images the real test node runs, as OCI image archives containerd
# imports (nothing can be pulled here): pause (the Pod sandbox image), the
# sandbox stand-in (test/images/sandbox), kube-network-policies and the
# egress proxy (cmd/proxy). Each is one
# static binary in an otherwise empty image (test/images/mkimage).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

"$REPO_ROOT/hack/install-node.sh"
mkdir -p "$NODE_IMAGES_DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$REPO_ROOT"
log "building the real node's images into $NODE_IMAGES_DIR"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/mkimage" ./test/images/mkimage
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/pause" ./test/images/pause
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/sandbox" ./test/images/sandbox
"$work/mkimage" -ref localhost/pause:e2e -out "$NODE_IMAGES_DIR/pause.tar" -user 65535:65535 "$work/pause"
"$work/mkimage" -ref localhost/sandbox:e2e -out "$NODE_IMAGES_DIR/sandbox.tar" -user 1000:1000 "$work/sandbox"
"$work/mkimage" -ref "localhost/kube-network-policies:$KNP_VERSION-xtq" -out "$NODE_IMAGES_DIR/kube-network-policies.tar" \
  -entrypoint /bin/netpol "$NODE_BIN_DIR/kube-network-policies"
# The E2B sandbox stand-in: the same stand-in with a shell beside it, as an
# operator's image has (E2B's SDK runs every command as /bin/bash -l -c):
# Debian's static bash and busybox (its applets as links), user 1000 with
# its home /home/user, as E2B's user model has (relative paths land there).
if ! dpkg-query -W -f='${Status}' bash-static busybox-static 2>/dev/null | grep -q '^install ok installed.*install ok installed$'; then
  log "installing Debian's bash-static and busybox-static (the E2B sandbox stand-in's shell)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bash-static busybox-static >/dev/null
fi
links=()
for applet in sh true false echo printf cat ls sleep env pwd mkdir rm mv cp head tail wc sha256sum id whoami kill ps test [ \
  seq yes dd stat touch grep sed awk tr sort uniq cut date hostname uname basename dirname readlink find xargs tee chmod ln du df stty; do
  links+=(-link "/bin/$applet=busybox")
done
# E2B's user: uid 1000 is named "user" (file owners, whoami), as E2B's
# images have it.
printf 'root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n' >"$work/passwd"
printf 'root:x:0:\nuser:x:1000:\n' >"$work/group"
"$work/mkimage" -ref localhost/sandbox-shell:e2e -out "$NODE_IMAGES_DIR/sandbox-shell.tar" -user 1000:1000 -home /home/user -entrypoint /sandbox \
  -add /bin/bash-static=/bin/bash -add /bin/busybox=/bin/busybox -link /usr/bin/env=../../bin/busybox -path /bin:/usr/bin:/ \
  -add "$work/passwd=/etc/passwd" -add "$work/group=/etc/group" \
  "${links[@]}" "$work/sandbox"
# The egress proxy (cmd/proxy), which allowlist sandboxes go through; the
# E2B agent (cmd/envd) and router (cmd/router).
"$REPO_ROOT/hack/proxy-image.sh"
"$REPO_ROOT/hack/envd-image.sh"
"$REPO_ROOT/hack/router-image.sh"
log "images: $(cd "$NODE_IMAGES_DIR" && ls)"
