#!/usr/bin/env bash
# Checks the shape of the house, which no compiler checks:
#   - the object builders (pkg/sandbox/resources) and the vocabulary
#     (pkg/keys) stay pure: no context, no client-go, no I/O;
#   - the import graph flows one way, door → contract → operations →
#     builders → keys, by the ranks below (a package imports only packages
#     of a lower rank), so nothing climbs back up;
#   - no package holds more than MAX_PACKAGE_LINES (2,500) non-test lines:
#     a package that grows past it is split by reason to change, as the
#     reap (pkg/reap) and a pooled create's Service (pkg/pooled) were split
#     out of pkg/sandbox;
#   - the builders, the templates and the request's validation take the
#     groups objects are made from (config.Objects), not the whole
#     configuration with its keys;
#   - only pkg/remove calls client-go's retry.OnError (see below);
#   - one name per concept: docs/architecture.md's glossary terms stay in
#     use under pkg/, and their retired names do not come back;
#   - README.md and docs/ speak of the product alone: no issue numbers, no
#     sessions, no dated notes (CHANGELOG.md keeps the history, and
#     docs/performance.md's figures carry the date they were measured on).
# It has no update-layout.sh twin: what it finds is fixed by hand.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

max_lines=${MAX_PACKAGE_LINES:-2500}
module=$(go list -m)
failed=0
fail() { printf '  %s\n' "$*" >&2; failed=1; }

# Ranks, lowest first. A package missing here is refused, so a new one is
# placed on purpose.
declare -A rank=(
  [pkg/keys]=0 [pkg/bounded]=0 [pkg/egress]=0 [pkg/access]=0 [pkg/monitor]=0 [pkg/sleep]=0 [pkg/reqid]=0 [pkg/metrics]=0 [pkg/eventlimit]=0
  [pkg/config]=1 [pkg/proxy]=1 [pkg/router]=5
  [pkg/envd/gen/process]=1 [pkg/envd/gen/filesystem]=1
  [pkg/envd/gen/process/processconnect]=2 [pkg/envd/gen/filesystem/filesystemconnect]=2
  [pkg/envd/process]=3 [pkg/envd/filesystem]=3 [pkg/envd]=4
  [pkg/config/configtest]=2 [pkg/template]=2 [pkg/kube]=2
  [pkg/fairness]=2
  [pkg/api]=3 [pkg/sandbox/status]=3 [pkg/poolapi]=3
  [pkg/sandbox/resources]=4 [pkg/problem]=4 [pkg/readywait]=4 [pkg/auth]=4 [pkg/waitlimit]=4
  [pkg/admission]=4 [pkg/audit]=4 [pkg/api/apitest]=4
  [pkg/quota]=5 [pkg/remove]=5 [pkg/grant]=8 [pkg/lifetime]=8 [pkg/isolation]=5 [pkg/follow]=5 [pkg/token]=5 [pkg/ownership]=5
  [pkg/slot]=6 [pkg/envsecret]=5 [pkg/pooled]=6
  [pkg/reap]=7
  [pkg/sandbox]=8
  [pkg/pool]=8
  [pkg/httpapi]=9 [pkg/events]=9 [pkg/e2b]=9
  [fn]=10
  [.]=11 [cmd/provisioner]=11 [cmd/check-templates]=11 [cmd/proxy]=11 [cmd/router]=11 [cmd/envd]=11
)
pure=(pkg/keys pkg/sandbox/resources pkg/sandbox/status)

while read -r pkg imports; do
  rel=${pkg#"$module"}; rel=${rel#/}; rel=${rel:-.}
  r=${rank[$rel]:-}
  if [[ -z "$r" ]]; then
    fail "$rel has no rank in hack/verify-layout.sh: place it in the import graph"
    continue
  fi
  for imp in $imports; do
    case "$imp" in
      "$module"/*)
        dep=${imp#"$module/"}
        d=${rank[$dep]:-}
        [[ -n "$d" && "$d" -lt "$r" ]] || fail "$rel (rank $r) imports $dep (rank ${d:-none}): the graph flows door → contract → operations → builders"
        ;;
    esac
  done
  for p in "${pure[@]}"; do
    [[ "$rel" == "$p" ]] || continue
    for imp in $imports; do
      case "$imp" in
        context | net/http | net/http/* | os | os/exec | k8s.io/client-go | k8s.io/client-go/*)
          fail "$rel imports $imp: builders and keys are pure functions (no context, no client, no I/O)" ;;
      esac
    done
  done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./pkg/... ./fn/... ./cmd/... .)

while read -r dir; do
  n=$(find "$dir" -maxdepth 1 -name '*.go' ! -name '*_test.go' -exec cat {} + | wc -l)
  (( n <= max_lines )) || fail "${dir#./} has $n non-test lines (at most $max_lines): split it by reason to change"
done < <(go list -f '{{.Dir}}' ./pkg/... ./fn/... ./cmd/... . | sed "s|^$REPO_ROOT|.|")

# Packages that take config.Objects, never the whole config.Config.
for dir in pkg/sandbox/resources pkg/template pkg/api; do
  while read -r hit; do
    [[ -n "$hit" ]] && fail "$hit: takes the whole configuration; take config.Objects (the groups objects are made from)"
  done < <(grep -n '\*config\.Config\b' "$dir"/*.go 2>/dev/null | grep -v '_test\.go:' || true)
done

# client-go's retry.OnError turns an error of its function that wraps
# context.DeadlineExceeded into the last retriable error (nil on a first
# call): a call cut by its deadline would count as done. remove.OnError
# returns the function's own error; nothing else calls retry.OnError.
while read -r hit; do
  [[ -n "$hit" ]] && fail "$hit: calls retry.OnError; call remove.OnError (or remove.Retry), which keeps a deadline's error"
done < <(grep -rn 'retry\.OnError(' --include='*.go' . 2>/dev/null | grep -v '^./pkg/remove/' || true)

# One name per concept (docs/architecture.md's glossary): every term the
# glossary defines is still a word of the code under pkg/, and the names
# each concept had before it was given one word do not come back.
glossary=docs/architecture.md
while read -r term; do
  grep -rqiF --include='*.go' -- "$term" pkg || fail "$glossary defines \"$term\", which no code under pkg/ uses any more: rename it in the glossary, or keep the word"
done < <(grep -o '<a id="[a-z-]*"></a>\*\*[^*]*\*\*' "$glossary" | sed 's/.*\*\*\(.*\)\*\*/\1/')
retired=(
  'pkg/claim"'          # the create/pool contract: pkg/poolapi
  'pkg/waitslot"'       # wait permits: pkg/waitlimit
  'waitslot\.'
  '\bSlotToken\b'       # the token a Service selects: resources.SelectedToken
  '\bOrphaned\('        # a reference without its owner: resources.OwnerlessReference
  '\bclaimService\b'    # a pooled create's Service: pooledService
  '\bnewSlots\b'        # the quota's Service cache: serviceCache
  '^type kind struct'   # a cold create's steps by kind: workloadKind
)
for name in "${retired[@]}"; do
  while read -r hit; do
    [[ -n "$hit" ]] && fail "$hit: a retired name ($name); docs/architecture.md's glossary gives the concept's one word"
  done < <(grep -rnE --include='*.go' -- "$name" . 2>/dev/null || true)
done
for file in pkg/sandbox/slot.go pkg/sandbox/claim.go pkg/quota/slots.go; do
  [[ ! -e "$file" ]] || fail "$file: its concept has one name now (cold.go, pooled.go, cache.go); do not bring the old file back"
done

# Docs that cite the work instead of the product: an issue or pull request
# number means nothing to a reader without the tracker, and a note dated
# in prose goes stale while the code moves on.
docs=(README.md docs/*.md)
while read -r hit; do
  [[ -n "$hit" ]] && fail "$hit: cites the process (an issue, a pull request, a session); state the fact alone (CHANGELOG.md keeps the history)"
done < <(grep -nHiE '\b(issue|pr|pull request)s? #?[0-9]+|\(#[0-9]+\)|\b[a-z]+(st|nd|rd|th) session\b' "${docs[@]}" 2>/dev/null || true)
while read -r hit; do
  [[ -n "$hit" ]] && fail "$hit: a dated note; say what is (dated figures belong in docs/performance.md)"
done < <(grep -nHE '(^|[^-[:alnum:]])20[0-9]{2}-[01][0-9]-[0-3][0-9]([^T0-9]|$)' "${docs[@]}" 2>/dev/null | grep -v '^docs/performance\.md:' || true)

if (( failed )); then
  die "the layout check failed (see above)"
fi
log "layout: builders pure and given config.Objects, imports one way, every package within $max_lines lines, docs of the product alone"
