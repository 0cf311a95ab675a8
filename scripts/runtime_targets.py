#!/usr/bin/env python3
"""Prints the build targets a `refit` command line needs: the CLI and the in-tree plugins its
recipe loads (`/plugins/load`). scripts/refit builds only these, so a first run does not wait
for plugins it will not open. Anything it cannot decide prints `refit_runtime` (the CLI and
every shipped plugin): a command without a recipe (`plugins`, `report`, `--help`), a recipe
that cannot be read, or a `--set` that touches `plugins`. Names not built in this tree
(out-of-tree plugins found on the search path) need no target.

usage: runtime_targets.py REPO_ROOT [refit arguments...]
"""
import json
import os
import sys

RECIPE_COMMANDS = {"train", "validate", "inspect", "export", "evaluate"}
# Options of those commands that take a value (framework/cli/main.cpp).
VALUE_OPTIONS = {"--checkpoint", "--format", "--out", "--dtype", "--split", "--host-cache-mib"}


def targets(root, args):
    if not args or args[0] not in RECIPE_COMMANDS:
        return None
    rest = args[1:]
    recipe = None
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--set" and i + 1 < len(rest):
            if rest[i + 1].lstrip().startswith("plugins"):
                return None
            i += 2
            continue
        if a in VALUE_OPTIONS:
            i += 2
            continue
        if a.startswith("--set="):
            if a[len("--set="):].lstrip().startswith("plugins"):
                return None
        elif not a.startswith("-") and recipe is None:
            recipe = a
        i += 1
    if recipe is None:
        return None
    try:
        with open(recipe, encoding="utf-8") as f:
            loads = json.load(f).get("plugins", {}).get("load", [])
    except (OSError, ValueError, AttributeError):
        return None  # the CLI reports the error itself
    if not isinstance(loads, list) or not all(isinstance(n, str) for n in loads):
        return None
    in_tree = [n for n in loads if os.path.isfile(os.path.join(root, "plugins", n, "CMakeLists.txt"))]
    return ["refit"] + ["refit_plugin_" + n for n in in_tree]


if __name__ == "__main__":
    chosen = targets(sys.argv[1], sys.argv[2:])
    print(" ".join(chosen if chosen is not None else ["refit_runtime"]))
