#!/usr/bin/env bash
# Installs the e2b SDK that test/e2b pins (package.json, package-lock.json)
# with `npm ci` into the cache, keyed by the lockfile's SHA-256, and links
# test/e2b/node_modules to it: a fresh clone reuses what an earlier clone on
# this machine installed, and a change of the lockfile installs anew beside
# the old copy. Needs Node 20.18.1+ (or 22+, the SDK's engines) and npm;
# nothing else is installed here, so a machine without them fails here,
# saying so, rather than in the middle of a test.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

E2B_TEST_DIR="$REPO_ROOT/test/e2b"
lock="$E2B_TEST_DIR/package-lock.json"
link="$E2B_TEST_DIR/node_modules"

command -v node >/dev/null 2>&1 || die "node is not installed: the E2B SDK tests need Node.js 20.18.1+ or 22+ with npm (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null 2>&1 || die "npm is not installed: the E2B SDK tests install the SDK with npm ci (Debian: apt-get install npm)"
# The SDK's engines field: >=20.18.1 <21 || >=22.
node -e '
  const [maj, min, pat] = process.versions.node.split(".").map(Number);
  const ok = maj >= 22 || (maj === 20 && (min > 18 || (min === 18 && pat >= 1)));
  process.exit(ok ? 0 : 1);
' || die "node $(node --version) is too old or unsupported for e2b 2.51.0 (it needs >=20.18.1 <21 or >=22)"
[[ -f "$lock" ]] || die "$lock is missing"

sha=$(sha256sum "$lock" | cut -c1-64)
dir="$CACHE_DIR/e2b-$sha"
if [[ -d "$dir/node_modules/e2b" ]]; then
  log "e2b SDK cached at $dir (lockfile $(cut -c1-12 <<<"$sha"))"
else
  log "installing the e2b SDK with npm ci into $dir"
  mkdir -p "$CACHE_DIR"
  tmp=$(mktemp -d "$CACHE_DIR/e2b-$sha.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cp "$E2B_TEST_DIR/package.json" "$lock" "$tmp/"
  # --ignore-scripts: the SDK and its dependencies need no install scripts,
  # and none should run on a CI machine unasked.
  (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) ||
    die "npm ci failed in $tmp (is the npm registry reachable? run again to retry)"
  [[ -d "$tmp/node_modules/e2b" ]] || die "npm ci left no node_modules/e2b in $tmp"
  # Renamed into place whole, so a killed install never looks cached.
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
fi

# node_modules in the repository is only ever this link (.gitignore'd); a
# real directory there is an `npm install` by hand, replaced by the pinned one.
if [[ -L "$link" ]]; then
  [[ "$(readlink "$link")" == "$dir/node_modules" ]] || ln -sfn "$dir/node_modules" "$link"
else
  [[ -e "$link" ]] && { log "replacing $link (not the cache's link) with the pinned install"; rm -rf "$link"; }
  ln -s "$dir/node_modules" "$link"
fi
log "test/e2b/node_modules -> $dir/node_modules (e2b $(node -p 'require(process.argv[1]).version' "$dir/node_modules/e2b/package.json"))"
