#!/usr/bin/env bash
# generate.sh REFIT RECIPE WORK_DIR
# refit generate on the LLM recipe's base model (--checkpoint none): prompts on stdin stream to
# the terminal, greedy; the same prompts from a JSONL file (plain and chat records) are decoded in
# one left-padded batch and written one line each; a stop string cuts a completion; bad prompts
# are errors naming the line.
set -euo pipefail
refit="$1"; recipe="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
# fp32 weights as well as fp32 products: in the recipe's bf16 storage, the batch (left-padded,
# other product shapes) and the single prompt round differently, and greedy decoding may part
# where two logits are within bf16's noise (a fresh clone's first run did, at the first token).
common=(--checkpoint none --max-new-tokens 12 --set training.precision=fp32 --set models.0.dtype=float32)
printf '%s\n' 'What does "lexicon" mean as a noun?' | "$refit" generate "$recipe" "${common[@]}" | tee "$work/stream.txt"
grep -q '^> What does "lexicon" mean as a noun?$' "$work/stream.txt"
grep -Eq '^\[(eos|length), [0-9]+ tokens\]$' "$work/stream.txt"
cat > "$work/prompts.jsonl" <<'JSON'
{"prompt": "What does \"lexicon\" mean as a noun?"}
{"messages": [{"role": "system", "content": "Answer in one sentence."}, {"role": "user", "content": "Name a colour."}]}
JSON
"$refit" generate "$recipe" "${common[@]}" --prompts "$work/prompts.jsonl" --out "$work/out.jsonl" --batch-size 2
test "$(wc -l < "$work/out.jsonl")" = 2
grep -q '"id":0' "$work/out.jsonl" && grep -q '"id":1' "$work/out.jsonl"
grep -Eq '"finish_reason":"(eos|length)"' "$work/out.jsonl"
# The streamed completion of prompt 0 is the batch's (greedy, fp32; the batch pads it on the left).
streamed=$(sed -n '2p' "$work/stream.txt")
python3 - "$work/out.jsonl" "$streamed" <<'PY'
import json, sys
first = json.loads(open(sys.argv[1]).readline())
assert first["completion"].split("\n")[0] == sys.argv[2], (first["completion"], sys.argv[2])
PY
# A stop string: the completion ends before it.
word=$(printf '%s' "$streamed" | awk '{print $2}')
if [ -n "$word" ]; then
  printf '%s\n' 'What does "lexicon" mean as a noun?' |
    "$refit" generate "$recipe" "${common[@]}" --stop "$word" --out "$work/stop.jsonl"
  grep -q '"finish_reason":"stop"' "$work/stop.jsonl"
  ! grep -q "$word" <(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["completion"])' "$work/stop.jsonl")
fi
# Bad input: an unknown role names the line and the pointer.
echo '{"messages": [{"role": "robot", "content": "x"}]}' > "$work/bad.jsonl"
if "$refit" generate "$recipe" "${common[@]}" --prompts "$work/bad.jsonl" 2> "$work/bad.txt"; then
  echo "FAIL: an unknown role was accepted"; exit 1
fi
grep -q 'line 1.*/messages/0/role.*unknown role "robot"' "$work/bad.txt"
echo OK
