#!/usr/bin/env python3
"""Checks that framework/'s folders include only folders of a lower layer (no cycles, nothing
upward). Prints every offending #include with its file and line; exits 1 if there is one.

  python3 scripts/check_layers.py [REPO_ROOT]

The layers, lowest first (docs/architecture.md). A folder may include its own headers, the SDK
(refit/...) and any folder in a lower layer; a folder missing from the table is an error too, and
so is a docs/architecture.md whose sentence of the layers lists other ones.
"""
import pathlib
import re
import sys

LAYERS = [
    {"install"},                              # where the running install keeps its libraries
    {"cuda"},                                 # LibTorch's CUDA half, loaded at run time (cuda_support.h)
    {"precision", "io", "memory", "perf"},  # numerics, files, memory, FLOP counts: no other framework folder
    {"quant"},                                # quantized weights (their few-row products are precision's kernels)
    {"core"},                                 # recipes, durations, the plugin loader
    {"distributed", "model", "data"},         # process groups, the model registry, loaders
    {"train", "callbacks", "evaluators", "objectives"},  # the loop and what it calls
    {"run"},                                  # assembly of a run from a recipe
    {"cli"},                                  # the command line
]
RANK = {folder: i for i, layer in enumerate(LAYERS) for folder in layer}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z_]+)/')
# docs/architecture.md: "framework/'s folders form layers, lowest first: `a`, `b`; `c`; ... `z`."
DOCUMENTED = re.compile(r"framework/'s folders form layers, lowest first:(.*?)\.\s", re.S)


def documented_layers(root: pathlib.Path) -> list:
    """The layers docs/architecture.md names: ';' between layers, ',' within one."""
    m = DOCUMENTED.search((root / "docs" / "architecture.md").read_text())
    if not m:
        return []
    return [set(re.findall(r"`([a-z_]+)`", layer)) for layer in m.group(1).split(";")]


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    framework = root / "framework"
    folders = {p.name for p in framework.iterdir() if p.is_dir()}
    problems = [f"framework/{f}/: not in scripts/check_layers.py's layers" for f in sorted(folders - RANK.keys())]
    documented = documented_layers(root)
    if documented != LAYERS:
        shown = lambda layers: "; ".join(", ".join(sorted(layer)) for layer in layers)
        problems.append(f"docs/architecture.md lists the layers as [{shown(documented)}], "
                        f"this script as [{shown(LAYERS)}]")
    edges = set()
    for path in sorted(framework.rglob("*")):
        if path.suffix not in (".h", ".cpp") or not path.is_file():
            continue
        here = path.relative_to(framework).parts[0]
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m or m.group(1) not in folders or m.group(1) == here:
                continue
            there = m.group(1)
            edges.add((here, there))
            if here in RANK and there in RANK and RANK[there] >= RANK[here]:
                problems.append(f"{path.relative_to(root)}:{number}: {here} (layer {RANK[here]}) includes "
                                f"{there} (layer {RANK[there]}): {line.strip()}")
    print(f"{len(edges)} folder include edges: " + ", ".join(f"{a}->{b}" for a, b in sorted(edges)))
    for p in problems:
        print(p)
    print("OK: every include goes down a layer" if not problems else f"FAIL: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
