#!/usr/bin/env bash
# runtime_targets.sh REPO_ROOT: scripts/refit builds the CLI and only the in-tree plugins the
# command's recipe loads, and everything (refit_runtime) when it cannot tell.
set -u
root="$1"
recipes="$root/recipes"
status=0
check() {  # check EXPECTED ARGS...
  local want="$1"; shift
  local got; got=$(python3 "$root/scripts/runtime_targets.py" "$root" "$@")
  echo "$* -> $got"
  [ "$got" = "$want" ] || { echo "FAIL: expected $want"; status=1; }
}
check "refit refit_plugin_vision refit_plugin_datasets refit_plugin_lora" train "$recipes/quickstart.json" --set training.seed=3
check "refit refit_plugin_text refit_plugin_vision refit_plugin_lora" validate "$recipes/text/minilm-lora-bf16.json"
# The values of --checkpoint, --out, ... are not the recipe.
check "refit refit_plugin_vision refit_plugin_datasets refit_plugin_lora refit_plugin_dino" \
  export --checkpoint "$recipes" "$recipes/fashion-mnist/dino-bf16.json" --format peft --out x
# An out-of-tree plugin (found on the search path at run time) needs no target.
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo '{"plugins": {"load": ["vision", "ia3"]}}' > "$tmp/r.json"
check "refit refit_plugin_vision" train "$tmp/r.json"
# Cannot tell: no recipe, a --set on plugins, a recipe that is not JSON or does not exist.
check refit_runtime plugins
check refit_runtime train "$recipes/quickstart.json" --set 'plugins.load=["vision"]'
check refit_runtime train "$root/README.md"
check refit_runtime train "$tmp/missing.json"
echo '{"plugins": {"load": "vision"}}' > "$tmp/bad.json"
check refit_runtime train "$tmp/bad.json"
exit $status
