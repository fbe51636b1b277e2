"""Greedy tokens from llama.cpp (through llama-cpp-python, on the CPU) for fixed prompt ids: the reference
BoltBeam's tinygrad runs are checked against, token for token (tests/test_architectures.py).

Run with a Python that has llama-cpp-python (built for the CPU) and nothing of BoltBeam's, e.g.:

    python3 -m venv /tmp/llvenv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF" \\
        /tmp/llvenv/bin/pip install llama-cpp-python==0.3.36
    /tmp/llvenv/bin/python bench/reference_tokens.py --out tests/data/reference_tokens.json \\
        MODEL.gguf:CONTEXT[,CONTEXT...] [MODEL.gguf:CONTEXT ...]

Each model gets two kinds of prompt: profile's, CONTEXT ids (boltbeam/measure/tinygrad_run.py: prompt_tokens,
written out here so this script imports nothing of BoltBeam's; the test checks the recorded ids are still
that prompt), and each of TEXTS as llama.cpp tokenizes it (its begin-of-sequence token first). Each prompt is
decoded twice, through llama.cpp's two CPU attention paths: "flash" (its default: flash attention, a float16
cache) and "plain" (no flash attention, a float32 cache). Where they disagree the prompt is a near tie for
llama.cpp itself, and no other engine can be held to either.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import pathlib
import platform
import sys

import numpy as np

TOKENS = 8          # greedy tokens recorded for each prompt
ANIMALS, PLACES = ("fox", "owl", "cat", "hare", "wolf"), ("river", "barn", "hill", "market", "forest", "mill", "bridge")
TEXTS = {
    "short": "The capital of France is Paris. The capital of Germany is",
    # past a 512-position sliding window: its last tokens' local blocks no longer see its first
    "long": " ".join(f"Line {i}: the {ANIMALS[i % 5]} walked to the {PLACES[i % 7]}." for i in range(1, 60)) + " Line 60:",
}
PATHS = {"flash": {}, "plain": {"type_k": 0, "type_v": 0, "flash_attn_type": "LLAMA_FLASH_ATTN_TYPE_DISABLED"}}


def prompt_tokens(context: int, vocabulary: int) -> list[int]:
    return [1] + [(7919 * i) % vocabulary for i in range(1, max(1, context))]


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def greedy(lc, model, prompt: list[int], tokens: int, path: dict) -> tuple[list[int], list[float]]:
    """A fresh context: the prompt in batches of 512, then one token at a time, each the argmax of the logits;
    with each step's margin, its largest logit less the next (a small one: a near tie another engine's
    rounding may break the other way)."""
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = len(prompt) + tokens + 1, 512, 512
    for field, value in path.items():
        setattr(cp, field, getattr(lc, value) if isinstance(value, str) else value)
    ctx = lc.llama_init_from_model(model, cp)
    vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))

    margins = []

    def decode(ids: list[int]) -> int:
        arr = (lc.llama_token * len(ids))(*ids)
        if lc.llama_decode(ctx, lc.llama_batch_get_one(arr, len(ids))) != 0:
            sys.exit("llama.cpp could not decode the batch")
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(vocab,))
        second, first = np.partition(logits, -2)[-2:]
        margins.append(round(float(first - second), 4))
        return int(logits.argmax())

    for i in range(0, len(prompt), 512):
        margins.clear()
        nxt = decode(prompt[i:i + 512])
    out = [nxt]
    while len(out) < tokens:
        out.append(decode([out[-1]]))
    lc.llama_free(ctx)
    return out, margins


def tokenize(lc, model, text: str) -> list[int]:
    """The text's ids as llama.cpp tokenizes it, with the special tokens the file asks for (its begin-of-sequence)."""
    data = text.encode()
    ids = (lc.llama_token * (len(data) + 8))()
    n = lc.llama_tokenize(lc.llama_model_get_vocab(model), data, len(data), ids, len(ids), True, False)
    return list(ids[:n])


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if pathlib.Path("/proc/cpuinfo").exists() else platform.processor()
    return f"{platform.node()}: {platform.machine()} {cpu}, {platform.system()} {platform.release()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="MODEL.gguf:CONTEXT[,CONTEXT...]")
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu-layers", type=int, default=0, help="layers llama.cpp offloads (-1: all, on a GPU build)")
    args = ap.parse_args()
    import llama_cpp as lc
    lc.llama_backend_init()
    records = []
    for run in args.runs:
        path, contexts = run.rsplit(":", 1)
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = args.gpu_layers
        model = lc.llama_model_load_from_file(path.encode(), mp)
        if not model:
            sys.exit(f"llama.cpp cannot load {path}")
        vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
        prompts = {f"profile {c}": prompt_tokens(int(c), vocab) for c in contexts.split(",")}
        prompts.update({f"text {name}": tokenize(lc, model, text) for name, text in TEXTS.items()})
        for name, prompt in prompts.items():
            record = {"file": pathlib.Path(path).name, "sha256": sha256(path), "prompt_kind": name,
                      "vocabulary": vocab, "prompt": prompt}
            for kind, settings in PATHS.items():
                record[kind] = dict(zip(("tokens", "margins"), greedy(lc, model, prompt, TOKENS, settings)))
            records.append(record)
            print(record["file"], name, len(prompt), record["flash"]["tokens"], record["plain"]["tokens"], flush=True)
        lc.llama_model_free(model)
    doc = {"engine": "llama.cpp", "binding": f"llama-cpp-python {lc.__version__}",
           "device": "GPU" if args.gpu_layers else "CPU", "gpu_layers": args.gpu_layers,
           "machine": machine(),
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join(["python", "bench/reference_tokens.py", *sys.argv[1:]]),
           "decoding": "greedy: argmax of the last position's logits; the prompt in batches of 512; margins: each "
                       "step's largest logit less the next; flash and plain: llama.cpp's two attention paths",
           "paths": PATHS, "texts": TEXTS,
           "runs": records}
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
