#!/usr/bin/env bash
# Runs E2B's own SDK test suite, unmodified, from a copy of e2b-dev/E2B
# (E2B_SUITE, a path: the monorepo's root) against the E2B API of a running
# `make run NODE=real`, and prints its counts, per file and in all.
#
#   make run NODE=real                      # in one terminal; it prints:
#   export E2B_API_URL=… E2B_SANDBOX_URL=… E2B_API_KEY=…
#   make e2b-suite E2B_SUITE=/path/to/E2B   # in another
#
# What it runs: packages/js-sdk's live files (docs/e2b.md): every file under
# tests/sandbox that neither mocks the network (msw, vi.mock, a patched
# fetch: pointed at a live server those send to it and fail) nor is
# client-side only (no sandbox), and tests/api/{info,kill,list,snapshot}.
# Nothing of the suite is changed or copied: its devDependencies are
# installed in the copy with pnpm (the version its package.json names, into
# the cache), the engine check relaxed (a build tool there wants Node 22;
# the tests run on 20).
#
# Environment: E2B_SUITE (required); E2B_API_URL, E2B_SANDBOX_URL,
# E2B_API_KEY (make run's lines; required); E2B_SUITE_FILES (files under
# packages/js-sdk to run instead, space-separated); E2B_SUITE_WORKERS (files
# at once, default 3). The suite's template is 'base', which make run
# NODE=real ships.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

suite=${E2B_SUITE:-}
[[ -n "$suite" ]] || die "E2B_SUITE must name a copy of e2b-dev/E2B (its root, holding packages/js-sdk)"
sdk=$suite/packages/js-sdk
[[ -f "$sdk/package.json" && -d "$sdk/tests" ]] || die "E2B_SUITE=$suite has no packages/js-sdk with tests"
for v in E2B_API_URL E2B_SANDBOX_URL E2B_API_KEY; do
  [[ -n "${!v:-}" ]] || die "$v is unset: export the three lines \`make run NODE=real\` prints"
done
[[ -z "${E2B_DEBUG+x}" ]] || die "E2B_DEBUG is set: any value makes the suite skip most tests; unset it"
[[ ! -e "$sdk/.env" ]] || die "$sdk/.env exists: the suite reads it over the environment; move it away"

pnpm_version=$(node -e 'const p=require(process.argv[1]);console.log((p.packageManager||"").replace(/^pnpm@/,""))' "$suite/package.json")
[[ "$pnpm_version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "$suite/package.json names no pnpm version (packageManager)"
prefix=$CACHE_DIR/pnpm-$pnpm_version
if [[ ! -x "$prefix/bin/pnpm" ]]; then
  log "installing pnpm $pnpm_version into $prefix"
  npm install -g --prefix "$prefix.tmp" "pnpm@$pnpm_version" >/dev/null && rm -rf "$prefix" && mv "$prefix.tmp" "$prefix"
fi
export PATH=$prefix/bin:$PATH
log "installing the suite's devDependencies (pnpm, frozen lockfile)"
(cd "$suite" && CI=true pnpm install --frozen-lockfile --filter 'e2b...' --config.engine-strict=false --reporter=append-only | tail -n 3)

cd "$sdk"
if [[ -n "${E2B_SUITE_FILES:-}" ]]; then
  read -r -a files <<<"$E2B_SUITE_FILES"
else
  files=()
  while IFS= read -r f; do
    if grep -qE "from 'msw|vi\.(do)?[mM]ock|setupServer|vi\.spyOn\(globalThis, 'fetch'" "$f"; then continue; fi
    if ! grep -qE "sandboxTest|Sandbox\.(create|list|kill|getInfo|connect)|new ApiClient" "$f"; then continue; fi
    files+=("$f")
  done < <(find tests/sandbox -name '*.test.ts' | sort; printf 'tests/api/%s.test.ts\n' info kill list snapshot)
fi
log "running ${#files[@]} files of E2B's suite against $E2B_API_URL (sandboxes at $E2B_SANDBOX_URL)"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The key is make run's, not of E2B's form (e2b_<hex>); the domain is one
# no resolver answers, so nothing reaches E2B's own service.
E2B_VALIDATE_API_KEY=false E2B_DOMAIN=${E2B_DOMAIN:-e2b.sandbox.test} \
  pnpm exec vitest run --project unit --maxWorkers "${E2B_SUITE_WORKERS:-3}" \
  --reporter=default --reporter=json --outputFile.json="$out/result.json" "${files[@]}" || true
[[ -s "$out/result.json" ]] || die "vitest wrote no results"
node -e '
const r = require(process.argv[1]);
const rows = [];
let p = 0, f = 0, s = 0;
for (const file of r.testResults) {
  const c = { passed: 0, failed: 0, skipped: 0 };
  for (const a of file.assertionResults) {
    if (a.status === "passed") c.passed++;
    else if (a.status === "failed") c.failed++;
    else c.skipped++;
  }
  p += c.passed; f += c.failed; s += c.skipped;
  rows.push([file.name.replace(/.*packages\/js-sdk\//, ""), c.passed, c.failed, c.skipped]);
}
rows.sort((a, b) => a[0].localeCompare(b[0]));
console.log("\n| file | passed | failed | skipped |\n|---|---|---|---|");
for (const [n, a, b, c] of rows) console.log(`| ${n} | ${a} | ${b} | ${c} |`);
console.log(`\nE2B suite: ${p} passed, ${f} failed, ${s} skipped of ${p + f + s} in ${rows.length} files`);
' "$out/result.json"
