"""Where BoltBeam reaches into tinygrad past its public API: each module global it replaces while a token runs,
each private name it calls or reads, each model method a family or the adapter overrides. Those work because
tinygrad binds them where BoltBeam finds them; after a tinygrad refactor a patch would silently do nothing, so
`check` looks for every one before a run and refuses, naming what is gone, instead."""
from __future__ import annotations

import importlib
import inspect

from boltbeam.errors import Refused

# (module, dotted name within it, what BoltBeam does with it)
POINTS = (
    ("tinygrad.engine.realize", "to_program", "replaced while a route installs its kernels' opts (measure/route.py)"),
    ("tinygrad.codegen", "do_to_program", "replaced while a run keeps its programs on disk (measure/programs.py)"),
    ("tinygrad.helpers", "ContextVar._cache", "read: every knob's value, in a kept program's key (measure/programs.py)"),
    ("tinygrad.codegen.opt.postrange", "Scheduler.kernel_cnt", "read and moved past a kept program's name (measure/programs.py)"),
    ("tinygrad.helpers", "diskcache_get", "called: tinygrad's disk cache keeps the programs (measure/programs.py)"),
    ("tinygrad.uop.ops", "KernelInfo.beam", "read to tell a kernel BEAM searches, recorded for the route (measure/route.py)"),
    ("tinygrad.uop.ops", "KernelInfo.applied_opts", "read: the opts a kernel was compiled with (measure/route.py)"),
    ("tinygrad.engine.realize", "track_stats", "replaced while the recorder times a token (measure/tinygrad_run.py)"),
    ("tinygrad.engine.realize", "get_graph_runtime", "read by the recorder for a graph's kernels"),
    ("tinygrad.engine.jit", "run_linear", "replaced by the recorder (JIT calls) and called by direct replay"),
    ("tinygrad.engine.jit", "_prepare_jit_inputs", "called by direct replay (route/replay.py)"),
    ("tinygrad.tensor.Tensor.scaled_dot_product_attention", "", "replaced while split attention installs"),
    ("tinygrad.uop.ops", "UOp.store", "replaced while a block's attention stores into the float16 cache (route/half_cache.py)"),
    ("tinygrad.codegen.opt.search", "_time_program", "called to time a kernel as BEAM does (search/compiler.py)"),
    ("tinygrad.llm.model", "gguf_load", "replaced while the adapter loads, to keep every tensor of the file"),
    ("tinygrad.llm.model", "apply_rope", "called by the adapter's windowed attention (measure/architectures.py)"),
    ("tinygrad", "function", "the adapter's block call, as tinygrad.llm's own (measure/architectures.py)"),
    ("tinygrad.llm.model", "Transformer.from_gguf", "loads the model"),
    ("tinygrad.llm.model", "Transformer.generate", "decodes; direct replay stands in for it"),
    ("tinygrad.llm.model", "Transformer.get_start_pos", "where generate starts in a filled cache (a profile's prompt "
                                                        "decoded a token a call, direct replay)"),
    ("tinygrad.llm.model", "TransformerBlock._attention", "overridden per block by the adapter and the families"),
    ("tinygrad.llm.model", "TransformerBlock._feed_forward", "overridden per block by the adapter and the families"),
    ("tinygrad.llm.model", "TransformerBlock._init_state", "overridden per block by the adapter"),
    ("tinygrad.llm.cli", "SimpleTokenizer.from_gguf_kv", "the file's tokenizer for generate"),
)
# Attributes set inside a function rather than defined on a class: found in the function's source.
SET_IN = (
    ("tinygrad.device", "Buffer.__init__", "_base", "read to tell a view of the file's buffer from its base"),
    ("tinygrad.llm.model", "Transformer.generate", "_cached_tokens", "kept by direct replay as generate keeps it, "
                                                                     "set by a profile's prompt decoded a token a call"),
    ("tinygrad.llm.model", "TransformerBlock._attention", "cache_kv", "the KV cache the adapter's windowed attention "
                                                                     "writes as tinygrad.llm's attention does"),
    ("tinygrad.llm.model", "TransformerBlock._attention", "freqs_cis", "the rotary table the adapter's attention reads"),
)


def _find(module: str, name: str):
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):          # a class path inside a module: import the module part
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in [*parts[cut:], *filter(None, name.split("."))]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(module)


def missing() -> list[str]:
    """Every patch point this tinygrad lacks, each with what BoltBeam does there."""
    gone = []
    for module, name, why in POINTS:
        try:
            _find(module, name)
        except (ImportError, AttributeError):
            gone.append(f"{module}{'.' + name if name else ''} ({why})")
    for module, name, attr, why in SET_IN:
        try:
            found = f".{attr}" in inspect.getsource(_find(module, name))
        except (ImportError, AttributeError, OSError, TypeError):
            found = False
        if not found:
            gone.append(f"{module}.{name} setting {attr} ({why})")
    return gone


def check() -> None:
    """Refuse, before anything runs, a tinygrad whose patch points are not where BoltBeam reaches them."""
    if gone := missing():
        from importlib.metadata import version
        raise Refused(f"tinygrad {version('tinygrad')} lacks what BoltBeam reaches into (written for 0.13.0): "
                      f"{'; '.join(gone[:3])}{f' and {len(gone) - 3} more' if len(gone) > 3 else ''}")
