#!/usr/bin/env bash
# A third-party manifest scanner on what config/ deploys: kube-score
# (pinned, built from the module proxy into the cache) judges config/ as
# kustomize renders it, with the Knative Service rendered as the Deployment
# Knative runs it as (test/framework/workloads) and each sandbox template
# under config/templates as the workload the function builds from it
# (cmd/check-templates -render). Every finding is fixed, or listed in
# hack/scan-exceptions.txt with the reason it does not apply; a finding
# not listed fails, named as the scanner names it (object, container,
# rule). An exception that no longer matches any finding fails too, so the
# list stays true.
#
# It has no update-scan.sh twin: a finding is fixed, or excused, by hand.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

KUBE_SCORE_VERSION=v1.20.0
score_dir="$CACHE_DIR/kube-score-$KUBE_SCORE_VERSION"
if [[ ! -x $score_dir/kube-score ]]; then
  log "building kube-score $KUBE_SCORE_VERSION into $score_dir (once)"
  run_with_progress "kube-score" go_install "$score_dir" "github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION"
fi
KUBE_COMPONENTS=kubectl hack/install-kube.sh >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$KUBE_BIN_DIR/kubectl" kustomize config | go run ./test/framework/workloads >"$work/config.yaml"
go run ./cmd/check-templates -render config/templates >"$work/templates.yaml"
# Exit status 1 means findings, which are judged below; anything else failed.
set +e
"$score_dir/kube-score" score --output-format ci --kubernetes-version v1.36 "$work/config.yaml" "$work/templates.yaml" >"$work/findings.txt"
rc=$?
set -e
[[ $rc -le 1 ]] || die "kube-score failed (exit $rc): $(head -5 "$work/findings.txt")"

# Exceptions: "<object and rule, a shell pattern> | <why it does not apply>".
mapfile -t patterns < <(grep -v '^\s*#' hack/scan-exceptions.txt | grep -v '^\s*$' | sed 's/ | .*//')
new=() used=()
while IFS= read -r line; do
  finding=${line#\[* }
  matched=
  for i in "${!patterns[@]}"; do
    # shellcheck disable=SC2053 # the exception is a pattern
    if [[ $finding == ${patterns[$i]} ]]; then matched=1; used[i]=1; break; fi
  done
  [[ -n $matched ]] || new+=("$line")
done < <(grep -E '^\[(CRITICAL|WARNING)\]' "$work/findings.txt")
stale=()
for i in "${!patterns[@]}"; do
  [[ -n ${used[i]:-} ]] || stale+=("${patterns[$i]}")
done
if [[ ${#new[@]} -gt 0 ]]; then
  printf '  %s\n' "${new[@]}" >&2
  die "kube-score $KUBE_SCORE_VERSION: ${#new[@]} finding(s) above are neither fixed nor listed in hack/scan-exceptions.txt (fix each, or list it with why it does not apply)"
fi
if [[ ${#stale[@]} -gt 0 ]]; then
  printf '  %s\n' "${stale[@]}" >&2
  die "hack/scan-exceptions.txt: ${#stale[@]} exception(s) above match no finding any more: remove them"
fi
log "kube-score $KUBE_SCORE_VERSION: every finding fixed or listed with its reason ($(grep -cE '^\[(CRITICAL|WARNING)\]' "$work/findings.txt") listed)"
