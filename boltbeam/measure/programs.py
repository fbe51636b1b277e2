"""tinygrad keeps the programs it generates (a kernel's AST optimized, linearized, rendered and compiled) in memory
only: every process generates each kernel again, about a third of a small model's profile on a CPU. While `kept()`
holds, each program also goes to tinygrad's own disk cache (CACHEDB, which tinygrad already trusts with its
compiled binaries and BEAM's choices) and a later process takes it from there.

The key is the one tinygrad's in-memory cache uses (the AST, which carries its BEAM width and opts, and the
renderer and its target), widened for a cache that outlives the process: tinygrad's version, the value of
every ContextVar it declares, and every environment variable its source reads with getenv. A change to any of
them is a miss, never a stale program."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import pathlib
import re
from typing import Iterator

TABLE, NAMES = "boltbeam_program", "boltbeam_program_name"


@functools.cache
def _release_and_getenv_names() -> tuple[str, ...]:
    """tinygrad's version, then every name its source reads with getenv("NAME", ...): read once a process."""
    from importlib.metadata import version

    import tinygrad
    found = set()
    for source in pathlib.Path(tinygrad.__file__).parent.rglob("*.py"):
        found.update(re.findall(r"""getenv\(\s*["']([A-Za-z0-9_]+)["']""", source.read_text(errors="replace")))
    return (version("tinygrad"), *sorted(found))


def key(ast, renderer) -> str:
    from tinygrad.helpers import ContextVar, getenv
    release, *names = _release_and_getenv_names()
    knobs = sorted((name, var.value) for name, var in ContextVar._cache.items())
    env = [(name, getenv(name, "")) for name in names]          # as tinygrad reads them
    return hashlib.sha256(repr((release, ast.key, type(renderer).__module__, type(renderer).__qualname__,
                                renderer.target, knobs, env)).encode()).hexdigest()


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Programs generated inside come from, and go to, the disk cache. Only a kernel as the scheduler hands it
    over (no opts applied yet, tag None) is kept: BEAM's candidates come already optimized, and BEAM keeps its
    choice itself.

    tinygrad names a kernel with a counter per name in the process (r_4_4, then r_4_4n1), and a trace's kernels
    are compared by name: a program from disk is taken only where this process would give it the name it has
    (the counter at the same count), else it is generated afresh. A process names its kernels as it would
    with nothing kept."""
    import tinygrad.codegen as codegen
    from tinygrad.codegen.opt.postrange import Scheduler
    from tinygrad.helpers import diskcache_get, diskcache_put
    from tinygrad.uop.ops import KernelInfo, Ops
    orig = codegen.do_to_program

    def do_to_program(ast, renderer):
        if ast.op is not Ops.SINK or not isinstance(ast.arg, KernelInfo) or ast.tag is not None:
            return orig(ast, renderer)
        k = key(ast, renderer)
        # the name's base (its counter's key) under the key, the program under the key and the count it names
        if (base := diskcache_get(NAMES, k)) is not None and \
                (program := diskcache_get(TABLE, f"{k} {Scheduler.kernel_cnt[base] + 1}")) is not None:
            Scheduler.kernel_cnt[base] += 1
            return program
        before = dict(Scheduler.kernel_cnt)
        program = orig(ast, renderer)
        counted = [(name, n) for name, n in Scheduler.kernel_cnt.items() if before.get(name, 0) != n]
        if len(counted) == 1:
            diskcache_put(NAMES, k, counted[0][0])
            diskcache_put(TABLE, f"{k} {counted[0][1]}", program)
        return program

    codegen.do_to_program = do_to_program
    try:
        yield
    finally:
        codegen.do_to_program = orig


@contextlib.contextmanager
def given(ready: dict) -> Iterator[None]:
    """Programs compiled in other processes of this machine for this process's renderer (search/compiler.py's
    compile pool), by their AST's key: while this holds, tinygrad takes a program from `ready` (filled as they
    arrive) instead of generating it again. A kernel not there is generated as always."""
    import tinygrad.codegen as codegen
    orig = codegen.do_to_program

    def do_to_program(ast, renderer):
        program = ready.get(ast.key)
        return orig(ast, renderer) if program is None else program

    codegen.do_to_program = do_to_program
    try:
        yield
    finally:
        codegen.do_to_program = orig


def active() -> bool:
    """Whether a `kept()` or a `given()` is in force in this process (tinygrad's programs are not all its own)."""
    import tinygrad.codegen as codegen
    return codegen.do_to_program.__module__ == __name__
