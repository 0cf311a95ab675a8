#!/usr/bin/env bash
# resume_refused.sh REFIT RECIPE WORK_DIR
# A resume whose recipe changes the batch size is refused before anything is restored, naming
# /training/batch_size; the checkpoint is untouched; /training/resume_allow_changes allows it.
set -euo pipefail
refit="$1"; recipe="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
args=(--set training.duration=2:epoch --set training.checkpoint_every=1:epoch --set training.log_every=1000
      --set output.dir="$work/run")
"$refit" train "$recipe" "${args[@]}" --set training.duration=1:epoch > "$work/first.log"
latest=$(cat "$work/run/checkpoints/latest")
before=$(sha256sum "$work/run/checkpoints/$latest/"*)

set +e
out=$("$refit" train "$recipe" "${args[@]}" --set training.batch_size=32 --resume 2>&1); code=$?
set -e
echo "$out"
[ "$code" = 1 ] || { echo "FAIL: exit code $code, expected 1"; exit 1; }
grep -q "/training/batch_size: the checkpoint's run had 64, this recipe has 32" <<<"$out" ||
  { echo "FAIL: the refusal does not name /training/batch_size"; exit 1; }
[ "$before" = "$(sha256sum "$work/run/checkpoints/$latest/"*)" ] || { echo "FAIL: the checkpoint changed"; exit 1; }
[ "$(cat "$work/run/checkpoints/latest")" = "$latest" ] || { echo "FAIL: latest moved"; exit 1; }

"$refit" train "$recipe" "${args[@]}" --set training.batch_size=32 --resume \
  --set 'training.resume_allow_changes=["/training/batch_size"]' | grep "resuming from"
echo "OK"
