#!/usr/bin/env python3
"""The TensorBoard event files of a run, read back by the `tensorboard` package.

  tensorboard_events.py REFIT RECIPE WORK_DIR      train RECIPE (shortened), kill it, resume, check
  tensorboard_events.py --check RUN_DIR            check an existing run folder only

The run: 30 steps with an evaluation every 5 and a checkpoint every 10, killed while it writes
its step-20 checkpoint (REFIT_FAULT_AT: the killed run has logged up to step 20), then resumed
from step 10. The check, against the run folder's metrics.jsonl (which holds one line per logged
step after the resume):
  - every record of every event file is framed as TFRecord with both masked CRC-32Cs right
    (parsed here, independently of tensorboard's reader) and tensorboard's EventFileLoader reads
    as many events as there are records (it stops silently at a bad record);
  - each file starts with file_version "brain.Event:2" and holds a SessionLog START;
  - through tensorboard's EventAccumulator (what `tensorboard --logdir` shows, the killed run's
    events after the checkpoint dropped at the resumed run's START): each value of metrics.jsonl
    (train loss, lr per group, grad norms, loss scale, skipped count; every evaluation metric) is
    the scalar of its tag at its step, equal after rounding to float32, one point per step, and
    no tag holds points the log does not; train/samples_per_second is the throughput between
    consecutive updates of one process with no evaluation in between, train/flops_per_second the
    FLOPs metrics.jsonl counts over the same intervals and train/mfu that over summary.json's peak;
  - the text `recipe` is the run's recipe.json in a Markdown code block.
Exit 77 (ctest: skipped) when the tensorboard package cannot be imported.
"""
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys

try:
    import numpy as np
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.backend.event_processing import plugin_event_accumulator as accumulator
    from tensorboard.util import tensor_util
except Exception as e:  # ImportError, or a broken install
    print(f"SKIP: the tensorboard package cannot be imported ({type(e).__name__}: {e}); "
          "scripts/setup.sh installs it with REFIT_SETUP_TESTS=1")
    sys.exit(77)

try:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
except ImportError:
    try:
        import crc32c as _crc32c_module

        def masked_crc32c(data):
            crc = _crc32c_module.crc32c(data)
            return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    except ImportError:
        _TABLE = []
        for _byte in range(256):
            _crc = _byte
            for _ in range(8):
                _crc = (_crc >> 1) ^ 0x82F63B78 if _crc & 1 else _crc >> 1
            _TABLE.append(_crc)

        def masked_crc32c(data):
            crc = 0xFFFFFFFF
            for b in data:
                crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
            crc ^= 0xFFFFFFFF
            return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

TRAIN_TAGS = {"loss": "train/loss", "grad_norm": "train/grad_norm", "grad_norm_clipped": "train/grad_norm_clipped",
              "scale": "train/loss_scale", "skipped_total": "train/skipped_total"}
NOT_METRICS = {"kind", "split", "step", "iteration", "count"}

failures = []


def fail(message):
    failures.append(message)
    print("FAIL:", message)


def run(cmd, log, env=None, expect=0):
    with open(log, "ab") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if rc != expect:
        print(open(log, errors="replace").read())
        print(f"FAIL: {' '.join(cmd)} exited {rc}, expected {expect} (log {log})")
        sys.exit(1)


def train_killed_and_resumed(refit, recipe, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    short = ["--set", "training.duration=30:step", "--set", "training.eval_every=5:step", "--set",
             "training.checkpoint_every=10:step", "--set", "training.log_every=5"]
    listed = os.path.join(work, "listed")
    env = dict(os.environ, REFIT_FAULT_AT="list")
    with open(os.path.join(work, "points.txt"), "wb") as points:
        rc = subprocess.run([refit, "train", recipe, *short, "--set", f"output.dir={listed}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=points).returncode
    if rc != 0:
        print(open(os.path.join(work, "points.txt"), errors="replace").read())
        print("FAIL: the listing run failed")
        sys.exit(1)
    starts = []
    for line in open(os.path.join(work, "points.txt"), errors="replace"):
        if line.startswith("fault point ") and line.rstrip().endswith(": checkpoint: create temporary folder"):
            starts.append(int(line.split()[2].rstrip(":")))
    if len(starts) < 2:
        print(f"FAIL: expected checkpoint saves at steps 10, 20 and 30 among the fault points, found {len(starts)}")
        sys.exit(1)
    run_dir = os.path.join(work, "run")
    log = os.path.join(work, "train.log")
    # Ended (as by SIGKILL) while the step-20 checkpoint is written: the latest is step 10.
    run([refit, "train", recipe, *short, "--set", f"output.dir={run_dir}"], log,
        env=dict(os.environ, REFIT_FAULT_AT=str(starts[1])), expect=86)
    run([refit, "train", recipe, *short, "--set", f"output.dir={run_dir}", "--resume"], log)
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if len(files) != 2:
        fail(f"expected 2 event files (killed and resumed run), found {files}")
    return run_dir


def check_records(path):
    """Every record's framing and CRCs; the number of records."""
    data = open(path, "rb").read()
    at, count = 0, 0
    while at < len(data):
        if at + 12 > len(data):
            fail(f"{path}: {len(data) - at} trailing bytes, not a record header")
            return count
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if header_crc != masked_crc32c(header):
            fail(f"{path}: record {count} at byte {at}: the length's CRC is wrong")
        end = at + 12 + length
        if end + 4 > len(data):
            fail(f"{path}: record {count} at byte {at} runs past the end of the file")
            return count
        (data_crc,) = struct.unpack("<I", data[end:end + 4])
        if data_crc != masked_crc32c(data[at + 12:end]):
            fail(f"{path}: record {count} at byte {at}: the data's CRC is wrong")
        at, count = end + 4, count + 1
    return count


def check_file(path):
    failed_before = len(failures)
    records = check_records(path)
    events = list(event_file_loader.EventFileLoader(path).Load())
    if len(events) != records:
        fail(f"{path}: tensorboard read {len(events)} events of {records} records")
    if not events or events[0].file_version != "brain.Event:2":
        fail(f"{path}: the first event is not file_version brain.Event:2")
    if not any(e.HasField("session_log") and e.session_log.status == 1 for e in events):
        fail(f"{path}: no SessionLog START")
    if len(failures) == failed_before:
        print(f"{os.path.basename(path)}: {records} records, CRCs verified")


def f32(x):
    return float(np.float32(x))


def same(expected, got):
    if expected is None:  # a non-finite number: JSON writes null
        return not math.isfinite(got)
    return f32(expected) == got or (math.isnan(f32(expected)) and math.isnan(got))


def check_run(run_dir):
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if not files:
        fail(f"no events.out.tfevents.* in {run_dir}")
        return
    for f in files:
        check_file(f)

    acc = accumulator.EventAccumulator(run_dir, size_guidance={accumulator.TENSORS: 0})
    acc.Reload()
    points = {}
    for tag in acc.Tags()["tensors"]:
        for e in acc.Tensors(tag):
            points.setdefault(tag, []).append((e.step, e.tensor_proto))

    def scalars(tag):
        return [(step, float(tensor_util.make_ndarray(t).item())) for step, t in points.get(tag, [])]

    lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    summary_path = os.path.join(run_dir, "summary.json")
    groups = json.load(open(summary_path)).get("environment", {}).get("param_groups", []) \
        if os.path.exists(summary_path) else []

    expected = {}  # tag -> {step: value}

    def expect(tag, step, value):
        if step in expected.setdefault(tag, {}):
            fail(f"metrics.jsonl has two values of {tag} at step {step}")
        expected[tag][step] = value

    throughput = {}
    flop_rate = {}  # train/flops_per_second: between updates of one process whose lines count FLOPs
    previous = None
    for line in lines:
        step = line["step"]
        if line["kind"] == "train":
            for key, tag in TRAIN_TAGS.items():
                expect(tag, step, line[key])
            for g, lr in enumerate(line["lr"]):
                expect(f"train/lr/{groups[g] if g < len(groups) else g}", step, lr)
            # A later update of the same process (its clock goes on), no evaluation in between.
            if previous is not None and previous["kind"] == "train" and line["time"] > previous["time"] \
                    and line["samples"] > previous["samples"]:
                throughput[step] = (line["samples"] - previous["samples"]) / (line["time"] - previous["time"])
                if previous.get("flops", -1) >= 0 and line.get("flops", -1) > previous["flops"]:
                    flop_rate[step] = (line["flops"] - previous["flops"]) / (line["time"] - previous["time"])
        elif line["kind"] == "eval":
            for key, value in line.items():
                if key not in NOT_METRICS and (value is None or isinstance(value, (int, float))):
                    expect(f"{line['split']}/{key}", step, value)
        previous = line

    checked = 0
    for tag, want in sorted(expected.items()):
        got = scalars(tag)
        steps = [s for s, _ in got]
        if len(steps) != len(set(steps)):
            fail(f"{tag}: more than one point at a step (the killed run's were not dropped?): {sorted(steps)}")
        got = dict(got)
        for step, value in sorted(want.items()):
            if step not in got:
                fail(f"{tag}: no scalar at step {step}")
            elif not same(value, got[step]):
                fail(f"{tag} at step {step}: {got[step]!r} in the event file, {value!r} in metrics.jsonl")
            checked += 1
        extra = sorted(set(got) - set(want))
        if extra:
            fail(f"{tag}: points at steps {extra} that metrics.jsonl does not have")
    got = dict(scalars("train/samples_per_second"))
    if not got:
        fail("no train/samples_per_second")
    for step, value in sorted(got.items()):
        if step not in throughput:
            fail(f"train/samples_per_second at step {step}: the first update of a process or after an evaluation")
        elif f32(throughput[step]) != value:
            fail(f"train/samples_per_second at step {step}: {value} in the event file, {throughput[step]} from metrics.jsonl")
    # FLOP/s and MFU (the counted update's FLOPs x updates, over the same intervals), MFU over the
    # peak summary.json names.
    peak = json.load(open(summary_path)).get("compute", {}).get("peak_flops_per_second", 0) \
        if os.path.exists(summary_path) else 0
    got_rate, got_mfu = dict(scalars("train/flops_per_second")), dict(scalars("train/mfu"))
    if flop_rate and not got_rate:
        fail("no train/flops_per_second although metrics.jsonl counts FLOPs")
    for step, value in sorted(got_rate.items()):
        if step not in flop_rate:
            fail(f"train/flops_per_second at step {step}: metrics.jsonl has no FLOP interval there")
        elif f32(flop_rate[step]) != value:
            fail(f"train/flops_per_second at step {step}: {value} in the event file, {flop_rate[step]} from metrics.jsonl")
        elif peak > 0 and (step not in got_mfu or f32(flop_rate[step] / peak) != got_mfu[step]):
            fail(f"train/mfu at step {step}: {got_mfu.get(step)} in the event file, {flop_rate[step] / peak} expected")
    if set(got_mfu) - set(got_rate):
        fail(f"train/mfu at steps without a FLOP rate: {sorted(set(got_mfu) - set(got_rate))}")
    unexpected = set(points) - set(expected) - {"train/samples_per_second", "train/flops_per_second", "train/mfu", "recipe"}
    if unexpected:
        fail(f"tags that metrics.jsonl does not explain: {sorted(unexpected)}")
    for tag in ("train/loss", "train/loss_scale", "train/grad_norm"):
        if tag not in expected:
            fail(f"metrics.jsonl holds no {tag}: nothing to compare")
    if not any(t.startswith("train/lr/") for t in expected):
        fail("metrics.jsonl holds no learning rate")
    if not any(not t.startswith("train/") for t in expected):
        fail("metrics.jsonl holds no evaluation (use a recipe with /training/eval_every)")

    recipe_points = points.get("recipe", [])
    recipe_path = os.path.join(run_dir, "recipe.json")
    if not recipe_points:
        fail("no text 'recipe'")
    elif os.path.exists(recipe_path):
        text = tensor_util.make_ndarray(recipe_points[-1][1]).item().decode()
        recipe = open(recipe_path).read()
        if not (text.startswith("```json\n") and text.rstrip().endswith("```")):
            fail(f"the recipe text is not a Markdown code block: {text[:80]!r}")
        elif json.loads(text[len("```json\n"):text.rstrip().rfind("```")]) != json.loads(recipe):
            fail("the recipe text is not recipe.json")
        plugin = acc.SummaryMetadata("recipe").plugin_data.plugin_name
        if plugin != "text":
            fail(f"the recipe's plugin is {plugin!r}, not 'text'")
    print(f"{checked} values of metrics.jsonl found as scalars at their steps; "
          f"{len(got)} throughput points, {len(got_rate)} FLOP/s points; {len(files)} event file(s)")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        run_dir = sys.argv[2]
    elif len(sys.argv) == 4:
        run_dir = train_killed_and_resumed(*sys.argv[1:])
    else:
        print(__doc__)
        return 2
    check_run(run_dir)
    if failures:
        print(f"FAIL: {len(failures)} problem(s)")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
