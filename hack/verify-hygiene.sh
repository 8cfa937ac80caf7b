#!/usr/bin/env bash
# Fails on build outputs in git: any tracked file over 1 MiB, and any
# tracked executable (ELF or a file with the executable bit) outside hack/
# and .ci/. Binaries are built into caches outside the repository.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

bad=0
while IFS= read -r -d '' f; do
  [[ -f "$f" ]] || continue
  size=$(stat -c %s "$f")
  if (( size > 1048576 )); then
    echo "tracked file over 1 MiB: $f ($size bytes)" >&2; bad=1
  fi
  case "$f" in hack/*|.ci/*) continue ;; esac
  if [[ -x "$f" ]] || head -c 4 "$f" | grep -q $'\x7fELF'; then
    echo "tracked executable outside hack/ and .ci/: $f" >&2; bad=1
  fi
done < <(git ls-files -z)
(( bad == 0 )) || die "remove build outputs from git (git rm --cached FILE); they belong outside the repository"
log "no large files or executables tracked"
