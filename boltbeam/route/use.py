"""A route in users' hands: the settings of each generated family from a route file or flags, and the model
loaded with all of them, for `boltbeam profile`, `boltbeam generate` and users' own tinygrad programs:

    import os; os.environ["DEV"] = "CPU"            # tinygrad reads its device when first imported
    from boltbeam.route import use
    with use.load("model.gguf", "route.json") as routed:
        ids = routed.tokenizer.prefix() + routed.tokenizer.encode("The sky is")
        for token in routed.net.generate(ids):       # greedy, with every family and kernel choice of the route
            ...

A route made for another model or compiler is refused in one line; `BOLTBEAM_ROUTE=none` turns it all off.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import pathlib
from dataclasses import dataclass, field
from typing import Any, Iterator

from boltbeam.errors import BadInput
from boltbeam.measure import route as routes
from boltbeam.measure.route import Route, env_off


def layout_of(flag: str | None, from_route: dict[str, str] | None):
    """The layout setting to build at load, from --layout or the route file; None when off."""
    from boltbeam.route.layout import Setting
    if flag == "none" or env_off():
        return None
    if flag is not None:
        return Setting.parse(flag)
    if not from_route:
        return None
    required, optional = {"scale_dtype", "form"}, {"stack"}    # routes written before the stack knob lack it
    if not required <= set(from_route) <= required | optional:
        raise BadInput(f"route layout {from_route}: expected the keys scale_dtype and form, and optionally stack")
    return Setting(**from_route)


def split_of(flag: str | None, from_route: dict[str, Any] | None):
    """The split-attention setting to build, from --split-attention or the route file; None when off."""
    from boltbeam.route.attention import KNOBS, Split
    if flag is not None:
        return Split.parse(flag)
    if from_route is None:
        return None
    # (the knobs after staged came after the first routes were written: a route without them runs them off)
    if not {"chunk", "staged"} <= set(from_route) <= {"chunk", *KNOBS}:
        raise BadInput(f"route split_attention {from_route}: expected the keys chunk, {', '.join(KNOBS[:-1])} "
                       f"and {KNOBS[-1]}")
    return Split(**from_route)


def knobs_of(kind, flag: str | None, from_route: dict[str, int] | None, what: str, later: tuple[str, ...] = ()):
    """A family's setting of dataclass `kind` from its flag or the route file's table `what`; None when off.
    The knobs in `later` came after the first routes were written: a route without them runs them off."""
    if flag is not None:
        return kind.parse(flag)
    if from_route is None:
        return None
    keys = [f.name for f in dataclasses.fields(kind)]
    if not set(keys) - set(later) <= set(from_route) <= set(keys):
        raise BadInput(f"route {what} {from_route}: expected the keys {', '.join(k for k in keys if k not in later)}"
                       + (f" (and {', '.join(later)}, which may be left out)" if later else ""))
    return kind(**from_route)


def families_of(layout, constants_once: bool, split_attention=None, gemv=None, fusion=None,
                direct_replay: bool = False) -> list:
    """The generated route families to build on the loaded model, in order (as Route.families names
    them); none when switched off."""
    from boltbeam.route import attention, constants, fusion as fusions, gemv as gemvs, layout as layouts, replay
    if env_off():
        return []
    for name, setting in (("gemv", gemv), ("fusion", fusion)):
        if setting is not None and (layout is None or layout.form != "kernel"):
            raise BadInput(f"--{name} {setting.flag} builds on the layout's generated kernel: it needs "
                           f"--layout SCALES:kernel[:stacked]")
    families = [functools.partial(_install, install, setting) for install, setting in
                ((layouts.install, layout), (gemvs.install, gemv), (fusions.install, fusion)) if setting is not None]
    if constants_once:
        families.append(constants.install)
    if split_attention is not None:
        families.append(functools.partial(_install, attention.install, split_attention))
    if direct_replay:
        families.append(replay.install)
    return families


def _install(install, setting, net, census, path):
    """One family's install at its setting (a module-level function, so a fan-out can send it)."""
    return install(net, census, path, setting)


@dataclass(frozen=True)
class Flags:
    """What a command line says of the families, each overriding the route's own setting (None: the route's)."""
    layout: str | None = None
    split_attention: str | None = None
    gemv: str | None = None
    fusion: str | None = None
    constants_once: bool = False
    direct_replay: bool = False


def families(route: tuple[str, Route] | None, flags: Flags = Flags()) -> list:
    """The families to build on the loaded model: each from its flag, else from the route (path, Route)."""
    from boltbeam.route import fusion, gemv
    r = route[1] if route else None
    layout = layout_of(flags.layout, r.layout if r else None)
    split = split_of(flags.split_attention, r.split_attention if r else None)
    geometry = gemv.setting_of(flags.gemv, r.gemv if r else None, f"route {route[0]}" if route else "route")
    folded = knobs_of(fusion.Fusion, flags.fusion, r.fusion if r else None, "fusion", fusion.LATER)
    return families_of(layout, flags.constants_once or bool(r and r.constants_once), split, geometry, folded,
                       flags.direct_replay or bool(r and r.direct_replay))


def route_for(path: str | None, model: str, hash_check: bool = True) -> tuple[str, Route] | None:
    """(path, route) to run, checked against this model and compiler; None when off."""
    from boltbeam.files import sha256_file
    from boltbeam.read.census import take_census
    if routes.switched_off(path):
        return None
    r = routes.load(path)
    take_census(model)   # a model that is missing or no GGUF is one line here, before it is hashed
    routes.check_applies(r, sha256_file(model) if hash_check else None, routes.engine(), path)
    return path, r


@dataclass
class Routed:
    """A model loaded as a route says: tinygrad.llm's Transformer with the route's families built on it, the
    file's own tokenizer (tinygrad.llm's), and which routed kernels tinygrad has compiled with the route's opts."""
    net: Any
    tokenizer: Any
    built: list[Any] = field(default_factory=list)       # each family's Prepared: what it changed
    applied: routes.Applied = field(default_factory=routes.Applied)
    beam: int = 0                                        # tinygrad's BEAM width the route was judged with
    notes: list[str] = field(default_factory=list)


TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.eot_token_id")


def tokenizer_kv(model: str) -> dict[str, Any]:
    """The file's tokenizer metadata, read from its header alone (the weights stay on disk)."""
    from boltbeam.read.gguf_file import open_gguf, scalar, strings
    reader = open_gguf(model)
    kv = {key: scalar(reader, key) for key in TOKENIZER_KEYS if key != "tokenizer.ggml.tokens"}
    kv["tokenizer.ggml.tokens"] = strings(reader, "tokenizer.ggml.tokens")
    return {k: v for k, v in kv.items() if v is not None}


def tokenizer_of(kv: dict) -> tuple[Any, list[str]]:
    """tinygrad.llm's tokenizer for the file's vocabulary. Its presets differ only in chat markup and in a
    check of the name; a pre-tokenizer it does not name is split its default way, and the note says so."""
    from tinygrad.llm.cli import SimpleTokenizer
    if kv.get("tokenizer.ggml.model") != "gpt2" or not {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type"} <= kv.keys():
        raise BadInput(f"tinygrad.llm's tokenizer reads byte-level BPE vocabularies (tokenizer.ggml.model gpt2); "
                       f"this file's is {kv.get('tokenizer.ggml.model')!r}")
    try:
        return SimpleTokenizer.from_gguf_kv(kv), []
    except ValueError:
        pre, default = kv.get("tokenizer.ggml.pre"), inspect.signature(SimpleTokenizer).parameters["preset"].default
        return SimpleTokenizer.from_gguf_kv({**kv, "tokenizer.ggml.pre": default}), [
            f"tinygrad.llm's tokenizer has no pre-tokenizer {pre!r}: the text is split its default ({default}) way, "
            f"so digits and contractions may take other tokens than the model's own tokenizer gives them"]


@contextlib.contextmanager
def load(model: str, route: str | None = None, flags: Flags = Flags(), positions: int = 1,
         hash_check: bool = True, tokenizer: tuple[Any, list[str]] | None = None) -> Iterator[Routed]:
    """The model loaded with the route's families and its kernels' opts (while inside the `with`, where
    tinygrad compiles them), its KV cache holding at least `positions`. tinygrad's device is the one DEV named
    when it was first imported. `tokenizer`: tokenizer_of's answer where the caller has it already."""
    from boltbeam.measure import seam
    from boltbeam.measure.tinygrad_run import kv_positions
    from boltbeam.read.census import take_census
    census = take_census(model)
    seam.check()                                   # before the adapter's own imports of tinygrad.llm
    from boltbeam.measure import architectures
    routed_path = route_for(route, model, hash_check)
    build = families(routed_path, flags)           # before minutes of loading: a bad setting is one line now
    r = routed_path[1] if routed_path else None
    from tinygrad import Context
    # The route was judged with its BEAM width: the kernels it leaves to tinygrad are searched with it.
    with routes.install(r.opts_by_kernel() if r else {}) as applied, Context(BEAM=r.beam if r else 0):
        tokenizer, notes = tokenizer or tokenizer_of(tokenizer_kv(model))
        # the cache sized as profile and the search size it: a route's kernel keys hold its shape
        net = architectures.load(pathlib.Path(model), kv_positions(census, positions), census)
        built = [family(net, census, model) for family in build]
        yield Routed(net, tokenizer, built, applied, r.beam if r else 0, notes)


def label(routed: Routed) -> str:
    """What ran, in words: the families built and the route's kernels, or tinygrad's own."""
    built = [f"{p.family} ({p.summary()})" if hasattr(p, "summary") else p.family for p in routed.built]
    kernels = f"{len(routed.applied.kernels)} kernel(s) with the route's opts" if routed.applied.kernels else ""
    return ", ".join([*built, *([kernels] if kernels else [])]) or "tinygrad's own"

