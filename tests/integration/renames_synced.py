#!/usr/bin/env python3
"""Every rename into place is durable, seen at the C library rather than through refit's own
fault points.

  renames_synced.py REFIT RECIPE WORK_DIR TRACE_LIBRARY

Trains RECIPE once (the kill test's: checkpoint saves, a retention delete, the metrics log,
`latest`) with TRACE_LIBRARY (tests/integration/sync_trace.cpp) preloaded, which logs each
successful rename and fsync / fdatasync with the synced descriptor's path. Then, for every
rename of OLD to NEW:
  - OLD was synced before the rename: a file's data (its own fsync), a folder's entries (a
    checkpoint's temporary folder, synced by the commits of the files in it), so the name never
    points at data a power loss can take back;
  - NEW's folder was synced after it, before the process ended: the rename itself survives.
Renames away of a delete (NEW named .deleting-*) are exempt: a power loss that undoes one loses
nothing. The kill test counts refit's own "write: folder synced" points; this sees a sync that
is skipped while its point remains (scripts/mutants/56).
"""
import os
import subprocess
import sys

refit, recipe, work, library = sys.argv[1:5]
os.makedirs(work, exist_ok=True)
trace = os.path.join(work, "sync-trace.tsv")
if os.path.exists(trace):
    os.remove(trace)
run = os.path.join(work, "run")
subprocess.run(["rm", "-rf", run], check=True)
env = dict(os.environ, LD_PRELOAD=library, REFIT_SYNC_TRACE=trace)
subprocess.run([refit, "train", recipe, "--set", f"output.dir={run}"], env=env, check=True, stdout=subprocess.DEVNULL)


def real(path):
    """One spelling per file: the folder's real path (a descriptor's path is one) and the name."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


events = [[e[0]] + [real(p) for p in e[1:]] for e in (line.rstrip("\n").split("\t") for line in open(trace))]
renames = [(i, e[1], e[2]) for i, e in enumerate(events) if e[0] == "rename"]
synced = [(i, e[1]) for i, e in enumerate(events) if e[0] == "fsync"]
problems = []
checked = 0
for i, old, new in renames:
    if os.path.basename(new).startswith(".deleting-"):
        continue
    checked += 1
    # A sync of this name counts only since it last came or went by a rename: a checkpoint's
    # temporary folder has the same name each time the same step is saved.
    since = max([j for j, a, b in renames if j < i and old in (a, b)], default=-1)
    if not any(since < j < i and path == old for j, path in synced):
        problems.append(f"{new}: renamed from {old}, which was not synced before the rename")
    folder = os.path.dirname(new)
    if not any(j > i and path == folder for j, path in synced):
        problems.append(f"{new}: its folder {folder} was not synced after the rename")
print(f"{len(events)} calls traced: {len(renames)} renames ({checked} into place), {len(synced)} syncs")
if checked < 5 or not any(os.path.basename(os.path.dirname(new)) == "checkpoints" and
                          os.path.basename(new).startswith("step-") for _, _, new in renames):
    problems.append("the trace holds too few renames into place, or no checkpoint folder's: is the library preloaded?")
for p in problems:
    print("FAIL:", p)
print("OK: every rename into place synced before and its folder after" if not problems else f"{len(problems)} problem(s)")
sys.exit(1 if problems else 0)
