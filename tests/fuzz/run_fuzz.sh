#!/usr/bin/env bash
# run_fuzz.sh TARGET SOURCE_DIR WORK_DIR SECONDS TORCH_PREFIX [BUILD_DIR]
# Builds the libFuzzer target tests/fuzz/fuzz_TARGET.cpp with clang (-fsanitize=fuzzer,address)
# and runs it for SECONDS on a corpus seeded from the repository's files. Each source is compiled
# once into WORK_DIR/obj (again when it or a project header it includes changes: clang -MMD), so
# targets share objects and a rerun only links. A target whose reader pulls in much of the
# framework (checkpoint) links the rest from the gcc-built refit_core of BUILD_DIR (libstdc++ is
# the ABI of both compilers). Exits 77 (ctest: skipped) when clang or its libFuzzer runtime is
# absent, or when the target needs BUILD_DIR's refit_core and it is not there.
set -euo pipefail
target="$1"; src="$2"; work="$3"; seconds="$4"; torch="$5"; build="${6:-}"
clang=$(command -v clang++ || true)
if [ -z "$clang" ] || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$clang" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "SKIP: clang++ with libFuzzer is not installed (Debian: apt-get install clang)"; exit 77
fi
corpus="$work/corpus-$target"
mkdir -p "$corpus"
bin="$work/fuzz_$target"
seed() { cp "$1" "$corpus/seed-$(echo "${1#$src/}" | tr / _)"; }
libs=(-L "$torch/lib" -ltorch_cpu -lc10 -Wl,-rpath,"$torch/lib")
env=()
includes=()  # a target's own include folders
case "$target" in
  safetensors)
    sources=(framework/io/safetensors.cpp framework/io/pread_full.cpp framework/io/atomic_output.cpp framework/io/fault.cpp)
    find "$src/tests/golden" -name '*.safetensors' -size -200k | while read -r f; do seed "$f"; done ;;
  gguf)
    sources=(framework/io/gguf.cpp framework/io/pread_full.cpp)
    find "$src/tests/golden/gguf" -name '*.gguf' -size -64k | while read -r f; do seed "$f"; done ;;
  chat_template)
    # The template engine, its value semantics and the conversation renderer (ICU: case mapping).
    sources=(plugins/text/jinja.cpp plugins/text/jinja_values.cpp plugins/text/chat_template.cpp)
    includes=(-I "$src/plugins")
    libs+=(-licuuc)
    find "$src/tests/golden/chat_templates" -name '*.jinja' | while read -r f; do seed "$f"; done ;;
  recipe)
    sources=(framework/core/recipe.cpp framework/core/recipe_parser.cpp framework/core/duration.cpp)
    find "$src/recipes" "$src/tests/recipes" -name '*.json' | while read -r f; do seed "$f"; done
    # One seed with --set overrides (after a NUL byte): the fuzzer mutates those as well.
    { cat "$src/tests/recipes/two-inputs.json"
      printf '\0training.seed=3\0models.0.name=x\0training.precision=bf16-mixed'; } > "$corpus/seed-overrides" ;;
  adapter)
    sources=(framework/io/adapter_files.cpp framework/io/safetensors.cpp framework/io/pread_full.cpp framework/io/atomic_output.cpp framework/io/fault.cpp
             plugins/lora/lora.cpp plugins/lora/fused_delta.cpp plugins/lora/cpu_small_mm.cpp)
    libs+=(-lre2)
    # Seeds: each PEFT folder's adapter_config.json, a NUL byte, its adapter_model.safetensors.
    find "$src/tests" -name adapter_config.json | while read -r c; do
      d=$(dirname "$c"); [ "$(stat -c %s "$d/adapter_model.safetensors")" -lt 20000 ] || continue
      { cat "$c"; printf '\0'; cat "$d/adapter_model.safetensors"; } > "$corpus/seed-$(echo "${d#$src/}" | tr / _)"
    done ;;
  tokenizer_json)
    # No LibTorch: the tokenizer library's sources and ICU.
    sources=(plugins/text/byte_bpe.cpp plugins/text/byte_bpe_load.cpp plugins/text/byte_bpe_split.cpp plugins/text/read_file.cpp)
    libs=(-licui18n -licuuc -licudata)
    includes=(-I "$src/plugins")
    # Seeds: each tiny tokenizer.json, a NUL byte, a text with special tokens, digits and odd bytes.
    for f in "$src"/tests/golden/byte_bpe/tiny_*.tokenizer.json; do
      { cat "$f"; printf '\0<s>Hello world 12345\t\r\n  <|user|> caf\xc3\xa9 \xe2\x82 end</s>'; } > "$corpus/seed-$(basename "$f")"
    done ;;
  model_folder)
    # No LibTorch: the sentence-transformers settings a bert model folder declares.
    sources=(plugins/text/declared_pooling.cpp plugins/text/declared_max_length.cpp)
    libs=()
    includes=(-I "$src/plugins")
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
    # No LibTorch: the per-shape decision store (nlohmann/json, header-only).
    sources=(framework/precision/shape_routing.cpp)
    libs=()
    printf '%s\n' '{"format": "refit-bf16-shape-routing/1", "decisions": {"mm 64x64 64x8": {"route": "native", "native_seconds": 1.3e-05, "fp32_seconds": 1.9e-05, "native_given_up": false}, "convolution 64x1x32x32 64x1x4x4": {"route": "fp32", "native_seconds": 0.0023, "fp32_seconds": 0.00025, "native_given_up": true}}}' > "$corpus/seed-store.json" ;;
  checkpoint)
    core="$build/framework/librefit_core.a"
    if [ -z "$build" ] || [ ! -f "$core" ]; then
      echo "SKIP: the checkpoint target links refit_core: pass a build folder where it is built ($core)"; exit 77
    fi
    # Instrumented (coverage-guided): the reader, the gradient scaler's and the RNG's
    # load_state_dict (the optimizer's comes from refit_core: clang before 16 refuses its lambdas'
    # captures of structured bindings in C++17, which gcc accepts).
    sources=(framework/train/checkpoint.cpp framework/io/safetensors.cpp framework/io/pread_full.cpp framework/io/atomic_output.cpp framework/io/fault.cpp
             framework/precision/grad_scaler.cpp framework/train/rng.cpp)
    # refit_core links the tokenizer library (refit generate) and the GGUF reader, in that order.
    libs=("$core" "$build/plugins/text/librefit_text.a" "$build/framework/librefit_gguf.a" -licui18n -licuuc -lre2 -ldl
          -lpthread "${libs[@]}")
    # refit_core is compiled with OpenMP (at::parallel_for): the wheel's libgomp, the one its
    # LibTorch uses (clang's -fopenmp would bring LLVM's libomp beside it).
    gomp="$torch/lib/libgomp.so.1"
    [ -f "$gomp" ] || gomp=-lgomp
    libs+=("$gomp")
    # refit_core's unity batches put CUDA-graph and stream code beside what the harness needs:
    # with LibTorch's CUDA build, link its CUDA libraries and the wheel's CUDA runtime too.
    cudart=$(ls "$torch"/../nvidia/cu13/lib/libcudart.so.* 2>/dev/null | head -1)
    if [ -f "$torch/lib/libtorch_cuda.so" ] && [ -n "$cudart" ]; then
      libs+=(-ltorch_cuda -lc10_cuda "$cudart")
    fi
    env=(FUZZ_SEED_DIR="$corpus") ;;  # the harness writes its own checkpoint there
  *) echo "unknown fuzz target $target"; exit 2 ;;
esac
sources=("tests/fuzz/fuzz_$target.cpp" "${sources[@]}")
flags=(-std=c++17 -O1 -g -I "$src/framework" -I "$src/include" "${includes[@]}"
       -isystem "$torch/include" -isystem "$torch/include/torch/csrc/api/include")
objects=()
# Through ccache when it is installed (scripts/env.sh sets CCACHE_BASEDIR): a fresh clone on a
# machine that built the targets before compiles nothing.
compile="$clang"
command -v ccache > /dev/null && compile="ccache $clang"
relink=0
[ -x "$bin" ] || relink=1
for s in "${sources[@]}"; do
  o="$work/obj/${s%.cpp}.o"; d="${o%.o}.d"; objects+=("$o")
  stale=0
  [ -f "$o" ] && [ -f "$d" ] || stale=1
  if [ "$stale" = 0 ]; then  # the source and every project header it included (-MMD skips -isystem ones)
    for dep in $(sed -e 's/\\$//' -e 's/^[^:]*://' "$d"); do [ "$dep" -nt "$o" ] && { stale=1; break; }; done
  fi
  if [ "$stale" = 1 ]; then
    echo "compiling $s"
    mkdir -p "$(dirname "$o")"
    $compile "${flags[@]}" -fsanitize=fuzzer-no-link,address -MMD -MF "$d" -c "$src/$s" -o "$o"
  fi
  [ "$o" -nt "$bin" ] && relink=1
done
[ -n "$build" ] && [ "$target" = checkpoint ] && [ "$core" -nt "$bin" ] && relink=1
if [ "$relink" = 1 ]; then
  echo "linking $bin"
  "$clang" -fsanitize=fuzzer,address "${objects[@]}" "${libs[@]}" -o "$bin"
fi
# -rss_limit_mb: LibTorch's CPU allocator and ASan's shadow need more than libFuzzer's 2 GiB default.
env "${env[@]}" "$bin" -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$work/crash-$target-" "$corpus" 2>&1 |
  grep -E "^(#[0-9]+.*(INITED|DONE)|stat::number_of_executed_units|stat::average_exec_per_sec|==[0-9]+==ERROR|SUMMARY)|terminate called|what\(\)" || true
ls "$work"/crash-"$target"-* >/dev/null 2>&1 && { echo "FAIL: libFuzzer found a crash: $(ls "$work"/crash-"$target"-*)"; exit 1; }
echo "OK: no crash in $seconds s"
