"""refit's side of bench/compare.py predict: `refit predict` on the quickstart recipe's test set
(5000 Fashion-MNIST images, batch 64, top 3, JSON lines), with the recipe's own weights
(--checkpoint none: the speed does not depend on what was trained). Reads the inputs/s refit
prints for its loop and prints JSON with ms per batch of 64 ("ms_per_step"), as the peer does.
Usage: python bench/refit_predict_vit.py BUILD_DIR [cpu|cuda]
"""
import json, pathlib, re, subprocess, sys

build = pathlib.Path(sys.argv[1])
dev = sys.argv[2] if len(sys.argv) > 2 else "cpu"
root = pathlib.Path(__file__).resolve().parent.parent
out = subprocess.run([str(build / "refit"), "predict", str(root / "recipes/quickstart.json"), "--checkpoint", "none",
                      "--input", "data:test", "--out", "/tmp/refit-bench-predict.jsonl", "--top-k", "3",
                      "--batch-size", "64", "--set", "training.device=" + dev, "--set", "output.dir=/tmp/refit-bench-predict"],
                     capture_output=True, text=True, check=True).stdout
last = out.strip().splitlines()[-1]
m = re.search(r": (\d+) predictions .* ([0-9.]+) inputs/s", last)
if not m:
    print(json.dumps({"error": "no throughput in: " + last}))
    sys.exit(0)
n, rate = int(m.group(1)), float(m.group(2))
print(json.dumps({"impl": "refit-predict", "device": dev, "inputs": n, "inputs_per_s": rate, "ms_per_step": 64000 / rate}))
