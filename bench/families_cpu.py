"""The generated route families on a real model, on this machine's CPU: the embedded SmolLM2 decoded
with tinygrad's default route, with the repacked layout, with constants computed once, and with
both; then the layout's generated kernel (stacked) with constants once, with the norms folded into
it, and with a gemv geometry on its words besides (on a CPU only the rows a thread sums and the bytes
a load take effect); each judged against the default (greedy tokens identical over every decoded
step, the whole token faster beyond noise). One profile per route, in its own process, one after
another.

    .venv/bin/python bench/families_cpu.py [--tokens 32] [--out bench/records/families_cpu.json]
"""
import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

# route -> (profile flags, the label the trace must carry: every layer and constant the family could take)
ROUTES = {"default": ([], "tinygrad-scheduler"),
          "layout": (["--layout", "float16:expanded"], "generated-layout + tinygrad-scheduler"),
          "constants-once": (["--constants-once"], "constants-once + tinygrad-scheduler"),
          "layout + constants-once": (["--layout", "float16:expanded", "--constants-once"],
                                      "generated-layout + constants-once + tinygrad-scheduler"),
          "kernel stacked + constants-once": (["--layout", "float16:kernel:stacked", "--constants-once"],
                                              "generated-layout + constants-once + tinygrad-scheduler"),
          "kernel stacked + fusion + constants-once": (
              ["--layout", "float16:kernel:stacked", "--fusion", "norm", "--constants-once"],
              "generated-layout + fusion + constants-once + tinygrad-scheduler"),
          "kernel stacked + gemv + fusion + constants-once": (
              ["--layout", "float16:kernel:stacked", "--gemv", "1:1:4:16", "--fusion", "norm", "--constants-once"],
              "generated-layout + gemv-geometry + fusion + constants-once + tinygrad-scheduler")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", default="bench/records/families_cpu.json")
    args = ap.parse_args()
    from boltbeam.cli.read import default_model
    from importlib.metadata import version
    model = default_model()
    rows, tmp = [], tempfile.mkdtemp()
    for name, (flags, label) in ROUTES.items():
        out = os.path.join(tmp, f"{name.replace(' + ', '_')}.json")
        cmd = [sys.executable, "-m", "boltbeam", "profile", model, "--device", "CPU", "--context", "8",
               "--tokens", str(args.tokens), "--no-hash", "--out", out, "--json", *flags]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        trace = json.load(open(out))
        row = {"route": name, "flags": flags, "label": trace["route"]["label"], "process_s": time.perf_counter() - t0,
               "median_token_us": statistics.median(trace["token_wall_us"]), "token_wall_us": trace["token_wall_us"],
               "output_tokens": trace["output_tokens"], "families": trace["route"]["settings"].get("families"),
               "kernels_per_token": sum(k["token"] == trace["kernels"][0]["token"] for k in trace["kernels"])}
        if name != "default":
            checks = os.path.join(tmp, "checks.json")
            with open(checks, "w") as f:
                json.dump({"expected_route": label}, f)
            judged = subprocess.run([sys.executable, "-m", "boltbeam", "judge", "--baseline", rows[0]["trace"],
                                     "--candidate", out, "--checks", checks, "--json"], capture_output=True, text=True)
            j = json.loads(judged.stdout)
            row["verdict"], row["reasons"] = j["verdict"], j["reasons"]
            row["gates"] = {g: v["status"] for g, v in j["gates"].items()}
        row["trace"] = out
        rows.append(row)
        print(f"{name:48s} {row['median_token_us'] / 1e3:8.1f} ms/token {row['kernels_per_token']:5d} kernels  "
              f"{row.get('verdict', '')}", flush=True)
    for r in rows:
        r.pop("trace")
    record = {"command": " ".join(sys.argv), "machine": platform.node(), "cpu": platform.processor() or platform.machine(),
              "cores": os.cpu_count(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "versions": {p: version(p) for p in ("tinygrad", "gguf", "boltbeam")}, "model": os.path.basename(model),
              "identical_greedy_tokens": all(r["output_tokens"] == rows[0]["output_tokens"] for r in rows),
              "rows": rows}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
