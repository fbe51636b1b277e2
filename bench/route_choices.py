"""What carrying BEAM's choices in the route saves at load: `profile --route` in a fresh process with an empty
tinygrad cache, on a route that carries its kernels as BEAM=1 compiled them and on the same route without them
(BEAM=1 searches again at load, as before issue 32). Each process's wall and CPU seconds, and tinygrad's
beam_search calls, counted in the process.

  .venv/bin/python bench/route_choices.py --out bench/records/route_choices.json [--carried 3] [--searched 1]
"""
import argparse
import dataclasses
import datetime as dt
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COUNTED = """
import sys, atexit
from tinygrad.codegen.opt import search
calls, orig = [], search.beam_search
search.beam_search = lambda *a, **k: calls.append(1) or orig(*a, **k)
atexit.register(lambda: print(f"beam searches: {len(calls)}", file=sys.stderr))
from boltbeam.cli import main
sys.exit(main(sys.argv[1:]))
"""
DEPTH = ["--context", "4", "--tokens", "5"]


def run(folder: Path, *argv: str) -> dict:
    """One fresh process, its caches empty: wall and CPU seconds, and its BEAM searches."""
    folder.mkdir()
    env = {**os.environ, "DEV": "CPU", "CACHEDB": str(folder / "cache.db"), "XDG_CACHE_HOME": str(folder)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", COUNTED, *argv], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(done.stderr[-2000:])
    return {"wall_s": round(wall, 2), "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
            "beam_searches": int(done.stderr.rsplit("beam searches: ", 1)[1].split()[0]), "load_avg_1m": os.getloadavg()[0]}


def main() -> None:
    from boltbeam.files import sha256_file, write_json
    from boltbeam.measure import route as routes
    from boltbeam.synth.writer import shape_from, write
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--carried", type=int, default=3, help="loads of the route carrying its kernels")
    p.add_argument("--searched", type=int, default=1, help="loads of the route without them (BEAM=1 at load)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = str(tmp / "tiny.gguf")
        write(model, "qwen3", shape_from("tiny"), "q4_k_m")
        profile = ["profile", model, "--device", "CPU", *DEPTH]
        written = run(tmp / "written", *profile, "--beam", "1", "--out", str(tmp / "beam.json"))
        route = routes.judged_by(routes.Route(sha256_file(model), routes.engine(), "CPU", "host-like", "tinygrad_opts",
                                              "tinygrad scheduler", [], beam=1), str(tmp / "beam.json"))
        routes.save(route, tmp / "carried.json")
        routes.save(dataclasses.replace(route, compiled=[], compiler=None), tmp / "searched.json")
        samples = {name: [run(tmp / f"{name}{i}", *profile, "--route", str(tmp / f"{name}.json"), "--out",
                              str(tmp / f"{name}{i}.json")) for i in range(n)]
                   for name, n in (("carried", args.carried), ("searched", args.searched))}
    from importlib.metadata import version
    write_json(args.out, {
        "what": "profile --route on the tiny model (2-block qwen3 Q4_K_M), CPU, in a fresh process with an empty "
                "tinygrad cache (CACHEDB, XDG_CACHE_HOME): the route carrying its kernels as BEAM=1 compiled them, "
                "and the same route without them (BEAM=1 searches again at load). Each process whole: load, "
                "compile, 3 warm-up and 2x5 measured tokens.",
        "command": " ".join(["bench/route_choices.py", *sys.argv[1:]]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "shared": "yes: other sessions' work ran beside"},
        "versions": {"tinygrad": version("tinygrad"), "python": platform.python_version()},
        "kernels_carried": len(route.compiled),
        "written_with_beam_1": written, "samples": samples})


if __name__ == "__main__":
    main()
