"""The fp32 rounding model of a BERT encoder (all-MiniLM-L6-v2), to measure how tight a bound from
each element's exact sensitivities could be for refit's MiniLM golden tests (docs/precision.md,
"Why MiniLM's bounds stay near 1/50"): per output element, the standard deviation sigma (in units
of u = 2^-24) of the output's first-order change when every fp32 operation of the forward is
perturbed by its rounding, modelled as independent, mean-zero errors.

How. The forward runs in float64 (the exact function) with a perturbation added to each
operation's output: u sqrt(c) P g, where P is the magnitude the operation's roundings are relative
to (the sum of |terms| of a dot product or a sum, |result| of an elementwise operation), c its
count (the number of roundings of one element: K + 1 for a K-term dot product with a bias, 1 for
an add or a product, 4 for exp, erf, tanh, which ATen's vectorised Sleef kernels give within
1 ulp, i.e. within 2u of the result) and g a standard normal draw; a rounding shared by several
elements (a row's mean, variance or softmax sum) is one draw for the row. Each probe's output
minus the unperturbed one is, to first order, sum_e (d o / d e) u sqrt(c_e) P_e g_e: a normal
variable of variance u^2 sum_e c_e (d o / d e P_e)^2, the quantity Higham and Mary's probabilistic
bound (and Azuma-Hoeffding) puts under the square root: |o - exact| <= lambda u sqrt(sum_e c_e
(d o / d e P_e)^2) with probability at least 1 - 2 exp(-lambda^2 / 2). The mean of the squared
change over k probes estimates it; its ratio to the true variance is chi^2_k / k.

Each operation follows what ATen computes for refit (libtorch) and for transformers (the same
ATen kernels, eager or SDPA attention), with counts covering either order:
  - embeddings: word + token type (1), + position (1), then LayerNorm;
  - LayerNorm (ATen's row-wise moments, then (x rstd - mean rstd) gamma + beta): the mean (H + 1
    at mean |x|, one per row), the variance (H + 2 at mean x^2: the naive formula's magnitude,
    which covers Welford's), rstd = 1 / sqrt(var + eps) (3: add, sqrt, divide), then x rstd (1),
    - mean rstd (1, one per row), their sum (1), gamma (1), beta (1);
  - Linear: K + 1 at |x| |W|^T + |b|; LoRA on it: x A^T (K), (.) B^T (r), the scale (1), the sum
    with the base (1); merged: the weight W + s B A rounded once (r + 2 at |W| + s |B| |A|);
  - attention (SDPA's flash kernel or softmax then a product): q k^T (d_h), the scale (2: ATen's
    math path scales q and k), max subtracted (1), exp (4), the row's sum (T + 2, one per row, the
    kernel's rescaling included), p v (T + 2 at sum p |v|), the division (1);
  - GELU (erf): x / sqrt 2 (1), erf (4), 1 + erf (1), x * 0.5 * (...) (2);
  - residuals (1); the pooler: Linear, tanh (4);
  - the sentence embedding: the masked sum over T tokens (T), / count (1), the 2-norm (sum of H
    squares: H + 1, sqrt 1), the division (1).
"""
import math

import torch

U = 2.0**-24  # fp32's unit roundoff


class Rounding:
    """perturb(x, count, P): x plus u sqrt(count) P g with g ~ N(0, 1) of P's shape (P of a reduced
    shape with kept dimensions is one draw shared by what it broadcasts over); the identity when
    `generator` is None (the exact forward)."""

    def __init__(self, generator=None):
        self.generator = generator

    def __call__(self, x, count, P):
        if self.generator is None:
            return x
        g = torch.randn(P.shape, generator=self.generator, dtype=torch.float64)
        return x + U * math.sqrt(count) * P * g


class Bert:
    """all-MiniLM-L6-v2's forward in float64 from transformers' BertModel parameters, with each
    operation passed through a Rounding. lora: {module name: (A, B, scale)} on Linear layers;
    merged: LoRA folded into the weights (rounded once) instead of a path beside them."""

    def __init__(self, model, lora=None, merged=False):
        self.w = {k: v.detach().to(torch.float64) for k, v in model.state_dict().items()}
        c = model.config
        self.heads, self.layers, self.eps = c.num_attention_heads, c.num_hidden_layers, c.layer_norm_eps
        self.lora = {k: tuple(t.to(torch.float64) if torch.is_tensor(t) else t for t in v) for k, v in (lora or {}).items()}
        self.merged = merged

    def linear(self, R, x, name):
        W, b = self.w[name + ".weight"], self.w[name + ".bias"]
        lora = self.lora.get(name)
        if lora is not None and self.merged:
            A, B, s = lora
            W = R(W + s * (B @ A), A.shape[0] + 2, W.abs() + s * (B.abs() @ A.abs()))
        y = R(x @ W.T + b, W.shape[1] + 1, x.abs() @ W.abs().T + b.abs())
        if lora is not None and not self.merged:
            A, B, s = lora
            a = R(x @ A.T, A.shape[1], x.abs() @ A.abs().T)
            d = R(a @ B.T, A.shape[0], a.abs() @ B.abs().T)
            d = R(s * d, 1, (s * d).abs())
            y = R(y + d, 1, y.abs() + d.abs())
        return y

    def layer_norm(self, R, x, name):
        g, b = self.w[name + ".weight"], self.w[name + ".bias"]
        H = x.shape[-1]
        mean = R(x.mean(-1, keepdim=True), H + 1, x.abs().mean(-1, keepdim=True))
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        var = R(var, H + 2, (x * x).mean(-1, keepdim=True))
        rstd = 1 / torch.sqrt(var + self.eps)
        rstd = R(rstd, 3, rstd)
        xs = R(x * rstd, 1, (x * rstd).abs())
        shift = R(-mean * rstd, 1, (mean * rstd).abs())
        y = R(xs + shift, 1, xs.abs() + shift.abs())
        y = R(y * g, 1, (y * g).abs())
        return R(y + b, 1, y.abs() + b.abs())

    def attention(self, R, x, mask, prefix):
        n, T, H = x.shape
        dh = H // self.heads

        def heads(y):
            return y.view(n, T, self.heads, dh).transpose(1, 2)

        q = heads(self.linear(R, x, prefix + "self.query"))
        k = heads(self.linear(R, x, prefix + "self.key"))
        v = heads(self.linear(R, x, prefix + "self.value"))
        s = R(q @ k.transpose(-1, -2), dh, q.abs() @ k.abs().transpose(-1, -2))
        s = s / math.sqrt(dh)
        s = R(s, 2, s.abs())
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
        m = s.amax(-1, keepdim=True)
        z = s - m
        z = R(z, 1, torch.where(torch.isinf(z), 0.0, z.abs()))  # masked columns: exp(-inf) = 0 exactly
        p = torch.exp(z)
        p = R(p, 4, p)
        total = R(p.sum(-1, keepdim=True), T + 2, p.sum(-1, keepdim=True))
        o = R(p @ v, T + 2, p @ v.abs())
        o = o / total
        o = R(o, 1, o.abs())
        o = o.transpose(1, 2).reshape(n, T, H)
        h = self.linear(R, o, prefix + "output.dense")
        h = R(h + x, 1, h.abs() + x.abs())
        return self.layer_norm(R, h, prefix + "output.LayerNorm")

    def gelu(self, R, x):
        t = R(x / math.sqrt(2), 1, (x / math.sqrt(2)).abs())
        e = torch.erf(t)
        e = R(e, 4, e.abs())
        one = R(1 + e, 1, (1 + e).abs())
        y = x * 0.5 * one
        return R(y, 2, y.abs())

    def forward(self, R, input_ids, attention_mask, token_type_ids):
        """token states [n, T, H], pooler output [n, H], sentence embedding [n, H] (masked mean,
        normalised)."""
        w = self.w
        T = input_ids.shape[1]
        e = w["embeddings.word_embeddings.weight"][input_ids] + w["embeddings.token_type_embeddings.weight"][token_type_ids]
        e = R(e, 1, e.abs())
        e = e + w["embeddings.position_embeddings.weight"][:T][None]
        e = R(e, 1, e.abs())
        x = self.layer_norm(R, e, "embeddings.LayerNorm")
        mask = attention_mask.bool()
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            a = self.attention(R, x, mask, p + "attention.")
            h = self.gelu(R, self.linear(R, a, p + "intermediate.dense"))
            h = self.linear(R, h, p + "output.dense")
            h = R(h + a, 1, h.abs() + a.abs())
            x = self.layer_norm(R, h, p + "output.LayerNorm")
        pooled = self.linear(R, x[:, 0], "pooler.dense")
        pooled = torch.tanh(pooled)
        pooled = R(pooled, 4, pooled.abs())
        m = attention_mask.to(torch.float64)[..., None]
        total = R((x * m).sum(1), T, (x.abs() * m).sum(1))
        mean = total / m.sum(1)
        mean = R(mean, 1, mean.abs())
        sq = R((mean * mean).sum(-1, keepdim=True), mean.shape[-1] + 1, (mean * mean).sum(-1, keepdim=True))
        norm = torch.sqrt(sq)
        norm = R(norm, 1, norm)
        features = mean / norm
        features = R(features, 1, features.abs())
        return {"last_hidden_state": x, "pooler_output": pooled, "sentence_embedding": features}


def sigma(bert, batch, probes, seed):
    """The exact outputs (float64) and, per element, the standard deviation in units of u of the
    change `probes` perturbed forwards give (the root mean square over the probes)."""
    args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    with torch.no_grad():
        exact = bert.forward(Rounding(), *args)
        squares = {k: torch.zeros_like(v) for k, v in exact.items()}
        g = torch.Generator().manual_seed(seed)
        for _ in range(probes):
            out = bert.forward(Rounding(g), *args)
            for k in squares:
                squares[k] += ((out[k] - exact[k]) / U) ** 2
    return exact, {k: (v / probes).sqrt() for k, v in squares.items()}


def main():
    """How tight a bound from this model could be on the golden batch (tests/golden/bert): for
    transformers' fp32 outputs in the fixture, the largest |fp32 - exact| / (lambda u sigma) with
    lambda = 5 and sigma from `probes` perturbed forwards, and the mean |fp32 - exact| / (u sigma).
    docs/precision.md quotes it ("Why MiniLM's bounds stay near 1/50"): a per-element bound from
    exact sensitivities is not much tighter than the depth bound, since the model's dot products
    take partial sums as large as sum |terms| (any summation order), where cancellation keeps the
    real ones far smaller.
    Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/bert_rounding.py [probes, 32]
         (REFIT_MINILM_DIR set by scripts/env.sh)"""
    import os
    import pathlib
    import sys

    import pinned  # beside this script

    pinned.require(__file__, {"torch": "2.11.0", "transformers": "5.24.0", "safetensors": "0.8.0"})
    from safetensors.torch import load_file
    from transformers import BertModel

    probes = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    model = BertModel.from_pretrained(os.environ["REFIT_MINILM_DIR"]).eval()
    fixture = load_file(str(pathlib.Path(__file__).parent / "bert" / "minilm.safetensors"))
    batch = {k: fixture[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    exact, sig = sigma(Bert(model), batch, probes, seed=1)
    real = batch["attention_mask"].bool()
    for name in ("last_hidden_state", "pooler_output", "sentence_embedding"):
        err, s = (fixture[name].to(torch.float64) - exact[name]).abs() / U, sig[name]
        if name == "last_hidden_state":
            err, s = err[real], s[real]
        print(f"{name}: max |error| / (5 u sigma) {(err / (5 * s)).max().item():.3g}, "
              f"mean |error| / (u sigma) {(err / s).mean().item():.3g} ({probes} probes)")


if __name__ == "__main__":
    main()
