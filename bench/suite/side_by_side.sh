#!/usr/bin/env bash
# The CI suite's time, this tree against a base commit, side by side on one machine in one run.
#
#   bench/suite/side_by_side.sh BASE_WORKTREE ROUNDS OUT_DIR
#
# Each round runs the base tree's checks, then this tree's, back to back (so load from
# other work on the machine falls on both alike): ruff, mypy --strict and pytest exactly as
# each tree's scripts/test runs them, with one shared venv (VENV, default .venv) and the
# default model's cache already converted in both. scripts/test's pip steps are left out
# of both (the base reinstalled pip and the project on every run; this tree does not).
# Trees in each round: base, head-serial (this tree, -n 0), head (as its scripts/test runs it).
# Writes OUT_DIR/times.tsv (round, tree, step, seconds, load before, load after, verdict).
set -uo pipefail
base=$1 rounds=$2 out=$3
here=$(cd "$(dirname "$0")/../.." && pwd)
venv=${VENV:-$here/.venv}
mkdir -p "$out"
printf 'round\ttree\tstep\tseconds\tload_before\tload_after\tverdict\n' > "$out/times.tsv"

pytest_args() {  # the pytest arguments the tree's scripts/test passes
  grep -o 'pytest -q.*"\$@"' "$1/scripts/test" | sed -e 's/^pytest -q//' -e 's/"\$@"//'
}

step() {  # round tree name dir command...
  local round=$1 tree=$2 name=$3 dir=$4; shift 4
  local before after start end verdict
  before=$(cut -d' ' -f1 /proc/loadavg)
  start=$(date +%s.%N)
  (cd "$dir" && "$@") > "$out/$tree-$name-$round.log" 2>&1 && verdict=pass || verdict=fail
  end=$(date +%s.%N)
  after=$(cut -d' ' -f1 /proc/loadavg)
  printf '%s\t%s\t%s\t%.1f\t%s\t%s\t%s\n' "$round" "$tree" "$name" "$(echo "$end - $start" | bc)" \
    "$before" "$after" "$verdict" | tee -a "$out/times.tsv"
}

# Trees: base; head (this tree, as its scripts/test runs it); head-serial (this tree in one
# process, -n 0: what the suite costs without pytest-xdist's two workers).
for round in $(seq 1 "$rounds"); do
  for tree in base head-serial head; do
    dir=$([ "$tree" = base ] && echo "$base" || echo "$here")
    extra=$([ "$tree" = head-serial ] && echo "-n 0" || true)
    step "$round" "$tree" ruff "$dir" "$venv/bin/ruff" check .
    step "$round" "$tree" mypy "$dir" "$venv/bin/mypy" --strict engine/planner engine/executor engine/errors.py \
      service/config.py
    # shellcheck disable=SC2046,SC2086
    step "$round" "$tree" pytest "$dir" "$venv/bin/python" -m pytest -q $(pytest_args "$dir") $extra
  done
done
