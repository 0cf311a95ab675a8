#!/usr/bin/env bash
# distributed.sh REFIT TORCHRUN TENSOR_DIFF RECIPE WORK_DIR [--set k=v ...]
# Data-parallel training on CPUs: two processes over loopback with Gloo.
#  1. two ranks with batch B each end with the weights of one process with batch 2B (within 1e-6
#     relative), and report the same validation and test metrics;
#  2. the same under torchrun (its agent hosts the store);
#  3. a +inf sample read by one rank only: both ranks skip the same updates, weights as one process;
#  4. a resume under another world size is refused, naming /training/world_size;
#  5. one rank killed: the other exits non-zero within 60 s, naming the lost rank;
#  6. both ranks killed after a checkpoint, resumed with two ranks: bit-identical to test 1's run;
#  8. refit predict under two ranks (every other batch each) writes the one-process file;
#  9. a rank whose store never appears stops after timeout_s, in its own words (no c10d retries);
#  7. DINO (DINO_RECIPE when given), whose centre moves with each window's teacher outputs: two ranks
#     as one process with the global batch; a checkpoint due inside a window waits for its end.
set -euo pipefail
refit="$1"; torchrun="$2"; diff="$3"; recipe="$4"; work="$5"; shift 5
dino_recipe="${DINO_RECIPE:-}"
extra=("$@")  # overrides for every run (the test plugins' folder)
rm -rf "$work"; mkdir -p "$work"
# A store port outside the kernel's ephemeral range (ip_local_port_range; 32768-60999 by
# default), so that no outgoing connection (Gloo's pairs, a store client, any other test's)
# already holds it, and that nothing listens on. Where the range leaves no room outside it, the
# listening check is all there is.
read -r ephemeral_lo ephemeral_hi < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || { ephemeral_lo=32768; ephemeral_hi=60999; }
if [ "$ephemeral_lo" -gt 11024 ]; then port_lo=10000; port_hi=$ephemeral_lo
elif [ "$ephemeral_hi" -lt 64512 ]; then port_lo=$(( ephemeral_hi + 1 )); port_hi=65536
else port_lo=20000; port_hi=50000
fi
port() {
  local p
  while :; do
    p=$(( port_lo + (RANDOM * 32768 + RANDOM) % (port_hi - port_lo) ))
    grep -qiE "^ *[0-9]+: [0-9A-F]+:$(printf '%04X' "$p") [0-9A-F]+:[0-9A-F]+ 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null || break
  done
  echo "$p"
}

# Two ranks launched by hand (what torchrun does, minus the agent): RANK, WORLD_SIZE, ...
two_ranks() {  # two_ranks NAME [overrides...]: runs both ranks to the end, logs in $work/NAME.rank*.log
  local name="$1"; shift
  local p; p=$(port)
  local pids=()
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
      "$refit" train "$recipe" "${extra[@]}" --set output.dir="$work/$name" --set training.batch_size=8 "$@" \
      > "$work/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  [ "$rc" -eq 0 ] || { echo "FAIL: a rank of $name exited $rc"; tail -n 5 "$work/$name".rank*.log; exit 1; }
}
final() { echo "$work/$1/checkpoints/$(cat "$work/$1/checkpoints/latest")/trainable.safetensors"; }
metrics() { grep -E "^(val|test) @ step" "$work/$1" | sed 's/ *([^)]*)//g'; }
same_metrics() {
  if ! diff <(metrics "$1") <(metrics "$2") > /dev/null; then
    echo "FAIL: evaluation differs"; diff <(metrics "$1") <(metrics "$2") || true; exit 1
  fi
}

echo "== 1. two ranks (batch 8 each) against one process (batch 16)"
"$refit" train "$recipe" "${extra[@]}" --set output.dir="$work/one" > "$work/one.log" 2>&1 || { tail -20 "$work/one.log"; exit 1; }
two_ranks two
grep -q "data-parallel: 2 processes, rank 0 of 2 (gloo" "$work/two.rank0.log" || { echo "FAIL: no data-parallel line"; exit 1; }
[ ! -s "$work/two.rank1.log" ] || { echo "FAIL: rank 1 printed:"; cat "$work/two.rank1.log"; exit 1; }
"$diff" "$(final one)" "$(final two)" 1e-6
same_metrics one.log two.rank0.log
metrics two.rank0.log | tail -2

echo "== 2. under torchrun --no-python --nproc-per-node 2"
"$torchrun" --no-python --nproc-per-node 2 --master-port "$(port)" \
  "$refit" train "$recipe" "${extra[@]}" --set output.dir="$work/torchrun" --set training.batch_size=8 > "$work/torchrun.log" 2>&1 \
  || { tail -20 "$work/torchrun.log"; exit 1; }
grep -q "torchrun's agent" "$work/torchrun.log" || { echo "FAIL: the ranks did not use the agent's store"; exit 1; }
"$diff" "$(final one)" "$(final torchrun)" 1e-6
same_metrics one.log torchrun.log

echo "== 3. a non-finite gradient on one rank only"
poison=(--set 'data.train.config.poisoned=[5, 130]')
"$refit" train "$recipe" "${extra[@]}" --set output.dir="$work/one-inf" "${poison[@]}" > "$work/one-inf.log" 2>&1 || { tail -20 "$work/one-inf.log"; exit 1; }
two_ranks two-inf "${poison[@]}"
skipped_one=$(grep -o '"skipped_iterations": [0-9]*' "$work/one-inf/summary.json")
skipped_two=$(grep -o '"skipped_iterations": [0-9]*' "$work/two-inf/summary.json")
echo "one process: $skipped_one; two ranks: $skipped_two"
[ "$skipped_one" = "$skipped_two" ] && [ "$skipped_one" != '"skipped_iterations": 0' ] \
  || { echo "FAIL: skipped updates differ or none were skipped"; exit 1; }
"$diff" "$(final one-inf)" "$(final two-inf)" 1e-6

echo "== 4. a resume under another world size is refused"
if "$refit" train "$recipe" "${extra[@]}" --set output.dir="$work/two" --set training.batch_size=8 --resume > "$work/resume.log" 2>&1; then
  echo "FAIL: a one-process resume of a two-rank checkpoint was accepted"; exit 1
fi
grep -q "/training/world_size: the checkpoint's run had 2, this recipe has 1" "$work/resume.log" \
  || { echo "FAIL: the refusal does not name /training/world_size"; cat "$work/resume.log"; exit 1; }

echo "== 5. one rank killed"
p=$(port)
RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "$refit" train "$recipe" "${extra[@]}" \
  --set output.dir="$work/killed" --set training.batch_size=8 --set training.duration=100000:epoch \
  > "$work/killed.rank0.log" 2>&1 &
r0=$!
RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "$refit" train "$recipe" "${extra[@]}" \
  --set output.dir="$work/killed" --set training.batch_size=8 --set training.duration=100000:epoch \
  > "$work/killed.rank1.log" 2>&1 &
r1=$!
for _ in $(seq 1 600); do
  [ -s "$work/killed/metrics.jsonl" ] && break
  sleep 0.1
done
[ -s "$work/killed/metrics.jsonl" ] || { echo "FAIL: the ranks did not start training"; kill -9 $r0 $r1; exit 1; }
kill -9 "$r1"; wait "$r1" 2>/dev/null || true
start=$(date +%s)
rc=0; wait "$r0" || rc=$?
elapsed=$(( $(date +%s) - start ))
echo "rank 0 exited $rc after ${elapsed} s: $(grep -m1 'lost rank' "$work/killed.rank0.log" | cut -c1-160)"
[ "$rc" -ne 0 ] || { echo "FAIL: rank 0 exited 0"; exit 1; }
[ "$elapsed" -le 60 ] || { echo "FAIL: rank 0 took ${elapsed} s"; exit 1; }
grep -q "lost rank 1" "$work/killed.rank0.log" || { echo "FAIL: the message does not name rank 1"; cat "$work/killed.rank0.log"; exit 1; }
if ls -d "$work/killed/checkpoints"/.step-*tmp* > /dev/null 2>&1; then echo "FAIL: a partial checkpoint was left"; exit 1; fi

echo "== 6. both ranks killed after a checkpoint, resumed under the same world size"
p=$(port); pids=()
for r in 0 1; do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "$refit" train "$recipe" "${extra[@]}" \
    --set output.dir="$work/resumed" --set training.batch_size=8 > "$work/resumed.kill$r.log" 2>&1 &
  pids+=($!)
done
# Wait for the first checkpoint however loaded the machine is (ctest runs other tests beside this
# one on two cores): until it appears, or the ranks end, or 5 minutes pass.
for _ in $(seq 1 3000); do
  [ -f "$work/resumed/checkpoints/latest" ] && break
  kill -0 "${pids[@]}" 2>/dev/null || break
  sleep 0.1
done
kill -9 "${pids[@]}" 2>/dev/null || true
for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
[ -f "$work/resumed/checkpoints/latest" ] \
  || { echo "FAIL: no checkpoint was written before the kill"; tail -n 5 "$work"/resumed.kill*.log; exit 1; }
echo "killed at $(cat "$work/resumed/checkpoints/latest")"
two_ranks resumed --resume
grep -q "resuming from" "$work/resumed.rank0.log" || { echo "FAIL: did not resume"; exit 1; }
last=$(cat "$work/two/checkpoints/latest")
[ "$last" = "$(cat "$work/resumed/checkpoints/latest")" ] || { echo "FAIL: different final checkpoints"; exit 1; }
cmp "$work/two/checkpoints/$last/trainable.safetensors" "$work/resumed/checkpoints/$last/trainable.safetensors"
cmp "$work/two/checkpoints/$last/state.safetensors" "$work/resumed/checkpoints/$last/state.safetensors"
echo "resumed two-rank run is bit-identical to the straight one at $last"

echo "== 8. refit predict in two ranks writes the one-process file"
# Batches of 7: rounds of two batches, the last round one batch short and its batch short too.
predict=(predict "$recipe" "${extra[@]}" --set output.dir="$work/one" --input data:test --batch-size 7 --top-k 2)
"$refit" "${predict[@]}" --out "$work/predict-one.jsonl" > "$work/predict-one.log" 2>&1 \
  || { tail -n 20 "$work/predict-one.log"; exit 1; }
p=$(port); pids=()
for r in 0 1; do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "$refit" "${predict[@]}" \
    --out "$work/predict-two.jsonl" > "$work/predict-two.rank$r.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || { echo "FAIL: a rank of predict failed"; tail -n 5 "$work"/predict-two.rank*.log; exit 1; }; done
grep -q "data-parallel: 2 ranks" "$work/predict-two.rank0.log" || { echo "FAIL: predict did not run data-parallel"; exit 1; }
cmp "$work/predict-one.jsonl" "$work/predict-two.jsonl" || { echo "FAIL: the two-rank predictions differ"; exit 1; }
grep "wrote" "$work/predict-two.rank0.log" | sed 's/, [0-9]* inputs\/s//'
# A failure on one rank only (rank 0 cannot create its output file: its folder would be inside a
# file) stops both at once, rank 1 naming rank 0, instead of leaving rank 1 waiting in a collective
# until the timeout. The timeout is 300 s here, so that a loaded machine's slow start (seconds)
# and that wait cannot be confused; each rank's exit status and time are kept for the report.
p=$(port); pids=(); start=$(date +%s)
for r in 0 1; do
  (
    rc=0
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout -s KILL 200 "$refit" "${predict[@]}" \
      --set training.distributed.timeout_s=300 --out "$work/one.log/predict.jsonl" > "$work/predict-fail.rank$r.log" 2>&1 \
      || rc=$?
    echo "rank $r exited $rc after $(( $(date +%s) - start )) s" > "$work/predict-fail.rank$r.end"
  ) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
elapsed=$(( $(date +%s) - start ))
report() { for r in 0 1; do cat "$work/predict-fail.rank$r.end"; tail -n 5 "$work/predict-fail.rank$r.log"; done; }
for r in 0 1; do [ -f "$work/predict-fail.rank$r.end" ] || { echo "FAIL: rank $r's launcher left no exit record"; exit 1; }; done
if grep -q "exited 0 " "$work"/predict-fail.rank*.end; then echo "FAIL: a rank of the failing predict exited 0"; report; exit 1; fi
[ "$elapsed" -le 120 ] || { echo "FAIL: the failing predict took ${elapsed} s"; report; exit 1; }
grep -q "rank 0 failed, so every rank stops" "$work/predict-fail.rank1.log" \
  || { echo "FAIL: rank 1 does not name rank 0:"; cat "$work/predict-fail.rank1.log"; exit 1; }
echo "one rank failing: both ranks stopped after ${elapsed} s; rank 1: $(grep -o 'rank 0 failed.*' "$work/predict-fail.rank1.log" | cut -c1-100)"

echo "== 9. a rank whose rendezvous store never appears"
# c10d's client alone would retry for the timeout, sleep up to 30 s and retry for the timeout again.
p=$(port); start=$(date +%s)
if RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout -s KILL 100 "$refit" train "$recipe" \
  "${extra[@]}" --set output.dir="$work/no-store" --set training.distributed.timeout_s=3 > "$work/no-store.log" 2>&1; then
  echo "FAIL: a rank without a store exited 0"; exit 1
fi
elapsed=$(( $(date +%s) - start ))
want="rank 1 could not reach the rendezvous store at 127.0.0.1:$p within 3 s"
grep -q "$want" "$work/no-store.log" || { echo "FAIL: the error does not say: $want"; cat "$work/no-store.log"; exit 1; }
! grep -q "c10d" "$work/no-store.log" || { echo "FAIL: c10d's own retries ran:"; head -n 3 "$work/no-store.log"; exit 1; }
[ "$elapsed" -le 30 ] || { echo "FAIL: a 3 s timeout took ${elapsed} s"; exit 1; }
echo "rank 1 alone stopped after ${elapsed} s: $(grep -o 'could not reach.*' "$work/no-store.log" | cut -c1-120)"
# A MASTER_ADDR that does not resolve (yet, as under a cluster scheduler) is looked up again
# until timeout_s, then named (.invalid never resolves: RFC 6761).
start=$(date +%s)
if RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid MASTER_PORT=$p timeout -s KILL 100 "$refit" train \
  "$recipe" "${extra[@]}" --set output.dir="$work/no-host" --set training.distributed.timeout_s=3 > "$work/no-host.log" 2>&1; then
  echo "FAIL: a rank whose MASTER_ADDR does not resolve exited 0"; exit 1
fi
elapsed=$(( $(date +%s) - start ))
grep -q "cannot resolve MASTER_ADDR no-such-host.invalid" "$work/no-host.log" \
  || { echo "FAIL: the error does not name the host:"; cat "$work/no-host.log"; exit 1; }
[ "$elapsed" -ge 3 ] || { echo "FAIL: the name was looked up once only (${elapsed} s)"; exit 1; }
[ "$elapsed" -le 60 ] || { echo "FAIL: a 3 s timeout took ${elapsed} s"; exit 1; }
echo "an unresolvable MASTER_ADDR: rank 1 stopped after ${elapsed} s"

if [ -n "$dino_recipe" ]; then
  echo "== 7. DINO (its centre moved by the window's teacher outputs) in two ranks: as one process with the global batch"
  # Windows of 2, checkpoints every 3 steps: in two ranks the checkpoint due at step 3, inside a
  # window, waits for the window's end (step 4), so that it holds the whole world's state.
  dino=(--set data.train.config.limit=256 --set training.duration=6:step --set training.gradient_accumulation=2
        --set training.eval_at_start=false --set "evaluators=[]" --set "data.sets={}" --set training.checkpoint_every=3:step
        --set output.checkpoints.metric=loss --set output.checkpoints.keep_last=10 --set training.num_workers=0)
  # One process reads the same updates in micro-batches of the ranks' shape (8 x 4 = 2 ranks x 8 x 2):
  # under bf16 autocast, batches of 16 round otherwise than batches of 8, and AdamW's first,
  # sign-like updates magnify that in the LoRA factors (~1e-1 relative after 3 updates).
  "$refit" train "$dino_recipe" "${dino[@]}" --set output.dir="$work/dino-one" --set training.batch_size=8 \
    --set training.gradient_accumulation=4 --set training.duration=12:step --set training.checkpoint_every=6:step \
    > "$work/dino-one.log" 2>&1 || { tail -20 "$work/dino-one.log"; exit 1; }
  p=$(port); pids=()
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "$refit" train "$dino_recipe" "${dino[@]}" \
      --set output.dir="$work/dino-two" --set training.batch_size=8 > "$work/dino-two.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { echo "FAIL: a rank of the DINO run failed"; tail -n 5 "$work"/dino-two.rank*.log; exit 1; }; done
  [ "$(ls "$work/dino-two/checkpoints" | grep '^step-' | tr '\n' ' ')" = "step-00000004 step-00000006 " ] \
    || { echo "FAIL: two ranks' checkpoints: $(ls "$work/dino-two/checkpoints" | tr '\n' ' ') (want steps 4 and 6)"; exit 1; }
  "$diff" "$work/dino-one/checkpoints/step-00000012/state.safetensors" \
          "$work/dino-two/checkpoints/step-00000006/state.safetensors" 1e-6 objective/center
  "$diff" "$(final dino-one)" "$(final dino-two)" 1e-6
fi
echo "OK"
