#!/usr/bin/env bash
# out_of_tree.sh BUILD_DIR WORK_DIR PLUGIN_SOURCE_DIR
# Installs refit from BUILD_DIR into WORK_DIR/prefix, configures and builds the plugin source
# against that installed SDK (find_package(refit), refit::sdk only), then has the *installed*
# refit load the plugin and validate a recipe that uses its model.
set -euo pipefail
build="$1"; work="$2"; src="$3"
rm -rf "$work"; mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
torch_dir=$(grep -E '^Torch_DIR' "$build/CMakeCache.txt" | cut -d= -f2)
launcher=$(grep -E '^CMAKE_CXX_COMPILER_LAUNCHER' "$build/CMakeCache.txt" | cut -d= -f2 || true)
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
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
"$work/prefix/bin/refit" plugins --path "$work/build" | tee "$work/plugins.txt"
grep -q "model      hello_linear" "$work/plugins.txt"
"$work/prefix/bin/refit" validate "$work/recipe.json"
"$work/prefix/bin/refit" train "$work/recipe.json" | tail -3
echo "out-of-tree plugin: OK"
