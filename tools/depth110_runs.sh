#!/usr/bin/env bash
# Maintainers: issue 41's two runs, preact-110 and resnet-110 with the paper's complete recipe,
# side by side on one thread each (benchmarks/README.md, "Two depth-110 runs"), then the one
# left on both cores. Rerun it to resume: each run restarts from its backup; a run that ended
# leaves RUNS/NAME.done. Start it from a frozen worktree of the code, in its own autogroup:
#
#     git worktree add --detach ../frozen-41 <commit>
#     cd RUNS && nohup setsid ../frozen-41/tools/depth110_runs.sh > driver.out 2>&1 &
#     echo 15 > /proc/$!/autogroup   # below interactive work; `nice` does nothing there
#
# RUNS (default: the current directory) holds the run dirs, logs and driver.log; DATA the TFDS
# data dir; VENV the virtualenv to activate; CODE the tree that trains (default: this script's).
set -u
RUNS=${RUNS:-$PWD}
DATA=${DATA:-/work/shared/tensorflow_datasets}
VENV=${VENV:-/work/venv}
cd "$RUNS"
. "$VENV/bin/activate"
export PYTHONPATH
PYTHONPATH=${CODE:-$(cd "$(dirname "$0")/.." && pwd)}

train() {  # NAME: the issue's command, rerun until it exits 0 (at most 20 tries)
  local name=$1
  for try in $(seq 20); do
    local threads=(TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1)
    [ -e preact-110.done ] && threads=()  # the one run left gets both cores
    env "${threads[@]}" python -m keras_preact.cli train "$name" --val-examples 0 \
      --mixed-precision bfloat16 --seed 0 --data-dir "$DATA" \
      --output "$RUNS/$name-cifar10-64k" >> "$name.log" 2>&1 && return 0
    echo "$(date -u +%FT%TZ) $name exited $?; try $try" >> driver.log
    sleep 30
  done
  return 1
}

[ -e resnet-110.done ] || { train resnet-110 && touch resnet-110.done; } &
pair=$!
if [ ! -e preact-110.done ]; then
  train preact-110 && touch preact-110.done && echo "$(date -u +%FT%TZ) preact-110 ended" >> driver.log
  # resnet-110 resumes from its last backup on both cores
  [ -e preact-110.done ] && pkill -TERM -f "train resnet-110 --val-examples"
fi
wait $pair
