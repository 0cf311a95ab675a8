"""Python peer of `refit predict` on the quickstart (bench/compare.py predict): a plain PyTorch +
transformers + PEFT inference loop over Fashion-MNIST's test images of classes 5-9 (5000; the
Debian package dataset-fashion-mnist), normalised as the recipe's /data/test, batches of 64,
the quickstart's model (Dinov2Model frozen in bf16 with PEFT LoRA r=8 on query, value, attention
output, fc1, fc2, a fp32 Linear(64, 5) head on the CLS token), eval mode, no grad, bf16 autocast;
per input a softmax, the top 3 and one JSON line {id, predicted, probability, top_k, label}.
Times the loop (batches, forward, JSON lines written), as refit predict's inputs/s does; prints
JSON with ms per batch of 64 ("ms_per_step") and inputs/s.
Usage: python bench/peer_predict_vit.py [cpu|cuda] [unused]
"""
import gzip, json, pathlib, sys, time

import numpy as np
import torch

from peer_support import quickstart_vit_with_lora

dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
root = pathlib.Path(__file__).resolve().parent.parent
data = pathlib.Path("/usr/share/datasets/fashion-mnist")
with gzip.open(data / "t10k-images-idx3-ubyte.gz") as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
with gzip.open(data / "t10k-labels-idx1-ubyte.gz") as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
keep = labels >= 5
x_all = (torch.from_numpy(images[keep].astype(np.float32) / 255.0) - 0.286) / 0.353
y_all = torch.from_numpy(labels[keep] - 5)

torch.manual_seed(0)
model, head = quickstart_vit_with_lora(root, dev)
model, head = model.eval(), head.eval()

out = open("/tmp/refit-peer-predict.jsonl", "w")
start = time.perf_counter()
with torch.no_grad():
    for first in range(0, len(x_all), 64):
        x = x_all[first:first + 64].to(dev)
        with torch.autocast(dev, dtype=torch.bfloat16):
            logits = head(model(pixel_values=x).pooler_output)
        p, c = torch.softmax(logits.float(), 1).topk(3, 1)
        p, c, y = p.double().cpu().tolist(), c.cpu().tolist(), y_all[first:first + 64].tolist()
        for i in range(len(y)):
            out.write(json.dumps({"id": first + i, "predicted": c[i][0], "probability": p[i][0],
                                  "top_k": [[c[i][j], p[i][j]] for j in range(3)], "label": y[i]}) + "\n")
out.close()
seconds = time.perf_counter() - start
n = len(x_all)
print(json.dumps({"impl": "python", "device": dev, "inputs": n, "inputs_per_s": n / seconds,
                  "ms_per_step": 1000 * seconds / (n / 64)}))
