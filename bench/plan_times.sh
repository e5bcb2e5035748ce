#!/usr/bin/env bash
# CPU seconds (user + system) of `pipeswap plan` on the built-in scenario and every gallery scenario
# (examples/scenarios), one run each, against the 3 s target (docs/simulator.md, "The gallery"), with
# the work behind it (simulations and simulated training steps: the same on every machine, where
# the seconds move with the load). Prints one line per scenario and the count over the target;
# exits 1 if any is over.
#
# With --check, each scenario is also planned with --exhaustive (every uniform candidate simulated,
# minutes on the larger files) and the two choices compared: the search's step against the
# exhaustive one's (equal within the tolerance is as fast) and the host-link bytes each moves.
#
#   bash bench/plan_times.sh [--check] [path/to/pipeswap]    # default: build/examples/pipeswap/pipeswap
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = --check ]; then
  check=1
  shift
fi
exe=${1:-build/examples/pipeswap/pipeswap}
target=${PLAN_TARGET_S:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
over=0
# One line from `plan --json` output: the chosen step (s), host-link GB, simulations, steps.
summary() {
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
c = d["chosen"]["outcome"] if d["chosen"] else None
w = d["work"]
print("%.3f %.1f %d %d" % (c["step_ns"] / 1e9 if c else 0, (c["h2d_bytes"] + c["d2h_bytes"]) / 1e9 if c else 0,
                           w["simulations"], w["simulated_steps"]))' "$1"
}
for f in "" examples/scenarios/*.json; do
  name=${f:-built-in}
  t=$( { /usr/bin/time -f "%U %S" "$exe" plan ${f:+--scenario "$f"} --json >"$tmp/plan.json"; } 2>&1 | tail -1)
  cpu=$(awk '{printf "%.2f", $1 + $2}' <<<"$t")
  flag=$(awk -v c="$cpu" -v t="$target" 'BEGIN { print (c > t) ? "over" : "ok" }')
  [ "$flag" = over ] && over=$((over + 1))
  read -r step gb sims steps <<<"$(summary "$tmp/plan.json")"
  line=$(printf '%-45s %6s s  %-4s %4s simulations %5s steps  chosen %s s, %s GB' "$(basename "$name")" "$cpu" "$flag" \
    "$sims" "$steps" "$step" "$gb")
  if [ "$check" = 1 ]; then
    t=$( { /usr/bin/time -f "%U %S" "$exe" plan ${f:+--scenario "$f"} --json --exhaustive >"$tmp/full.json"; } 2>&1 | tail -1)
    read -r xstep xgb xsims xsteps <<<"$(summary "$tmp/full.json")"
    line+=$(printf ' | exhaustive %s s CPU, %s steps: chosen %s s, %s GB' "$(awk '{printf "%.1f", $1 + $2}' <<<"$t")" \
      "$xsteps" "$xstep" "$xgb")
  fi
  echo "$line"
done
echo "$over over the ${target} s target"
[ "$over" -eq 0 ]
