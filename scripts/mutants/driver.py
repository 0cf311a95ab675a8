#!/usr/bin/env python3
"""Mutation testing of refit's test suite: the engine behind scripts/mutants/run.sh.

Each mutant (mutants.tsv) is a small patch planting a bug that would break fine-tuning silently,
with the ctest selection that should catch it and the build targets that selection needs. For
each mutant: check that the files it patches carry no uncommitted change, `git apply` it, rebuild
the targets incrementally in build/, run the selection, and revert the patch - always, on a build
failure, a timeout or a signal too. A mutant is

  killed     the selection failed on the mutant (and passed on the unmutated tree),
  survived   the selection passed: no test noticed the bug,
  broken     the mutant did not build (a broken mutant, not a kill), its patch no longer
             applies, or its selection names no test,
  skipped    a file it patches has uncommitted changes (someone is editing it), or
  invalid    its selection fails on the unmutated tree as well (nothing to measure).

Standard library only. Exit status: 0 once every applied mutant was reverted, whatever the
results; 2 when a mutant could not be reverted (the working tree needs a look); 3 when the
unmutated tree does not build; 130 when interrupted (after reverting); 64 for a usage error.
"""
import argparse
import datetime
import fcntl
import os
import re
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(ROOT, "build")
WORK = os.path.join(BUILD, "mutants")  # logs and the lock; build/ is ignored by git
MANIFEST = os.path.join(HERE, "mutants.tsv")
SURVIVORS = os.path.join(HERE, "survivors.tsv")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


class Blocked:
    """Defers SIGINT/SIGTERM/SIGHUP while a patch is applied or reverted, so that applying and
    recording it (or reverting it) is never cut in half."""

    def __enter__(self):
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        return False


class Mutant:
    def __init__(self, mid, patch, targets, ctest, description):
        self.id, self.patch, self.description = mid, patch, description
        self.name = os.path.splitext(patch)[0]
        self.targets = targets.split()
        self.ctest = shlex.split(ctest)
        self.ctest_text = ctest
        self.path = os.path.join(HERE, patch)
        self.files = []
        self.result = ""
        self.detail = ""
        self.tests = 0
        self.skipped = 0
        self.failed = []
        self.build_s = 0.0
        self.test_s = 0.0


def read_manifest():
    mutants = []
    with open(MANIFEST, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            cols = line.split("\t")
            if len(cols) != 5:
                sys.exit(f"{MANIFEST}:{n}: expected 5 tab-separated columns (id, patch, targets, ctest, description)")
            mutants.append(Mutant(*cols))
    ids = [m.id for m in mutants]
    if len(set(ids)) != len(ids):
        sys.exit(f"{MANIFEST}: duplicate ids")
    return mutants


def read_survivor_notes():
    notes = {}
    if os.path.exists(SURVIVORS):
        with open(SURVIVORS, encoding="utf-8") as f:
            for line in f:
                if line.strip() and not line.startswith("#") and "\t" in line:
                    mid, why = line.rstrip("\n").split("\t", 1)
                    notes[mid] = why
    return notes


def git(*args, check=False):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=check)


def patched_files(m):
    r = git("apply", "--numstat", m.path)
    if r.returncode != 0:
        return None
    return [line.split("\t")[2] for line in r.stdout.splitlines() if line.count("\t") >= 2]


def is_applied(m):
    """True when the patch is in the working tree now (it reverts, and it does not apply again)."""
    return git("apply", "-R", "--check", m.path).returncode == 0 and git("apply", "--check", m.path).returncode != 0


def file_clean(path):
    tracked = git("ls-files", "--error-unmatch", "--", path).returncode == 0
    return tracked and git("diff", "--quiet", "HEAD", "--", path).returncode == 0


def run_logged(cmd, log, timeout, env=None):
    """Runs cmd (in its own process group, output appended to `log`); returns (rc, seconds, text).
    On a timeout or a signal the whole group is ended."""
    start = time.monotonic()
    with open(log, "a", encoding="utf-8", errors="replace") as out:
        out.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = 124
            out.write(f"\n[mutants] timed out after {timeout} s\n")
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except Exception:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
    return rc, time.monotonic() - start


def tail(path, lines=40):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def build(targets, log, timeout):
    return run_logged(["ninja", "-C", BUILD, *targets], log, timeout)


def ctest_env():
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "passive")  # the test preset's, for the listing too
    return env


def count_tests(args):
    r = subprocess.run(["ctest", "--preset", "cases", "-N", *args], cwd=ROOT, capture_output=True, text=True,
                       env=ctest_env())
    m = re.search(r"Total Tests:\s*(\d+)", r.stdout)
    return int(m.group(1)) if m else 0


def run_selection(args, log, timeout, jobs):
    # The test preset (CMakePresets.json) supplies the environment, the output on failure and the
    # per-test timeout; -j overrides its jobs when given.
    cmd = ["ctest", "--preset", "cases", "--no-tests=error", *args]
    if jobs:
        cmd += ["-j", str(jobs)]
    rc, seconds = run_logged(cmd, log, timeout, env=ctest_env())
    text = tail(log, 400)
    failed = re.findall(r"^\s*\d+ - (.+?) \((?:Failed|Timeout|Subprocess aborted|SEGFAULT|Exception|Not Run)[^)]*\)",
                        text, re.M)
    # A test that cannot run here (REFIT-SKIPPED, exit 77) passes ctest: count it, a skipped
    # selection proves nothing.
    skipped = len(re.findall(r"^\s*\d+ - .+ \(Skipped\)\s*$", text, re.M))
    return rc, seconds, failed, skipped


def fmt_s(s):
    return f"{s:.0f}"


def write_report(path, mutants, notes, started, args_text):
    counts = summary_counts(mutants)
    head = git("rev-parse", "--short", "HEAD").stdout.strip()
    lines = [
        "# Mutation testing report",
        "",
        f"`scripts/mutants/run.sh{args_text}` on {started:%Y-%m-%d %H:%M}, commit {head} (plus the working tree's "
        f"uncommitted changes), {os.cpu_count()} CPUs. Each mutant is one planted bug "
        "(scripts/mutants/mutants.tsv); *killed* means the ctest selection named beside it failed on the mutant "
        "after passing on the unmutated tree.",
        "",
        "**" + summary_line(counts) + "**",
        "",
        "| id | mutant | file | selection | result | tests | build s | test s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in mutants:
        if not m.result:
            continue
        sel = m.ctest_text.replace("|", "\\|")
        result = m.result
        if m.result == "killed" and m.failed:
            result += " (" + str(len(m.failed)) + " failed)"
        elif m.detail:
            result += " (" + m.detail.replace("|", "\\|") + ")"
        lines.append(f"| {m.id} | {m.description.replace('|', '/')} | `{', '.join(m.files) or '?'}` | `{sel}` | "
                     f"{result} | {m.tests} | {fmt_s(m.build_s)} | {fmt_s(m.test_s)} |")
    survivors = [m for m in mutants if m.result == "survived"]
    if survivors:
        lines += ["", "## Survivors", "",
                  "Why each survived (scripts/mutants/survivors.tsv): a test that is missing, or an equivalent mutant.",
                  ""]
        for m in survivors:
            lines.append(f"- **{m.name}**: {notes.get(m.id, '*not explained yet: add a line to survivors.tsv*')}")
    killed = [m for m in mutants if m.result == "killed" and m.failed]
    if killed:
        lines += ["", "## What killed each mutant", ""]
        for m in killed:
            shown = "; ".join(m.failed[:3]) + (f"; and {len(m.failed) - 3} more" if len(m.failed) > 3 else "")
            lines.append(f"- {m.name}: {shown}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def summary_counts(mutants):
    c = {}
    for m in mutants:
        if m.result:
            c[m.result] = c.get(m.result, 0) + 1
    return c


def summary_line(c):
    n = sum(c.values())
    broken = c.get("build-failed", 0) + c.get("stale", 0) + c.get("no-tests", 0)
    line = f"{n} mutants, {c.get('killed', 0)} killed, {c.get('survived', 0)} survived, {broken} broken"
    extra = [f"{c[k]} {k}" for k in ("skipped", "invalid", "interrupted") if c.get(k)]
    return line + (" (" + ", ".join(extra) + ")" if extra else "")


def main():
    ap = argparse.ArgumentParser(
        prog="scripts/mutants/run.sh",
        description="Apply each planted bug in turn, rebuild, run the ctest selection that should catch it, revert.")
    ap.add_argument("mutants", nargs="*", help="ids (01) or names or parts of names (rope); default: all")
    ap.add_argument("--report", metavar="FILE", help="write a Markdown report to FILE")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--no-baseline", action="store_true",
                    help="do not first run each selection on the unmutated tree (then a kill is not checked)")
    ap.add_argument("--jobs", "-j", type=int, default=0, help="ctest jobs (default: the test preset's)")
    ap.add_argument("--build-timeout", type=int, default=3600, help="seconds per rebuild (default 3600)")
    ap.add_argument("--test-timeout", type=int, default=600, help="seconds per ctest selection (default 600)")
    ap.add_argument("--no-restore-build", action="store_true",
                    help="leave build/ as the last mutant left it (it is rebuilt from the reverted sources on the next "
                         "ninja run either way)")
    opts = ap.parse_args()

    mutants = read_manifest()
    if opts.list:
        for m in mutants:
            print(f"{m.id}  {m.name:50s} {m.ctest_text}\n    {m.description}")
        return 0
    chosen = mutants
    if opts.mutants:
        chosen = [m for m in mutants if any(w == m.id or w in m.name for w in opts.mutants)]
        if not chosen:
            print("no mutant matches " + " ".join(opts.mutants), file=sys.stderr)
            return 64
    os.makedirs(os.path.join(WORK, "logs"), exist_ok=True)
    lock = open(os.path.join(WORK, "lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("another scripts/mutants/run.sh is running (build/mutants/lock)", file=sys.stderr)
        return 64

    for s in SIGNALS:
        signal.signal(s, on_signal)
    started = datetime.datetime.now()
    args_text = "".join(" " + shlex.quote(a) for a in sys.argv[1:])
    notes = read_survivor_notes()
    logs = os.path.join(WORK, "logs")

    # A patch still in the tree (a run killed with SIGKILL) is reverted by hand first: refuse.
    for m in mutants:
        m.files = patched_files(m) or []
        if os.path.exists(m.path) and m.files and is_applied(m):
            print(f"mutant {m.id} ({m.patch}) is applied in the working tree now; revert it first:\n"
                  f"  git apply -R {os.path.relpath(m.path, ROOT)}", file=sys.stderr)
            return 2

    targets = sorted({t for m in chosen for t in m.targets})
    print(f"[mutants] {len(chosen)} mutant(s); building the unmutated tree: {' '.join(targets)}", flush=True)
    baseline_log = os.path.join(logs, "baseline.log")
    open(baseline_log, "w").close()
    try:
        if not os.path.exists(os.path.join(BUILD, "build.ninja")):
            # Configures build/ (scripts/env.sh sets the machine up first) and builds these targets.
            rc, _ = run_logged([os.path.join(ROOT, "scripts", "build.sh"), "--target", *targets], baseline_log,
                               opts.build_timeout)
        else:
            rc, _ = build(targets, baseline_log, opts.build_timeout)
    except Interrupted as e:
        print(f"[mutants] interrupted ({e}) while building the unmutated tree; nothing was applied", file=sys.stderr)
        return 130
    if rc != 0:
        print(f"[mutants] the unmutated tree does not build (see {baseline_log}):\n{tail(baseline_log)}",
              file=sys.stderr)
        return 3

    baseline = {}  # selection text -> (passed, tests)
    exit_code = 0
    current = None  # (mutant) whose patch is in the tree
    ran = []
    try:
        if not opts.no_baseline:
            for sel in dict.fromkeys(m.ctest_text for m in chosen):
                args = shlex.split(sel)
                n = count_tests(args)
                if n == 0:
                    baseline[sel] = (False, 0)
                    continue
                rc, seconds, failed, _ = run_selection(args, baseline_log, opts.test_timeout, opts.jobs)
                baseline[sel] = (rc == 0, n)
                print(f"[mutants] baseline {sel}: {n} test(s), {'pass' if rc == 0 else 'FAIL'} in {seconds:.0f} s"
                      + ("".join("\n    failed: " + t for t in failed)), flush=True)

        for m in chosen:
            log = os.path.join(logs, f"{m.id}.log")
            open(log, "w").close()
            ran.append(m)
            if not m.files:
                m.result, m.detail = "stale", "patch missing or unreadable"
            elif not all(file_clean(f) for f in m.files):
                m.result, m.detail = "skipped", "uncommitted changes in " + ", ".join(f for f in m.files if not file_clean(f))
            elif git("apply", "--check", m.path).returncode != 0:
                m.result, m.detail = "stale", "the patch no longer applies"
            elif baseline.get(m.ctest_text, (True, 1))[1] == 0:
                m.result, m.detail = "no-tests", "the selection names no test"
            elif not baseline.get(m.ctest_text, (True, 1))[0]:
                m.result, m.detail = "invalid", "the selection fails unmutated"
            if m.result:
                print(f"[mutants] {m.name}: {m.result} ({m.detail})", flush=True)
                continue
            with Blocked():
                r = git("apply", m.path)
                if r.returncode != 0:
                    m.result, m.detail = "stale", "git apply failed: " + r.stderr.strip()
                    continue
                current = m
            try:
                rc, m.build_s = build(m.targets, log, opts.build_timeout)
                if rc != 0:
                    m.result = "build-failed"
                    m.detail = "timed out" if rc == 124 else ""
                else:
                    m.tests = count_tests(m.ctest)
                    if m.tests == 0:
                        m.result, m.detail = "no-tests", "the selection names no test"
                    else:
                        rc, m.test_s, m.failed, m.skipped = run_selection(m.ctest, log, opts.test_timeout, opts.jobs)
                        m.result = "killed" if rc != 0 else "survived"
                        if rc == 124:
                            m.detail = "selection timed out"
                        elif m.skipped:
                            m.detail = f"{m.skipped} of {m.tests} tests skipped here"
            finally:
                with Blocked():
                    r = git("apply", "-R", m.path)
                    restored = r.returncode == 0 and all(file_clean(f) for f in m.files)
                    if restored:
                        current = None
                if not restored:
                    print(f"[mutants] ERROR: mutant {m.id} could not be reverted ({r.stderr.strip()}); "
                          f"check {', '.join(m.files)} (git apply -R {os.path.relpath(m.path, ROOT)})", file=sys.stderr)
                    exit_code = 2
            print(f"[mutants] {m.name}: {m.result}{' (' + m.detail + ')' if m.detail else ''} "
                  f"[{m.tests} tests, build {m.build_s:.0f} s, tests {m.test_s:.0f} s]", flush=True)
            if exit_code:
                break
    except Interrupted as e:
        if ran and not ran[-1].result:
            ran[-1].result, ran[-1].detail = "interrupted", str(e)
        print(f"[mutants] interrupted ({e})", file=sys.stderr)
        exit_code = exit_code or 130
    finally:
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        if current is not None:  # interrupted between apply and the revert's own try
            r = git("apply", "-R", current.path)
            if r.returncode != 0:
                print(f"[mutants] ERROR: mutant {current.id} could not be reverted: {r.stderr.strip()}", file=sys.stderr)
                exit_code = 2
        for m in mutants:  # nothing of ours is left in the tree
            if m.files and is_applied(m):
                print(f"[mutants] ERROR: mutant {m.id} is still applied: git apply -R {os.path.relpath(m.path, ROOT)}",
                      file=sys.stderr)
                exit_code = 2
        for s in SIGNALS:
            signal.signal(s, signal.SIG_DFL)

    if not opts.no_restore_build and exit_code == 0 and ran:
        # The reverted sources are newer than the mutants' objects: ninja rebuilds them (ccache hits).
        built = sorted({t for m in ran for t in m.targets})
        print(f"[mutants] rebuilding {' '.join(built)} from the reverted sources", flush=True)
        rc, _ = build(built, os.path.join(logs, "restore.log"), opts.build_timeout)
        if rc != 0:
            print("[mutants] warning: the restoring build failed (build/mutants/logs/restore.log)", file=sys.stderr)

    counts = summary_counts(ran)
    if opts.report:
        write_report(opts.report, ran, notes, started, args_text)
    print(summary_line(counts))
    for m in ran:
        if m.result == "survived":
            print(f"  survived: {m.name}: {notes.get(m.id, 'not explained (survivors.tsv)')}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
