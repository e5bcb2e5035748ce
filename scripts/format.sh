#!/usr/bin/env bash
# Formats every C++ file of the repository with clang-format and the repository's .clang-format.
#   bash scripts/format.sh          # rewrite the files in place
#   bash scripts/format.sh --check  # change nothing; list the files that differ, exit 1 if any
# The files are git's (git ls-files); outside a git checkout --check exits 77 (a skipped test).
# The style is clang-format 14's (Debian's), the version CI installs; another version may differ.
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${CLANG_FORMAT:-clang-format}
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "format.sh: not a git checkout: no file list"
  [ "${1:-}" = "--check" ] && exit 77
  exit 2
fi
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.cuh' '*.cu' '*.h')
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    if ! "$fmt" --style=file "$f" | cmp -s - "$f"; then
      echo "not formatted: $f"
      bad=1
    fi
  done
  exit $bad
fi
"$fmt" --style=file -i "${files[@]}"
