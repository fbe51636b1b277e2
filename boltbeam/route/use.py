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
import inspect
import pathlib
from dataclasses import dataclass, field
from typing import Any, Iterator

from boltbeam.errors import BadInput
from boltbeam.measure import route as routes
from boltbeam.measure.route import Route
from boltbeam.route.families import Flags, installers, settings


def families(route: tuple[str, Route] | None, flags: Flags = Flags()) -> list:
    """The families to build on the loaded model, in order: each from its flag, else from the route (path, Route)."""
    return installers(settings(route, flags))


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
    pre, default = kv.get("tokenizer.ggml.pre"), inspect.signature(SimpleTokenizer).parameters["preset"].default
    try:
        if pre is not None:
            with contextlib.suppress(ValueError):     # a pre-tokenizer it does not name
                return SimpleTokenizer.from_gguf_kv(kv), []
        why = f"tinygrad.llm's tokenizer has no pre-tokenizer {pre!r}" if pre is not None else "the file names no pre-tokenizer"
        return SimpleTokenizer.from_gguf_kv({**kv, "tokenizer.ggml.pre": default}), [
            f"{why}: the text is split its default ({default}) way, so digits and contractions may take other tokens "
            f"than the model's own tokenizer gives them"]
    except (KeyError, IndexError, TypeError) as e:   # a piece no byte spells, fewer types than tokens, a number
        raise BadInput(f"the file's vocabulary is not byte-level BPE as tinygrad.llm's tokenizer reads it "
                       f"({type(e).__name__}: {str(e)[:40]})") from None


@contextlib.contextmanager
def load(model: str, route: str | None = None, flags: Flags = Flags(), positions: int = 1,
         hash_check: bool = True, tokenizer: tuple[Any, list[str]] | None = None) -> Iterator[Routed]:
    """The model loaded with the route's families and its kernels' opts (while inside the `with`, where
    tinygrad compiles them), its KV cache holding at least `positions`. tinygrad's device is the one DEV named
    when it was first imported. `tokenizer`: tokenizer_of's answer where the caller has it already."""
    from boltbeam.measure import programs, seam
    from boltbeam.measure.tinygrad_run import kv_positions
    from boltbeam.read.census import take_census
    census = take_census(model)
    seam.check()                                   # before the adapter's own imports of tinygrad.llm
    from boltbeam.measure import architectures
    routed_path = route_for(route, model, hash_check)
    build = families(routed_path, flags)           # before minutes of loading: a bad setting is one line now
    r = routed_path[1] if routed_path else None
    from tinygrad import Context
    # The route was judged with its BEAM width: the kernels it leaves to tinygrad are searched with it, unless it
    # carries them as BEAM compiled them (Route.load_beam).
    with routes.install(r.opts_by_kernel() if r else {}) as applied, Context(BEAM=r.load_beam() if r else 0), \
            programs.kept():
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

