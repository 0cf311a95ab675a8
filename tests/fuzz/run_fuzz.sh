#!/usr/bin/env bash
# run_fuzz.sh TARGET SOURCE_DIR WORK_DIR SECONDS TORCH_PREFIX
# Builds the libFuzzer target tests/fuzz/fuzz_TARGET.cpp with clang (-fsanitize=fuzzer,address;
# rebuilt when a source is newer than the binary) and runs it for SECONDS on a corpus seeded from
# the repository's files. Exits 77 (ctest: skipped) when clang or its libFuzzer runtime is absent.
set -euo pipefail
target="$1"; src="$2"; work="$3"; seconds="$4"; torch="$5"
clang=$(command -v clang++ || true)
if [ -z "$clang" ] || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$clang" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "SKIP: clang++ with libFuzzer is not installed (Debian: apt-get install clang)"; exit 77
fi
mkdir -p "$work/corpus-$target"
bin="$work/fuzz_$target"
case "$target" in
  safetensors)
    sources=("$src/tests/fuzz/fuzz_safetensors.cpp" "$src/framework/io/safetensors.cpp" "$src/framework/io/fault.cpp")
    find "$src/tests/golden" -name '*.safetensors' -size -200k | while read -r f; do
      cp "$f" "$work/corpus-$target/seed-$(echo "${f#$src/}" | tr / _)"; done ;;
  *) echo "unknown fuzz target $target"; exit 2 ;;
esac
rebuild=0
[ -x "$bin" ] || rebuild=1
for s in "${sources[@]}" "$src/framework/io/safetensors.h"; do [ "$s" -nt "$bin" ] && rebuild=1; done
if [ "$rebuild" = 1 ]; then
  echo "building $bin with $clang"
  "$clang" -std=c++17 -O1 -g -fsanitize=fuzzer,address -I "$src/framework" -I "$src/include" \
    -isystem "$torch/include" -isystem "$torch/include/torch/csrc/api/include" "${sources[@]}" \
    -L "$torch/lib" -ltorch_cpu -lc10 -Wl,-rpath,"$torch/lib" -o "$bin"
fi
# -rss_limit_mb: LibTorch's CPU allocator and ASan's shadow need more than libFuzzer's 2 GiB default.
"$bin" -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$work/crash-$target-" "$work/corpus-$target" 2>&1 | grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)" || true
ls "$work"/crash-"$target"-* >/dev/null 2>&1 && { echo "FAIL: libFuzzer found a crash: $(ls "$work"/crash-"$target"-*)"; exit 1; }
echo "OK: no crash in $seconds s"
