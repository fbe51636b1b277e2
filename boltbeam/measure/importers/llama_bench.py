"""llama-bench `-o json`: a JSON array of tests, each with its config, averages and (in newer
versions) every repetition's wall time. Only whole-token figures: the trace has no kernels."""
from __future__ import annotations

import os
from typing import Any

from boltbeam.errors import BadInput
from boltbeam.files import load_json
from boltbeam.measure.importers.common import provenance, validated
from boltbeam.measure.trace import Environment, RouteRecord, Trace, Workload

# Fields that say what was measured and when; every other field of a test is a setting of the run.
RECORD_FIELDS = ("build_commit", "build_number", "cpu_info", "gpu_info", "model_filename", "model_type",
                 "model_size", "model_n_params", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns",
                 "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts")


def read_tests(path: str | os.PathLike) -> list[dict[str, Any]]:
    tests = load_json(path, "llama-bench JSON")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, dict) for t in tests):
        raise BadInput(f"llama-bench JSON {path}: expected a non-empty JSON array of test objects "
                       "(llama-bench -o json)")
    for i, t in enumerate(tests):
        for key in ("n_prompt", "n_gen"):
            if not _is_int(t.get(key)):
                raise BadInput(f"llama-bench JSON {path}: test {i} has no integer '{key}'; "
                               "not llama-bench output")
        if not _is_int(depth_of(t)):
            raise BadInput(f"llama-bench JSON {path}: test {i}: n_depth is not an integer")
    return tests


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def depth_of(test: dict[str, Any]) -> int:
    return test.get("n_depth", 0)  # llama-bench before -d decoded from an empty cache


def _label(test: dict[str, Any]) -> str:
    """llama-bench's own test name: pp512, tg128, pp512+tg128, with the depth."""
    p, g = test["n_prompt"], test["n_gen"]
    name = f"pp{p}+tg{g}" if p and g else f"pp{p}" if p else f"tg{g}"
    return f"{name} @ d{depth_of(test)}"


def pick_decode_test(tests: list[dict[str, Any]], depth: int | None, where: str) -> dict[str, Any]:
    """The one decode test (n_prompt 0, n_gen > 0) at `depth`, or the only one when depth is None."""
    decode = [t for t in tests if t["n_prompt"] == 0 and t["n_gen"] > 0]
    if not decode:
        present = ", ".join(_label(t) for t in tests)
        raise BadInput(f"{where}: no decode test (n_prompt 0, n_gen > 0); tests present: {present}")
    depths = sorted({depth_of(t) for t in decode})
    if depth is None and len(depths) > 1:
        raise BadInput(f"{where}: decode tests at depths {', '.join(map(str, depths))}; pick one with --depth")
    chosen = [t for t in decode if depth is None or depth_of(t) == depth]
    if not chosen:
        raise BadInput(f"{where}: no decode test at depth {depth}; depths present: {', '.join(map(str, depths))}")
    if len(chosen) > 1:
        differ = sorted(k for k in chosen[0] if k not in RECORD_FIELDS
                        and len({repr(t.get(k)) for t in chosen}) > 1)
        raise BadInput(f"{where}: {len(chosen)} decode tests at depth {depth_of(chosen[0])} "
                       f"(they differ in: {', '.join(differ) or 'nothing but timing'}); "
                       "import a run with one setting")
    return chosen[0]


def token_walls_us(test: dict[str, Any], where: str) -> tuple[list[float], str]:
    """One wall per repetition: that repetition's mean per-token time. Falls back to avg_ns."""
    n_gen = test["n_gen"]
    samples = test.get("samples_ns")
    if isinstance(samples, list) and samples:
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0 for s in samples):
            raise BadInput(f"{where}: samples_ns must hold positive numbers")
        return ([s / n_gen / 1000 for s in samples],
                f"token_wall_us: one value per repetition ({len(samples)}), each that repetition's "
                f"mean per-token time: samples_ns / n_gen ({n_gen}) / 1000")
    avg = test.get("avg_ns")
    if not isinstance(avg, (int, float)) or isinstance(avg, bool) or avg <= 0:
        raise BadInput(f"{where}: the decode test has neither samples_ns nor a positive avg_ns")
    return ([avg / n_gen / 1000],
            f"token_wall_us: no samples_ns in this llama-bench version; one value from avg_ns / n_gen "
            f"({n_gen}) / 1000, the mean over all repetitions")


def import_llama_bench(path: str | os.PathLike, depth: int | None = None) -> Trace:
    where = f"llama-bench JSON {path}"
    test = pick_decode_test(read_tests(path), depth, where)
    walls, wall_note = token_walls_us(test, where)
    notes = [wall_note, "kernels: none; llama-bench reports whole-token figures only"]
    if "n_depth" not in test:
        notes.append("workload.context: no n_depth in this llama-bench version; depth 0 assumed")
    version = test.get("build_commit")
    if "build_number" in test:
        version = f"{version} (build {test['build_number']})"
    trace = Trace(
        environment=Environment(engine="llama.cpp", engine_version=version,
                                device=test.get("gpu_info") or test.get("cpu_info"),
                                model_path=test.get("model_filename")),
        workload=Workload(depth_of(test), test["n_gen"], batch=1),
        route=RouteRecord("llama.cpp", None, {k: v for k, v in test.items() if k not in RECORD_FIELDS}),
        token_wall_us=walls,
        provenance=provenance("llama-bench", path, notes,
                              record={k: v for k, v in test.items() if k in RECORD_FIELDS}))
    return validated(trace, where)
