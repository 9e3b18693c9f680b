#!/usr/bin/env bash
# dt plan's search on a catalogue cluster, at a commit given as $1 (a worktree of it in a temporary
# directory) and at this checkout, interleaved, three each; the tables must be the same. The rest of
# the arguments, if any, are dt plan's (default: a Llama 3 8B on 4 hosts of H100s).
set -euo pipefail
base=${1:?usage: bash benchmarks/plan_search.sh COMMIT [DT PLAN ARGUMENTS...]}
shift
unset DT_RECORD_HEADLINE  # recorded (python -m dt.record), the inner dt plans' rankings are not its headline
tree=$(mktemp -d)
trap 'git worktree remove --force "$tree"' EXIT
git worktree add -q --detach "$tree" "$base"
args="${*:---preset llama3-8b --device h100 --hosts 4 --global-batch 256 --seq 8192 --top 3}"
for i in 1 2 3; do
  for where in "$tree" "$PWD"; do
    name=$([ "$where" = "$PWD" ] && echo "this checkout" || echo "$base")
    start=$(date +%s.%N)
    (cd "$where" && python -m dt plan $args) > "$tree.$i.$(basename "$where").txt"  # each tree's own dt
    echo "== dt plan $args at $name (run $i): $(echo "$(date +%s.%N) - $start" | bc) s"
  done
  cmp <(grep -v "to plan)" "$tree.$i.$(basename "$tree").txt") <(grep -v "to plan)" "$tree.$i.$(basename "$PWD").txt") \
    && echo "   the two tables are the same"
done
rm -f "$tree".*.txt
