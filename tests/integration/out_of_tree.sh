#!/usr/bin/env bash
# out_of_tree.sh BUILD_DIR WORK_DIR PLUGIN_SOURCE_DIR
# Installs refit from BUILD_DIR into WORK_DIR/prefix, configures and builds the plugin sources
# against that installed SDK (find_package(refit), refit::sdk only), then has the *installed*
# refit load the plugins and train recipes that use them: hello_linear; the two-input model on
# padded sequences with a renamed field; (IA)^3 on a frozen bf16 MLP (the docs/plugins.md
# walkthroughs). The plugins compile unoptimised (no build type): what is checked is that they
# build against the SDK and load (the test 26 s instead of 29 s, cold, on the 2-core Xeon).
set -euo pipefail
build="$1"; work="$2"; src="$3"
rm -rf "$work"; mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
torch_dir=$(grep -E '^Torch_DIR' "$build/CMakeCache.txt" | cut -d= -f2)
launcher=$(grep -E '^CMAKE_CXX_COMPILER_LAUNCHER' "$build/CMakeCache.txt" | cut -d= -f2 || true)
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE= \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DTorch_DIR="$torch_dir" ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher} >/dev/null
cmake --build "$work/build"
cat > "$work/recipe.json" <<JSON
{
  "plugins": {"load": ["hello", "datasets"], "paths": ["build"]},
  "models": [{"name": "m", "type": "hello_linear", "config": {"features": 4}, "trainable": true}],
  "data": {"train": {"type": "synthetic", "config": {"num_features": 4}}},
  "objective": {"type": "classification", "config": {"models": ["m"]}},
  "training": {"duration": "2:step", "batch_size": 8},
  "output": {"dir": "run"}
}
JSON
# The installed refit finds its CUDA support in <prefix>/<libdir>/refit (where LibTorch has CUDA).
if cuda_lib=$(find "$work/prefix" -name librefit_cuda.so | head -1) && [ -n "$cuda_lib" ]; then
  REFIT_CUDA=on "$work/prefix/bin/refit" --version | grep -q "CUDA support: loaded (REFIT_CUDA=on)" \
    || { echo "FAIL: the installed refit did not load $cuda_lib"; exit 1; }
fi
"$work/prefix/bin/refit" plugins --path "$work/build" | tee "$work/plugins.txt"
grep -q "model      hello_linear" "$work/plugins.txt"
"$work/prefix/bin/refit" validate "$work/recipe.json"
"$work/prefix/bin/refit" train "$work/recipe.json" | tail -3
grep -q "model      two_tower" "$work/plugins.txt"
grep -q "dataset    sequences" "$work/plugins.txt"
grep -q "adapter    ia3" "$work/plugins.txt"

cat > "$work/two-input.json" <<JSON
{
  "plugins": {"load": ["two_input"], "paths": ["build"]},
  "models": [{"name": "net", "type": "two_tower", "inputs": {"side": "extra"}, "trainable": true}],
  "data": {"train": {"type": "sequences", "config": {"n": 64}}},
  "objective": {"type": "classification", "config": {"models": ["net"]}},
  "training": {"duration": "4:step", "batch_size": 8},
  "output": {"dir": "run-two-input"}
}
JSON
"$work/prefix/bin/refit" train "$work/two-input.json" | grep "done: 4 steps"

cat > "$work/ia3.json" <<JSON
{
  "plugins": {"load": ["ia3", "vision", "datasets"], "paths": ["build"]},
  "models": [{"name": "net", "type": "mlp", "config": {"in_features": 8, "hidden": [16], "out_features": 3},
              "trainable": false, "dtype": "bfloat16",
              "adapters": [{"type": "ia3", "config": {"target_modules": ["layers.0", "layers.1"]}}]}],
  "data": {"train": {"type": "synthetic", "config": {"num_features": 8, "num_classes": 3}}},
  "objective": {"type": "classification", "config": {"models": ["net"]}},
  "training": {"duration": "4:step", "batch_size": 8, "precision": "bf16-mixed"},
  "output": {"dir": "run-ia3"}
}
JSON
"$work/prefix/bin/refit" inspect "$work/ia3.json" --parameters | tee "$work/ia3-inspect.txt"
grep -Eq "^net +layers\.0\.ia3_default\.ia3_l +yes +float32 +\[16\]" "$work/ia3-inspect.txt"
grep -Eq "^net +layers\.0\.weight +no +bfloat16" "$work/ia3-inspect.txt"
"$work/prefix/bin/refit" train "$work/ia3.json" | grep "done: 4 steps"
echo "out-of-tree plugins: OK"
