#!/usr/bin/env bash
# kill_at_every_point.sh REFIT RECIPE WORK_DIR
# A run ended at each of its filesystem changes in turn — every step of every checkpoint save,
# of every retention delete and of every metrics-log write (REFIT_FAULT_AT=N: the N-th change
# ends the process with _exit, as a SIGKILL would; framework/io/fault.h) — and then resumed
# ends exactly as a run that was never interrupted: bit-identical checkpoint files (weights and
# training state), the same checkpoint folder (no leftover step-N, .deleting-* or .tmp entries),
# the same run folder, and the same metrics.jsonl byte for byte (one line per logged step).
set -euo pipefail
refit="$1"; recipe="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
untimed() { sed -E 's/,?"time":[-0-9.e+]+//' "$1"; }

"$refit" train "$recipe" --set output.dir="$work/straight" > "$work/straight.log"
final=$(cat "$work/straight/checkpoints/latest")
REFIT_FAULT_AT=list "$refit" train "$recipe" --set output.dir="$work/listed" > /dev/null 2> "$work/points.txt"
points=$(grep -c '^fault point' "$work/points.txt" || true)
grep -q 'checkpoint: rename' "$work/points.txt" || fail "no checkpoint rename among the fault points"
grep -q 'delete: rename away' "$work/points.txt" || fail "no rename-away delete among the fault points"
[ "$points" -ge 20 ] || fail "only $points fault points"
# Every file renamed into place is made durable: its folder is synced after the rename.
renamed=$(grep -c 'write: rename into place' "$work/points.txt" || true)
synced=$(grep -c 'write: folder synced' "$work/points.txt" || true)
[ "$renamed" -eq "$synced" ] || fail "$renamed files renamed into place, $synced folder syncs after them"

for n in $(seq 1 "$points"); do
  d="$work/at-$n"
  rc=0
  REFIT_FAULT_AT=$n "$refit" train "$recipe" --set output.dir="$d" > "$d.log" 2>&1 || rc=$?
  [ "$rc" -eq 86 ] || fail "REFIT_FAULT_AT=$n: exit status $rc, expected 86 (see $d.log)"
  what=$(sed -n "s/^fault point $n: //p" "$work/points.txt")
  "$refit" train "$recipe" --set output.dir="$d" --resume >> "$d.log" 2>&1 || fail "resume after point $n ($what) failed: $d.log"
  [ "$(cat "$d/checkpoints/latest")" = "$final" ] || fail "point $n ($what): latest is not $final"
  for f in trainable.safetensors state.safetensors; do
    cmp -s "$work/straight/checkpoints/$final/$f" "$d/checkpoints/$final/$f" || fail "point $n ($what): $f differs"
  done
  [ "$(ls -A "$d/checkpoints")" = "$(ls -A "$work/straight/checkpoints")" ] ||
    fail "point $n ($what): checkpoints/ holds $(ls -A "$d/checkpoints" | tr '\n' ' ')"
  # TensorBoard event files are named by time and process, and a resumed run adds its own.
  listing() { ls -A "$1" | grep -v '^events\.out\.tfevents\.'; }
  [ "$(listing "$d")" = "$(listing "$work/straight")" ] || fail "point $n ($what): the run folder holds $(ls -A "$d" | tr '\n' ' ')"
  # Byte for byte but for each update's wall-clock seconds ("time"), which no two runs share.
  cmp -s <(untimed "$work/straight/metrics.jsonl") <(untimed "$d/metrics.jsonl") || fail "point $n ($what): metrics.jsonl differs"
  rm -rf "$d" "$d.log"
done
echo "OK: $points fault points, each resumed to bit-identical checkpoints, the same folders and metrics.jsonl"
