"""Golden data for the built-in "knn" evaluator: DINO's weighted k-NN classifier
(facebookresearch/dino, eval_knn.py: features L2-normalised in main(), then knn_classifier),
computed by Python PyTorch. Writes knn/knn.safetensors.

Data: 5 classes, 8-dimensional features drawn around random class centres with enough noise
that the classes overlap (accuracy neither 0 nor 1). Bank: 200 labelled samples; queries: 60.
Tensors: bank_features [200, 8] f32, bank_labels [200] i64, query_features [60, 8] f32,
query_labels [60] i64 (raw features: refit normalises them itself), predictions [60] i64
(k = 10, T = 0.07), accuracy [1] f64 (a fraction, not DINO's percentage); k and temperature
are also in the metadata.
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_knn.py
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"torch": "2.11.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import pathlib

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

C, D, N, Q, K, T = 5, 8, 200, 60, 10, 0.07

torch.manual_seed(2024)
centres = torch.randn(C, D)


def draw(n):
    y = torch.randint(0, C, (n,))
    x = centres[y] + 1.4 * torch.randn(n, D)
    return x, y


bank_x, bank_y = draw(N)
query_x, query_y = draw(Q)


@torch.no_grad()
def knn_classifier(train_features, train_labels, test_features, test_labels, k, T, num_classes=1000):
    """DINO's knn_classifier, line for line, except: it also returns the predictions, and the
    chunk size is fixed (DINO's num_test_images // 100 is 0 for 60 queries)."""
    top1, top5, total = 0.0, 0.0, 0
    train_features = train_features.t()
    num_test_images = test_labels.shape[0]
    imgs_per_chunk = 16
    retrieval_one_hot = torch.zeros(k, num_classes).to(train_features.device)
    all_predictions = []
    for idx in range(0, num_test_images, imgs_per_chunk):
        # get the features for test images
        features = test_features[idx : min((idx + imgs_per_chunk), num_test_images), :]
        targets = test_labels[idx : min((idx + imgs_per_chunk), num_test_images)]
        batch_size = targets.shape[0]

        # calculate the dot product and compute top-k neighbors
        similarity = torch.mm(features, train_features)
        distances, indices = similarity.topk(k, largest=True, sorted=True)
        candidates = train_labels.view(1, -1).expand(batch_size, -1)
        retrieved_neighbors = torch.gather(candidates, 1, indices)

        retrieval_one_hot.resize_(batch_size * k, num_classes).zero_()
        retrieval_one_hot.scatter_(1, retrieved_neighbors.view(-1, 1), 1)
        distances_transform = distances.clone().div_(T).exp_()
        probs = torch.sum(
            torch.mul(
                retrieval_one_hot.view(batch_size, -1, num_classes),
                distances_transform.view(batch_size, -1, 1),
            ),
            1,
        )
        _, predictions = probs.sort(1, True)
        all_predictions.append(predictions[:, 0])

        # find the predictions that match the target
        correct = predictions.eq(targets.data.view(-1, 1))
        top1 = top1 + correct.narrow(1, 0, 1).sum().item()
        top5 = top5 + correct.narrow(1, 0, min(5, k)).sum().item()
        total += targets.size(0)
    top1 = top1 * 100.0 / total
    top5 = top5 * 100.0 / total
    return top1, top5, torch.cat(all_predictions)


# DINO's main(): features normalised (p=2, dim=1) before the classifier.
top1, _, predictions = knn_classifier(F.normalize(bank_x, dim=1, p=2), bank_y, F.normalize(query_x, dim=1, p=2),
                                      query_y, K, T, num_classes=int(bank_y.max()) + 1)
accuracy = top1 / 100.0
assert 0.0 < accuracy < 1.0, accuracy
print(f"k={K} T={T}: accuracy {accuracy:.4f} ({int(round(accuracy * Q))}/{Q})")

out = pathlib.Path(__file__).parent / "knn" / "knn.safetensors"
out.parent.mkdir(exist_ok=True)
save_file(
    {
        "bank_features": bank_x.contiguous(),
        "bank_labels": bank_y.contiguous(),
        "query_features": query_x.contiguous(),
        "query_labels": query_y.contiguous(),
        "predictions": predictions.contiguous(),
        "accuracy": torch.tensor([accuracy], dtype=torch.float64),
    },
    str(out),
    metadata={"k": str(K), "temperature": str(T)},
)
print(out, out.stat().st_size, "bytes")
