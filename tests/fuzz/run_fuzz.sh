#!/usr/bin/env bash
# run_fuzz.sh TARGET SOURCE_DIR WORK_DIR SECONDS FUZZ_BIN_DIR
# Runs the libFuzzer target FUZZ_BIN_DIR/fuzz_TARGET (built by the build: tests/fuzz/fuzz_targets.cmake,
# `cmake --build --preset default --target refit_fuzz_TARGET`) for SECONDS on a corpus in WORK_DIR
# seeded from the repository's files. Exits 77 (ctest: skipped) when the target was not built
# (no clang++ with libFuzzer when the build was configured).
set -euo pipefail
target="$1"; src="$2"; work="$3"; seconds="$4"; bins="$5"
bin="$bins/fuzz_$target"
if [ ! -x "$bin" ]; then
  echo "SKIP: $bin was not built (clang++ with libFuzzer is needed when configuring; Debian: apt-get install clang)"
  exit 77
fi
corpus="$work/corpus-$target"
mkdir -p "$corpus"
seed() { cp "$1" "$corpus/seed-$(echo "${1#$src/}" | tr / _)"; }
env=()
case "$target" in
  safetensors)
    find "$src/tests/golden" -name '*.safetensors' -size -200k | while read -r f; do seed "$f"; done ;;
  gguf)
    find "$src/tests/golden/gguf" -name '*.gguf' -size -64k | while read -r f; do seed "$f"; done ;;
  chat_template)
    find "$src/tests/golden/chat_templates" -name '*.jinja' | while read -r f; do seed "$f"; done ;;
  recipe)
    find "$src/recipes" "$src/tests/recipes" -name '*.json' | while read -r f; do seed "$f"; done
    # One seed with --set overrides (after a NUL byte): the fuzzer mutates those as well.
    { cat "$src/tests/recipes/two-inputs.json"
      printf '\0training.seed=3\0models.0.name=x\0training.precision=bf16-mixed'; } > "$corpus/seed-overrides" ;;
  adapter)
    # Seeds: each PEFT folder's adapter_config.json, a NUL byte, its adapter_model.safetensors.
    find "$src/tests" -name adapter_config.json | while read -r c; do
      d=$(dirname "$c")
      [ -f "$d/adapter_model.safetensors" ] && [ "$(stat -c %s "$d/adapter_model.safetensors")" -lt 20000 ] || continue
      { cat "$c"; printf '\0'; cat "$d/adapter_model.safetensors"; } > "$corpus/seed-$(echo "${d#$src/}" | tr / _)"
    done ;;
  tokenizer_json)
    # Seeds: each tiny tokenizer.json, a NUL byte, a text with special tokens, digits and odd bytes.
    for f in "$src"/tests/golden/byte_bpe/tiny_*.tokenizer.json; do
      { cat "$f"; printf '\0<s>Hello world 12345\t\r\n  <|user|> caf\xc3\xa9 \xe2\x82 end</s>'; } > "$corpus/seed-$(basename "$f")"
    done ;;
  model_folder)
    # Seeds: all-MiniLM-L6-v2's four files, then one without Normalize and with a max pooling.
    printf '%s\0%s\0%s\0%s' \
      '[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}, {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}, {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]' \
      '{"word_embedding_dimension": 384, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false}' \
      '{"max_seq_length": 256, "do_lower_case": false}' \
      '{"do_lower_case": true, "model_max_length": 512, "tokenize_chinese_chars": true}' > "$corpus/seed-minilm"
    printf '%s\0%s\0\0%s' \
      '[{"path": "", "type": "Transformer"}, {"path": "1_Pooling", "type": "Pooling"}]' \
      '{"pooling_mode_max_tokens": true}' '{"model_max_length": 1000000000000000019884624838656}' > "$corpus/seed-max" ;;
  shape_store)
    printf '%s\n' '{"format": "refit-bf16-shape-routing/1", "decisions": {"mm 64x64 64x8": {"route": "native", "native_seconds": 1.3e-05, "fp32_seconds": 1.9e-05, "native_given_up": false}, "convolution 64x1x32x32 64x1x4x4": {"route": "fp32", "native_seconds": 0.0023, "fp32_seconds": 0.00025, "native_given_up": true}}}' > "$corpus/seed-store.json" ;;
  elf_section)
    # Small ELF libraries of the system, one with a .refit_cuda_build section added (binutils'
    # objcopy, where it is installed), and an ELF identification alone.
    for f in /usr/lib/x86_64-linux-gnu/libdl.so.2 /usr/lib/x86_64-linux-gnu/librt.so.1 /lib64/libdl.so.2; do
      [ -f "$f" ] && [ "$(stat -L -c %s "$f")" -lt 65536 ] && seed "$f" && small="$f"
    done
    if [ -n "${small:-}" ] && command -v objcopy >/dev/null; then
      printf 'refit 0.6.0, LibTorch 2.11.0, interface 0123456789abcdef' > "$work/build-text"
      objcopy --add-section .refit_cuda_build="$work/build-text" "$small" "$corpus/seed-with-build-text"
    fi
    printf '\177ELF\2\1\1' > "$corpus/seed-header" ;;
  checkpoint)
    env=(FUZZ_SEED_DIR="$corpus") ;;  # the harness writes its own checkpoint there
  *) echo "unknown fuzz target $target"; exit 2 ;;
esac
# -rss_limit_mb: LibTorch's CPU allocator and ASan's shadow need more than libFuzzer's 2 GiB default.
# A crash input an earlier run left is run again first: once it passes (the bug fixed) it joins
# the corpus as a regression input; one that still fails stops this run at once, with its report.
# (libFuzzer's slow-unit files are no failures: they join the corpus as they are.)
for c in "$work"/crash-"$target"-*; do
  [ -e "$c" ] || continue
  case "$c" in
    *slow-unit-*) mv "$c" "$corpus/$(basename "$c")"; continue ;;
  esac
  if env "${env[@]}" "$bin" -rss_limit_mb=4096 -timeout=60 "$c" > "$work/replay.log" 2>&1; then
    echo "fixed: $(basename "$c") passes now; kept in the corpus"
    mv "$c" "$corpus/fixed-$(basename "$c")"
  else
    tail -n 30 "$work/replay.log"
    echo "FAIL: $c, saved by an earlier run, still fails"
    exit 1
  fi
done
set +e
env "${env[@]}" "$bin" -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=60 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$work/crash-$target-" "$corpus" 2>&1 |
  grep -E "^(#[0-9]+.*(INITED|DONE)|stat::number_of_executed_units|stat::average_exec_per_sec|==[0-9]+==ERROR|SUMMARY)|terminate called|what\(\)"
status=${PIPESTATUS[0]}
set -e
# A slow unit (over -timeout's report threshold, not a hang) is no finding: it joins the corpus.
for c in "$work"/crash-"$target"-*slow-unit-*; do [ -e "$c" ] && mv "$c" "$corpus/$(basename "$c")"; done
ls "$work"/crash-"$target"-* >/dev/null 2>&1 && { echo "FAIL: libFuzzer found a crash: $(ls "$work"/crash-"$target"-*)"; exit 1; }
# A target that did not start (a library it cannot load) or stopped early leaves no crash file.
[ "$status" -eq 0 ] || { echo "FAIL: the fuzz target exited with status $status"; exit 1; }
echo "OK: no crash in $seconds s"
