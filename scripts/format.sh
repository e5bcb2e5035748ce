#!/usr/bin/env bash
# Formats every C++ file of the repository with clang-format and the repository's .clang-format.
#   bash scripts/format.sh          # rewrite the files in place
#   bash scripts/format.sh --check  # change nothing; list the files that differ, exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${CLANG_FORMAT:-clang-format}
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
