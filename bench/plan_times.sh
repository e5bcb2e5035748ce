#!/usr/bin/env bash
# CPU seconds (user + system) of `pipeswap plan` on the built-in scenario and every gallery scenario
# (examples/scenarios), one run each, against the 3 s target (docs/simulator.md, "The gallery").
# Prints one line per scenario and the count over the target; exits 1 if any is over.
#
#   bash bench/plan_times.sh [path/to/pipeswap]    # default: build/examples/pipeswap/pipeswap
set -euo pipefail
cd "$(dirname "$0")/.."
exe=${1:-build/examples/pipeswap/pipeswap}
target=${PLAN_TARGET_S:-3}
over=0
for f in "" examples/scenarios/*.json; do
  name=${f:-built-in}
  t=$( { /usr/bin/time -f "%U %S" "$exe" plan ${f:+--scenario "$f"} >/dev/null; } 2>&1 | tail -1)
  cpu=$(awk '{printf "%.2f", $1 + $2}' <<<"$t")
  flag=$(awk -v c="$cpu" -v t="$target" 'BEGIN { print (c > t) ? "over" : "ok" }')
  [ "$flag" = over ] && over=$((over + 1))
  printf '%-55s %6s s  %s\n' "$(basename "$name")" "$cpu" "$flag"
done
echo "$over over the ${target} s target"
[ "$over" -eq 0 ]
