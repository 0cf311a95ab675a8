#!/usr/bin/env bash
# sigkill_resume.sh REFIT RECIPE WORK_DIR [--set k=v ...]
# A run killed with SIGKILL resumes from its last checkpoint and ends bit-identical to a run
# that was never interrupted — its trained weights and its whole training state (buffers such
# as BatchNorm statistics, optimizer, scaler, RNG, objective state, counters); retention keeps
# the newest two checkpoints. Extra arguments (overrides) follow the defaults and win over them.
set -euo pipefail
refit="$1"; recipe="$2"; work="$3"; shift 3
rm -rf "$work"; mkdir -p "$work"
args=(--set training.duration=40:epoch --set training.checkpoint_every=1:epoch
      --set output.checkpoints.keep_last=2 --set training.log_every=1000 "$@")

"$refit" train "$recipe" "${args[@]}" --set output.dir="$work/straight" > "$work/straight.log"

"$refit" train "$recipe" "${args[@]}" --set output.dir="$work/killed" > "$work/killed.log" &
pid=$!
for _ in $(seq 1 2000); do
  [ -f "$work/killed/checkpoints/latest" ] && break
  sleep 0.01
done
kill -9 "$pid"
wait "$pid" 2>/dev/null && { echo "FAIL: the run finished before it could be killed"; exit 1; } || true
[ ! -f "$work/killed/summary.json" ] || { echo "FAIL: the killed run wrote its summary"; exit 1; }
echo "killed at $(cat "$work/killed/checkpoints/latest")"

"$refit" train "$recipe" "${args[@]}" --set output.dir="$work/killed" --resume | tee "$work/resumed.log" | grep "resuming from"
final=$(cat "$work/straight/checkpoints/latest")
[ "$final" = "$(cat "$work/killed/checkpoints/latest")" ] || { echo "FAIL: different final checkpoints"; exit 1; }
cmp "$work/straight/checkpoints/$final/trainable.safetensors" "$work/killed/checkpoints/$final/trainable.safetensors"
cmp "$work/straight/checkpoints/$final/state.safetensors" "$work/killed/checkpoints/$final/state.safetensors"
echo "resumed run is bit-identical to the straight run at $final"
n=$(ls -d "$work/killed/checkpoints"/step-* | wc -l)
[ "$n" -le 2 ] || { echo "FAIL: $n checkpoints kept, expected at most 2"; exit 1; }
echo "OK"
