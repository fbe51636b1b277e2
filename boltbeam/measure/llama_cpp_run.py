"""Decode through llama.cpp (its Python binding, llama-cpp-python) and record every kernel of its
CUDA graphs with the same CUPTI path as tinygrad's profile: one trace, region by region comparable.

The run (`llama_cpp_child`, a process of its own: llama.cpp's CUDA load crashed in a process that had
imported `gguf` or `cupti` first): load the model fully on the GPU, prefill the same fixed prompt
tinygrad's profile uses, warm up, decode the plain tokens users get (nothing recording: the wall),
then turn CUPTI on and decode the timed tokens, each timed per kernel and then one timed per launch (CUPTI's
graph records and the graph-launch calls, no kernel instrumented: what the per-kernel records cost, and
launch and sync measured on tokens nearly plain), flushed once. Host marks on CUPTI's clock before each
`lc.llama_decode` and after its token is read back. Greedy tokens, one decode call of one token per step,
`lc.llama_synchronize` and the logits read back each step, as a chat session does. This process turns the
child's raw records into the trace.

llama.cpp's kernels carry no tensor: which weight each one reads is found afterwards from facts
(`llama_cpp_roles.assign`), never from the kernel's name alone.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Callable

from boltbeam import __version__, switches
from boltbeam.errors import BadInput, Refused
from boltbeam.files import sha256_file
from boltbeam.measure.graph_timing import (Cupti, KernelRecord, LaunchTimed, alternate, launch_fields, launch_timed,
                                           split_by_token)
from boltbeam.measure.llama_cpp_child import RawRun, Request
from boltbeam.measure.llama_cpp_roles import assign, products_in_order
from boltbeam.measure.tinygrad_run import prompt_tokens
from boltbeam.measure.trace import Environment, Kernel, KernelPass, Provenance, RouteRecord, Trace, Workload
from boltbeam.read.census import take_census

ENGINE = "llama.cpp"


@dataclass
class _Timed:
    wall_us: float
    marks_ns: tuple[int, int]
    records: list[KernelRecord]


def _device() -> tuple[str | None, str | None]:
    """The GPU's name and its driver, as nvidia-smi reports them; None where it cannot."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i",
                              (switches.VISIBLE_DEVICES.value or "0").split(",")[0]],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, None
    name, _, driver = out.partition(",")
    return name.strip() or None, driver.strip() or None


def profile(model: str, context: int, tokens: int, warmup: int = 3, model_hash: bool = True,
            progress: Callable[[str, int], None] | None = None) -> Trace:
    """Decode `model` in llama.cpp on CUDA (in a child process: `llama_cpp_child`); plain tokens, then tokens
    timed kernel by kernel through CUPTI."""
    if tokens < 1 or warmup < 1 or context < 0:
        raise BadInput("need --tokens >= 1, --warmup >= 1 and --context >= 0")
    census = take_census(model)
    if census.unclassified:
        raise BadInput(f"model {model}: {len(census.unclassified)} tensor(s) unclassified (adapter-incomplete): "
                       f"its kernels could not be given roles")
    Cupti()              # fails here, before the model loads, if cupti-python is missing
    prompt = prompt_tokens(context, census.facts.vocabulary)
    with tempfile.TemporaryDirectory() as tmp:
        raw = _child(Request(model, len(prompt) + warmup + 3 * tokens + 8, prompt, tokens, warmup,
                             os.path.join(tmp, "raw.json")), progress or (lambda stage, n: None))
    marks, where = [tuple(m) for m in raw.marks_ns], f"{ENGINE}, timing cupti"
    records = raw.cupti_records()
    if raw.launch_walls_us and len(raw.launch_walls_us) == len(raw.timed_walls_us):
        per_token, graphs, calls = alternate(records, marks, where)
        timed_marks = marks[0::2]
        # graph records see only graphs: the span of a token that also ran kernels alone would miss them
        alone = any(not r.graph_id for rs in per_token for r in rs)
        launched = [] if alone else [
            launch_timed(m, w, g, c, len({r.graph_id for r in rs}), f"{where}, token {i} timed per launch")
            for i, (m, w, g, c, rs) in enumerate(zip(marks[1::2], raw.launch_walls_us, graphs, calls, per_token))]
        if alone:
            raw.notes.append("kernels ran outside graphs, which graph records do not see: the tokens timed per "
                             "launch are left out")
    else:
        per_token, timed_marks, launched = split_by_token(records.kernels, [m[0] for m in marks] + [marks[-1][1] + 1],
                                                          where), marks, []
    timed = [_Timed(w, m, r) for w, m, r in zip(raw.timed_walls_us, timed_marks, per_token)]
    trace = _trace(model, prompt, raw, timed, launched, model_hash, warmup)
    return assign(trace, products_in_order(census))


def reference_tokens(model: str, prompt: list[int], steps: int,
                     progress: Callable[[str, int], None] | None = None) -> tuple[list[int], str]:
    """llama.cpp's greedy tokens on `prompt`: the prefill's and `steps` decode steps' (in its own process, nothing
    timed; on whatever device its binding was built for), and the engine as a trace names it."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = _child(Request(model, len(prompt) + steps + 8, prompt, steps, 0, os.path.join(tmp, "raw.json"),
                             timed=False), progress or (lambda stage, n: None))
    return raw.output_tokens, f"{ENGINE} (llama-cpp-python {raw.binding})"


def _child(request: Request, tick: Callable[[str, int], None]) -> RawRun:
    """Run the decode in `llama_cpp_child`, passing its progress on; its one-line error is ours."""
    proc = subprocess.Popen([sys.executable, "-m", "boltbeam.measure.llama_cpp_child"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc.stdin.write(json.dumps(asdict(request)))
    proc.stdin.close()
    said = []
    for line in proc.stderr:
        if line.startswith("tick "):
            tick(line[5:].strip(), 1)
        elif line.strip():
            said.append(line.strip())
    if proc.wait() == 0:
        with open(request.out) as f:
            return RawRun(**json.load(f))
    if proc.returncode == 2:
        raise BadInput(said[-1] if said else "llama.cpp refused the request")
    raise Refused(f"llama.cpp's decode ended with exit code {proc.returncode}: {said[-1] if said else 'no message'}")


def _trace(model: str, prompt: list[int], raw: RawRun, timed: list[_Timed], launched: list[LaunchTimed],
           model_hash: bool, warmup: int) -> Trace:
    kernels, lead, trail = [], [], []
    for tok, t in enumerate(timed):
        if not t.records:
            raise Refused(f"adapter-incomplete: {ENGINE}: timed token {tok} recorded no kernel (was the model "
                          f"offloaded to the GPU?)")
        rs = sorted(t.records, key=lambda r: r.start_ns)
        t0 = rs[0].start_ns
        lead.append((t0 - t.marks_ns[0]) / 1e3)
        trail.append((t.marks_ns[1] - max(r.end_ns for r in rs)) / 1e3)
        keys = [r.graph_id or ("alone", i) for i, r in enumerate(rs)]    # each graph, or kernel launched alone
        launches = {key: n for n, key in enumerate(dict.fromkeys(keys))}   # numbered by its first start
        kernels += [Kernel(token=tok, index=i, name=r.facts.name, duration_us=(r.end_ns - r.start_ns) / 1e3,
                           start_us=(r.start_ns - t0) / 1e3, global_size=list(r.facts.grid),
                           local_size=list(r.facts.block), launch=launches[key])
                    for i, (r, key) in enumerate(zip(rs, keys))]
    graphs = [len({r.graph_id for r in t.records if r.graph_id}) for t in timed]
    outside = [sum(1 for r in t.records if not r.graph_id) for t in timed]
    walls, out = raw.walls_us, raw.output_tokens
    device_name, driver = _device()
    first_timed = len(prompt) + len(out) - 1 - len(timed) - len(launched)
    return Trace(
        environment=Environment(engine=ENGINE, engine_version=f"llama-cpp-python {raw.binding}", device="CUDA",
                                device_name=device_name, driver=driver, host=platform.node(),
                                python=platform.python_version(), command=" ".join(sys.argv), model_path=model,
                                model_sha256=sha256_file(model) if model_hash else None,
                                tool=f"boltbeam {__version__}"),
        workload=Workload(len(prompt), len(walls), warmup, batch=1,
                          kernel_pass_depths=list(range(first_timed, first_timed + (len(timed) + len(launched)),
                                                        2 if launched else 1)),
                          prompt="boltbeam.measure.tinygrad_run.prompt_tokens"),
        route=RouteRecord("llama.cpp (flash attention, all layers on the GPU)", None,
                          {"flash_attn": True, "n_gpu_layers": -1, "n_batch": 512}),
        token_wall_us=walls, output_tokens=out, kernel_pass_wall_us=[t.wall_us for t in timed], kernels=kernels,
        kernel_pass=KernelPass("cupti", [1] * len(timed), [g + o for g, o in zip(graphs, outside)], lead, trail,
                               **launch_fields(launched)),
        provenance=Provenance("profile", __version__, dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                              timing=f"in the graph replay: CUPTI activity records of every kernel of llama.cpp's own "
                                     f"CUDA graphs, flushed once after the measured tokens (cupti-python "
                                     f"{raw.cupti_python}); one decode call per token"
                                     + ("; beside each such token one timed per launch (graph records and graph-launch "
                                        "calls only)" if launched else ""),
                              notes=[f"kernels launched outside a graph per token: {sorted(set(outside))}", *raw.notes],
                              inputs=[{"path": model, "sha256": None}]))
