"""A second peer of bench/refit_generate_smollm2.py: llama.cpp (PyPI `llama-cpp-python`, built from
its sdist by pip) on the same GGUF file, computing on its Q4_1 / Q8_0 blocks directly (refit and
transformers dequantize them first), the same 8 prompts with the GGUF's chat template, greedy
(top_k 1), up to 32 new tokens each, with llama.cpp's KV cache, one prompt after another (the
high-level API has no batch), all CPU threads. Times the generation only (the model is loaded
before the clock starts) and prints JSON with ms per generated token and tokens/s, counting each
completion's tokens up to and including its EOS (what refit counts).
Usage: python bench/peer_smollm2_llamacpp.py   (REFIT_SMOLLM2_GGUF: scripts/env.sh)
"""
import json, os, pathlib, time

from llama_cpp import Llama

root = pathlib.Path(__file__).resolve().parent.parent
gguf = os.environ["REFIT_SMOLLM2_GGUF"]
llm = Llama(model_path=gguf, n_ctx=512, n_threads=os.cpu_count(), n_batch=512, verbose=False, seed=0)
prompts = [json.loads(l)["prompt"] for l in open(root / "bench/generate_prompts.jsonl")]
tokens = 0
seconds = 0.0
for p in prompts:
    start = time.perf_counter()
    out = llm.create_chat_completion(messages=[{"role": "user", "content": p}], max_tokens=32, temperature=0.0,
                                     top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    seconds += time.perf_counter() - start
    # completion_tokens counts the generated tokens; a stop at EOS does not count the EOS itself.
    n = out["usage"]["completion_tokens"]
    tokens += n + (1 if out["choices"][0]["finish_reason"] == "stop" else 0)
print(json.dumps({"impl": "llama.cpp (llama-cpp-python)", "device": "cpu", "dtype": "gguf Q4_1/Q8_0", "tokens": tokens,
                  "tokens_per_s": tokens / seconds, "ms_per_step": seconds * 1000 / tokens}))
