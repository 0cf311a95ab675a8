#!/usr/bin/env bash
# host_allocator_same.sh REFIT RECIPES WORKDIR
# `refit train` with the caching host allocator (the default) and with the system allocator
# (--host-cache-mib 0) must train the same model: same metrics, same checkpoint bytes. Only the
# first run reports the cache.
set -euo pipefail
refit="$1"; recipes="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
"$refit" train "$recipes/synthetic-mlp.json" --set output.dir="$work/cached" > "$work/cached.log" 2>&1 || { cat "$work/cached.log"; fail "cached run"; }
"$refit" train "$recipes/synthetic-mlp.json" --set output.dir="$work/system" --host-cache-mib 0 > "$work/system.log" 2>&1 || { cat "$work/system.log"; fail "system run"; }
cat "$work/cached.log"
grep -Eq "^host allocator: [0-9]+ CPU allocations, [0-9.]+ % reused from the cache" "$work/cached.log" || fail "no host allocator line"
grep -q "^host allocator: LibTorch's (no cache; malloc: " "$work/system.log" || fail "--host-cache-mib 0 does not say the cache is off"
grep -q '"malloc"' "$work/system/summary.json" || fail "summary.json lacks malloc"
grep -q '"host_allocator"' "$work/cached/summary.json" || fail "summary.json lacks host_allocator"
# Same numbers: the metrics lines of the two runs and every checkpoint file, byte for byte.
diff <(grep -E "^(val|test) @" "$work/cached.log") <(grep -E "^(val|test) @" "$work/system.log") || fail "metrics differ"
a=$(cd "$work/cached/checkpoints" && find . -name '*.safetensors' | sort); b=$(cd "$work/system/checkpoints" && find . -name '*.safetensors' | sort)
[ -n "$a" ] && [ "$a" == "$b" ] || fail "checkpoint files differ: $a vs $b"
for f in $a; do cmp "$work/cached/checkpoints/$f" "$work/system/checkpoints/$f" || fail "$f differs"; done
echo "OK: same metrics and checkpoints with and without the host cache ($(echo $a | wc -w) files)"
