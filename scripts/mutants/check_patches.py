#!/usr/bin/env python3
"""The planted bugs' list against their patches (ctest `mutants: ...`; no build, under a second).

  python3 scripts/mutants/check_patches.py [REPO_ROOT]

Every row of mutants.tsv names a patch that exists, its id is the patch's prefix and unique, and
every NN-*.patch has a row; each patch changes refit's code only (framework/, plugins/,
include/: a hunk of a doc or a script is one picked up by `git diff` by mistake); and each one
applies to this tree (`git apply --check`), so a change to a patched line is noticed when it is
made, not when the driver next runs that mutant. Exit 1 with every problem.
"""
import csv
import os
import pathlib
import re
import subprocess
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
here = root / "scripts" / "mutants"
problems = []
rows = [r for r in csv.reader(open(here / "mutants.tsv"), delimiter="\t") if r and not r[0].startswith("#")]
ids = [r[0] for r in rows]
for mutant_id in sorted({i for i in ids if ids.count(i) > 1}):
    problems.append(f"mutants.tsv: id {mutant_id} appears {ids.count(mutant_id)} times")
listed = set()
for r in rows:
    mutant_id, patch = r[0], r[1]
    listed.add(patch)
    if not patch.startswith(mutant_id + "-"):
        problems.append(f"mutants.tsv: {mutant_id}: its patch {patch} does not start with its id")
    path = here / patch
    if not path.is_file():
        problems.append(f"mutants.tsv: {mutant_id}: no patch {patch}")
        continue
    files = re.findall(r"^diff --git a/(\S+) b/", path.read_text(), re.M)
    if not files:
        problems.append(f"{patch}: changes no file")
    for f in files:
        if not f.startswith(("framework/", "plugins/", "include/")):
            problems.append(f"{patch}: changes {f}, which is not refit's code")
    check = subprocess.run(["git", "apply", "--check", str(path)], cwd=root, capture_output=True, text=True)
    if check.returncode != 0:
        problems.append(f"{patch}: does not apply to this tree (make it again): {check.stderr.strip()}")
for path in sorted(here.glob("*.patch")):
    if path.name not in listed:
        problems.append(f"{path.name}: has no row in mutants.tsv")
for p in problems:
    print("FAIL:", p)
print(f"{len(rows)} mutants: " + ("every patch listed, in refit's code, and applies" if not problems
                                    else f"{len(problems)} problem(s)"))
sys.exit(1 if problems else 0)
