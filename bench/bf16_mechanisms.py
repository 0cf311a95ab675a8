"""How to compute bf16 products on a CPU without native bf16: the candidate mechanisms, timed on
the quickstart's frozen-bf16 ViT linear layers (64 images x 50 tokens, hidden 64, MLP 128; the
frozen weight bf16, the input requiring grad as behind a LoRA layer), forward + backward.

  python bench/bf16_mechanisms.py [reps] [width]   # under ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
                                              # to see an AVX2-only CPU on a newer one

- native: LibTorch's bf16 kernels under autocast (what Python PyTorch does);
- autocast-policy / layer-hook: the same casts, then the product in fp32 through autograd
  (round to bf16 afterwards): autograd saves the fp32 copies (weight and input) for the backward;
- route: what refit does (precision/bf16_products.h): a product whose bf16 operands are widened
  inside it; autograd saves the bf16 tensors, the backward widens again;
- fp32: the layer in fp32 throughout, the speed to reach.
Prints ms per forward+backward and the bytes autograd keeps between them."""
import sys, time
import torch

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
width = int(sys.argv[2]) if len(sys.argv) > 2 else 64  # 384: a ViT-S block's layers
torch.manual_seed(0)
rows, shapes = 64 * 50, [(width, width), (width, width), (2 * width, width), (width, 2 * width)]
weights = [torch.randn(o, i).bfloat16() for o, i in shapes]


class Routed(torch.autograd.Function):
    """x @ w.T on bf16 operands through the fp32 kernel, the result rounded once; saves bf16."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)  # d input needs only the (frozen) weight
        return (x.float() @ w.float().T).bfloat16()

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        return (g.float() @ w.float()).bfloat16(), None


def layer(mechanism, x, w):
    if mechanism == "native":
        with torch.autocast("cpu", torch.bfloat16):
            return torch.nn.functional.linear(x, w)
    if mechanism == "fp32":
        return torch.nn.functional.linear(x, w)
    xb = x.bfloat16()
    if mechanism == "autocast-policy":
        return (xb.float() @ w.float().T).bfloat16()
    return Routed.apply(xb, w)


def saved_bytes(mechanism, x, ws):
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for w in ws:
            layer(mechanism, x, w)
    return total


for mechanism in ("native", "autocast-policy", "route", "fp32"):
    ws = [w.float() for w in weights] if mechanism == "fp32" else weights
    x = torch.randn(rows, width, requires_grad=True)

    def step():
        out = 0
        for w in ws:
            y = layer(mechanism, x if w.shape[1] == width else x.repeat(1, 2), w)
            out = out + y.float().sum()
        out.backward()

    step()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    ms = (time.perf_counter() - t0) / reps * 1e3
    xs = torch.randn(rows, width, requires_grad=True)
    kept = saved_bytes(mechanism, xs, [w for w in ws if w.shape[1] == width])
    print(f"{mechanism:16s} {ms:8.2f} ms/fwd+bwd   autograd keeps {kept / 2**20:6.2f} MiB")
