"""tinygrad's BEAM choices carried between device sessions, as plain JSON (no pickle leaves or enters the machine).

A cold BEAM=2 search of the 8B-shaped decode costs 370-500 s of a session's 1,800 s of device time, and each
cold search may choose other kernels (the baseline moved 6.3-6.9 ms between sessions). tinygrad keys a BEAM
result by the kernel's AST, the width, the device and the renderer, so a choice made on one H200 holds on the
next with the same tinygrad. `export` reads the `beam_search` table of tinygrad's cache (CACHEDB) into JSON;
`import` writes each choice back through tinygrad's own `diskcache_put`, before anything compiles.

  CACHEDB=/tmp/tinygrad_cache.db python3 bench/h200/beam_cache.py export OUT.json
  CACHEDB=/tmp/tinygrad_cache.db python3 bench/h200/beam_cache.py import IN.json
"""
import json
import pickle
import sqlite3
import sys


def export(out: str) -> None:
    from tinygrad.codegen.opt import Opt
    from tinygrad.helpers import CACHEDB, VERSION
    rows = sqlite3.connect(CACHEDB).execute(
        f"SELECT ast, amt, allow_test_size, device, suffix, val FROM 'beam_search_{VERSION}'").fetchall()
    entries = []
    for ast, amt, allow, device, suffix, val in rows:
        opts = pickle.loads(val)      # tinygrad's own cache, written by this machine's run
        assert all(isinstance(o, Opt) for o in opts)
        entries.append({"ast": ast.hex(), "amt": amt, "allow_test_size": allow, "device": device, "suffix": suffix,
                        "opts": [[o.op.name, o.axis, o.arg] for o in opts]})
    with open(out, "w") as f:
        json.dump({"tinygrad_cache_version": VERSION, "beam_search": entries}, f)
    print(f"exported {len(entries)} BEAM choices to {out}")


def load(path: str) -> None:
    from tinygrad.codegen.opt import Opt, OptOps
    from tinygrad.helpers import VERSION, diskcache_put
    d = json.load(open(path))
    if d.get("tinygrad_cache_version") != VERSION:
        sys.exit(f"{path}: BEAM choices of tinygrad's cache version {d.get('tinygrad_cache_version')}, this is {VERSION}")
    for e in d["beam_search"]:
        key = {"ast": bytes.fromhex(e["ast"]), "amt": e["amt"], "allow_test_size": bool(e["allow_test_size"]),
               "device": e["device"], "suffix": e["suffix"]}
        diskcache_put("beam_search", key, [Opt(OptOps[op], axis, arg) for op, axis, arg in e["opts"]])
    print(f"imported {len(d['beam_search'])} BEAM choices from {path}")


if __name__ == "__main__":
    {"export": export, "import": load}[sys.argv[1]](sys.argv[2])
