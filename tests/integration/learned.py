#!/usr/bin/env python3
"""Did the run learn? Checks a recipe test's run folder (metrics.jsonl) after its command.

  learned.py CHECK... -- COMMAND...          run COMMAND (e.g. expect.sh ... -- refit train RECIPE --set ...),
                                            then check the run folder of its `refit train`
  learned.py --ran CHECK... -- COMMAND...    COMMAND already ran: check its run folder only

The `refit train RECIPE --set ...` part of COMMAND names the run: its folder is the last
`--set output.dir=...` (every recipe test sets one), and the label counts below come from
`refit predict RECIPE --set ... --checkpoint none` on the same data, so they are those of the
very set the run evaluated (its order, limit and split included).

CHECKs (each prints its figures and bound, and the run fails unless every one holds):

  --loss-falls
      The train loss fell. metrics.jsonl holds one train record per optimizer update; of the
      n finite losses, the first w and the last w, w = max(3, n // 4), are compared. The margin
      is derived from the run's own scatter, not from one machine's digits: s = the pooled
      standard deviation of the two windows around their own means (2w - 2 degrees of
      freedom; a falling trend inside a window only widens it), and the last window's mean
      must lie below the first's by more than 3 standard errors of the difference,
      3 * s * sqrt(2 / w). A run that does not learn (learning rate 0, updates skipped,
      gradients lost) gives two samples of one distribution: their means differ by less than
      3 standard errors except with a small probability (Student's t with 2w - 2 degrees of
      freedom, one-sided: 2 % at w = 3, 0.85 % at w = 5, 0.27 % at w = 16, 0.13 % at large w).

  --loss-below-control
      For a run whose loss does not fall by itself (DINO's rises while its centre moves and the
      teacher temperature warms up), a paired control: the same `refit train` runs again with a
      learning rate of 0 (optimizer.lr=0: the same batches, crops and random draws, no update;
      no evaluation, no checkpoints), and over the last w = max(3, n // 4) of the n updates the
      trained run's losses lie below the control's on the same updates: the mean of
      d_k = control_k - trained_k exceeds 3 s sqrt(2 / w), s the pooled standard deviation of
      the two runs' last-window losses around their own means (the margin of --loss-falls, the
      control's window in the first window's place: a difference larger than 3 standard errors
      of the loss's scatter from batch to batch), and d's own mean exceeds 3 standard errors of d,
      3 sd(d) / sqrt(w) (the paired test: Student's t with w - 1 degrees of freedom, one-sided,
      2 % at w = 5 for a run with no systematic difference). A run whose updates leave the model
      unchanged reports the control's losses again, exactly (d = 0), and fails both. What it
      shows is that the objective was optimised on the same batches (DINO: the student moved
      toward its teacher), not that the features improved: the accuracy checks watch those.

  --accuracy SPLIT METRIC INPUT
      METRIC of the last SPLIT evaluation (e.g. `test accuracy data:test`, `val knn_accuracy
      sets:knn_queries`) is above the chance floor of that set:
          floor = p + 5 * sqrt(p * (1 - p) / n),
      n the number of labelled inputs of INPUT (the evaluation's `count` where it reports one,
      which must agree), p the share of its most frequent label. p is what a classifier that
      ignores its input scores at best: always the majority class scores p exactly, any
      input-independent guess at most p in expectation (p >= 1 / classes, equal for a balanced
      set). sqrt(p (1 - p) / n) is the standard deviation of a chance-level classifier's
      accuracy over n inputs (binomial), so a model that learned nothing lands above the floor
      with a probability below 3e-7 (normal tail at 5 sigma).

  --accuracy-kept SPLIT METRIC INPUT
      For a run too short to move an accuracy it starts high (DINO's k-NN on a pretrained
      backbone: 20 steps leave it within a point): METRIC after training did not fall below its
      value at step 0 (eval_at_start) by more than 5 standard deviations of the difference of
      two accuracies a0, a1 over the n inputs, sqrt((a0 (1 - a0) + a1 (1 - a1)) / n). That is
      the standard deviation for independent samples; both are measured on the same inputs, which
      correlates them and makes the true one smaller, so the margin is wide: it catches features
      that collapsed or diverged, not a drift of a point.

  --perplexity-falls SPLIT
      The perplexity of the last SPLIT evaluation is below the one at step 0 (the recipe sets
      eval_at_start). Both are measured on the same records, so the comparison is paired: a
      run whose updates leave the model unchanged reports the same perplexity again, exactly.
"""
import collections
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile


def fail(msg):
    print(f"learned: FAIL: {msg}")
    return False


def parse(argv):
    checks = []
    ran = False
    i = 0
    while i < len(argv) and argv[i] != "--":
        a = argv[i]
        if a == "--ran":
            ran = True
            i += 1
        elif a == "--loss-falls":
            checks.append(("loss",))
            i += 1
        elif a == "--loss-below-control":
            checks.append(("control",))
            i += 1
        elif a == "--accuracy":
            checks.append(("accuracy",) + tuple(argv[i + 1:i + 4]))
            i += 4
        elif a == "--accuracy-kept":
            checks.append(("kept",) + tuple(argv[i + 1:i + 4]))
            i += 4
        elif a == "--perplexity-falls":
            checks.append(("perplexity", argv[i + 1]))
            i += 2
        else:
            sys.exit(f"learned.py: unknown argument {a}")
    if i >= len(argv) or not checks:
        sys.exit(__doc__)
    return ran, checks, argv[i + 1:]


def train_command(command):
    """(refit, recipe, the --set arguments) of the `refit train RECIPE ...` inside COMMAND."""
    for j in range(len(command) - 2):
        if os.path.basename(command[j]) == "refit" and command[j + 1] == "train":
            rest = command[j + 3:]
            sets = []
            for k in range(len(rest) - 1):
                if rest[k] == "--set":
                    sets += ["--set", rest[k + 1]]
            return command[j], command[j + 2], sets
    sys.exit("learned.py: COMMAND holds no `refit train RECIPE`")


def run_dir(recipe, sets):
    """The run folder: the last output.dir set, relative to the recipe's folder as refit takes it."""
    dirs = [sets[k + 1][len("output.dir="):] for k in range(0, len(sets), 2) if sets[k + 1].startswith("output.dir=")]
    if not dirs:
        sys.exit("learned.py: the train command sets no output.dir")
    return os.path.join(os.path.dirname(os.path.abspath(recipe)), dirs[-1])


def read_metrics(folder):
    train, evals = [], []
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            (train if r.get("kind") == "train" else evals).append(r)
    return train, evals


def last_eval(evals, split, key):
    rows = [r for r in evals if r.get("split") == split and key in r]
    return max(rows, key=lambda r: (r["step"], r["iteration"])) if rows else None


def finite_losses(train):
    """(step, loss) of the train records whose loss is a finite number."""
    return [(r["step"], r["loss"]) for r in train if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])]


def window_margin(first, last):
    """Two windows of w losses: their means, their pooled standard deviation s around them, and
    3 standard errors of the difference of the means, 3 s sqrt(2 / w)."""
    w = len(first)
    m1, m2 = sum(first) / w, sum(last) / w
    s = math.sqrt((sum((x - m1) ** 2 for x in first) + sum((x - m2) ** 2 for x in last)) / (2 * w - 2))
    return m1, m2, s, 3 * s * math.sqrt(2 / w)


def check_loss(train):
    losses = [loss for _, loss in finite_losses(train)]
    n = len(losses)
    w = max(3, n // 4)
    if n < 2 * w:
        return fail(f"loss: {n} finite train losses, too few to compare two windows of {w}")
    m1, m2, s, margin = window_margin(losses[:w], losses[-w:])
    fell = m1 - m2
    msg = (f"train loss: mean of the first {w} of {n} updates {m1:.4f}, of the last {w} {m2:.4f}: "
           f"fell by {fell:.4f}, margin 3 x {s:.4f} x sqrt(2/{w}) = {margin:.4f}")
    if not fell > margin:
        return fail(msg)
    print(f"learned: OK: {msg} ({fell / margin:.1f}x)")
    return True


def check_control(train, refit, recipe, sets):
    folder = run_dir(recipe, sets) + "-control"
    shutil.rmtree(folder, ignore_errors=True)
    args = [refit, "train", recipe] + sets + [
        "--set", "optimizer.lr=0", "--set", "training.eval_at_start=false", "--set", "evaluators=[]",
        "--set", "output.checkpoints.enabled=false", "--set", f"output.dir={folder}"]
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout)
        return fail("the control run (learning rate 0) failed")
    control, _ = read_metrics(folder)
    if any(lr != 0 for r in control for lr in r.get("lr", [])):
        return fail("the control run updated its model: a parameter group's learning rate is not 0")
    trained, untrained = dict(finite_losses(train)), dict(finite_losses(control))
    steps = sorted(set(trained) & set(untrained))
    n = len(steps)
    w = max(3, n // 4)
    if n < 2 * w or len(trained) != n:
        return fail(f"control: {n} updates with finite losses in both runs ({len(trained)} in the run), too few "
                    f"or not the same updates")
    last = steps[-w:]
    a, b = [trained[k] for k in last], [untrained[k] for k in last]
    mb, ma, s, margin = window_margin(b, a)
    below = mb - ma
    d = [y - x for x, y in zip(a, b)]
    sd = math.sqrt(sum((x - below) ** 2 for x in d) / (w - 1))
    paired = 3 * sd / math.sqrt(w)
    msg = (f"train loss over the last {w} of {n} updates: {ma:.4f}, the control's (learning rate 0, the same "
           f"batches) {mb:.4f}: below it by {below:.4f}, margin 3 x {s:.4f} x sqrt(2/{w}) = {margin:.4f}, "
           f"paired 3 x {sd:.4f} / sqrt({w}) = {paired:.4f}")
    if not (below > margin and below > paired):
        return fail(msg)
    print(f"learned: OK: {msg} ({below / max(margin, paired):.1f}x)")
    return True


_labels = {}


def labels_of(refit, recipe, sets, data_input):
    if data_input not in _labels:
        with tempfile.TemporaryDirectory() as tmp:
            _labels[data_input] = predict_labels(refit, recipe, sets, data_input, tmp)
    return _labels[data_input]


def predict_labels(refit, recipe, sets, data_input, workdir):
    out = os.path.join(workdir, "labels.jsonl")
    args = [refit, "predict", recipe] + sets + ["--checkpoint", "none", "--input", data_input, "--out", out,
                                                "--top-k", "0", "--batch-size", "256"]
    if data_input.startswith("sets:"):
        # A set the evaluators read (DINO's k-NN queries): the backbone alone gives the labels.
        args += ["--models", recipe_first_model(recipe)]
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout)
        sys.exit(f"learned.py: refit predict for the labels of {data_input} failed")
    with open(out) as f:
        return [json.loads(line)["label"] for line in f]


def recipe_first_model(recipe):
    with open(recipe) as f:
        return json.load(f)["models"][0]["name"]


def check_accuracy(evals, split, metric, data_input, refit, recipe, sets):
    row = last_eval(evals, split, metric)
    if row is None:
        return fail(f"{split} {metric}: no {split} evaluation reports it")
    labels = labels_of(refit, recipe, sets, data_input)
    n = len(labels)
    if row.get("count") and row["count"] != n:
        return fail(f"{split} {metric}: the evaluation counted {row['count']} inputs, {data_input} has {n}")
    label, top = collections.Counter(labels).most_common(1)[0]
    p = top / n
    sd = math.sqrt(p * (1 - p) / n)
    floor = p + 5 * sd
    acc = row[metric]
    msg = (f"{split} {metric} @ step {row['step']}: {acc:.4f}, floor {floor:.4f} = majority share {p:.4f} "
           f"(label {label}: {top} of {n}, {len(set(labels))} labels) + 5 x {sd:.4f}")
    if not acc > floor:
        return fail(msg)
    print(f"learned: OK: {msg}")
    return True


def check_kept(evals, split, metric, data_input, refit, recipe, sets):
    rows = [r for r in evals if r.get("split") == split and metric in r]
    start = [r for r in rows if r["step"] == 0]
    if not start or len(rows) < 2:
        return fail(f"{split} {metric}: needs an evaluation at step 0 (eval_at_start) and one after")
    n = len(labels_of(refit, recipe, sets, data_input))
    a0, a1 = start[0][metric], last_eval(rows, split, metric)[metric]
    sd = math.sqrt((a0 * (1 - a0) + a1 * (1 - a1)) / n)
    bound = a0 - 5 * sd
    msg = f"{split} {metric}: {a0:.4f} at step 0, {a1:.4f} after, bound {bound:.4f} = {a0:.4f} - 5 x {sd:.4f} (n {n})"
    if not a1 > bound:
        return fail(msg)
    print(f"learned: OK: {msg}")
    return True


def check_perplexity(evals, split):
    rows = [r for r in evals if r.get("split") == split and "perplexity" in r]
    start = [r for r in rows if r["step"] == 0]
    if not start or len(rows) < 2:
        return fail(f"{split} perplexity: needs an evaluation at step 0 (eval_at_start) and one after")
    before, after = start[0], last_eval(rows, split, "perplexity")
    msg = (f"{split} perplexity: {before['perplexity']:.4f} at step 0, {after['perplexity']:.4f} "
           f"at step {after['step']}")
    if not (after["step"] > 0 and after["perplexity"] < before["perplexity"]):
        return fail(msg)
    print(f"learned: OK: {msg} ({after['perplexity'] / before['perplexity']:.4f}x)")
    return True


def main():
    ran, checks, command = parse(sys.argv[1:])
    refit, recipe, sets = train_command(command)
    if not ran:
        status = subprocess.run(command).returncode
        sys.stdout.flush()
        if status != 0:
            print(f"learned: the command exited with {status}; the run is not checked")
            return status
    train, evals = read_metrics(run_dir(recipe, sets))
    ok = True
    for c in checks:
        if c[0] == "loss":
            ok &= check_loss(train)
        elif c[0] == "control":
            ok &= check_control(train, refit, recipe, sets)
        elif c[0] == "accuracy":
            ok &= check_accuracy(evals, c[1], c[2], c[3], refit, recipe, sets)
        elif c[0] == "kept":
            ok &= check_kept(evals, c[1], c[2], c[3], refit, recipe, sets)
        else:
            ok &= check_perplexity(evals, c[1])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
