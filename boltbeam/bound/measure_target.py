"""Measure the present device's memory bandwidth (and matrix rate) through the compiler, and write
the result as a target entry with status `measured`. `host` is this, cached on first use."""
from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from boltbeam.bound.targets import HOST, _load_file, host_cache_path
from boltbeam.errors import BadInput
from boltbeam.files import write_atomic


def _tinygrad():
    try:
        import tinygrad
        return tinygrad
    except ImportError:
        raise BadInput("measuring a target needs tinygrad: pip install 'boltbeam[measure]'") from None


def _median_s(fn, reps: int) -> tuple[float, list[float]]:
    from tinygrad import Device
    samples = []
    for _ in range(reps):
        Device[Device.DEFAULT].synchronize()
        t0 = time.perf_counter()
        fn()
        Device[Device.DEFAULT].synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), samples


def measure(size_bytes: int, reps: int = 10, matmul_n: int = 0, beam: int = 0) -> dict[str, Any]:
    """Read bandwidth (a sum over `size_bytes`), copy bandwidth (read + write) and, if matmul_n,
    an fp16 matrix product's rate, each the median of `reps` timed runs after warm-up. With beam > 0
    tinygrad's BEAM search picks the kernels' opts (its heuristics leave a plain sum short of the memory)."""
    _tinygrad()
    from tinygrad import Context, Device, Tensor, TinyJit, dtypes

    n = size_bytes // 4
    a = Tensor.rand(n, dtype=dtypes.float32).contiguous().realize()
    read = TinyJit(lambda x: x.sum().realize())
    copy = TinyJit(lambda x: (x + 1).realize())
    with Context(BEAM=beam):
        for _ in range(3):  # the JIT captures on the second call; compile stays out of the numbers
            read(a), copy(a)
    read_s, read_samples = _median_s(lambda: read(a), reps)
    copy_s, copy_samples = _median_s(lambda: copy(a), reps)
    out: dict[str, Any] = {
        "device": Device.DEFAULT, "size_bytes": n * 4, "beam": beam,
        "read_bandwidth": n * 4 / read_s, "read_samples_s": read_samples,
        "copy_bandwidth": 2 * n * 4 / copy_s, "copy_samples_s": copy_samples,
    }
    if matmul_n:
        x = Tensor.rand(matmul_n, matmul_n, dtype=dtypes.float16).realize()
        y = Tensor.rand(matmul_n, matmul_n, dtype=dtypes.float16).realize()
        mm = TinyJit(lambda p, q: (p @ q).realize())
        with Context(BEAM=beam):
            for _ in range(3):
                mm(x, y)
        mm_s, mm_samples = _median_s(lambda: mm(x, y), reps)
        out.update(matmul_n=matmul_n, matmul_fp16_rate=2 * matmul_n ** 3 / mm_s, matmul_samples_s=mm_samples)
    return out


def target_toml(name: str, description: str, m: dict[str, Any]) -> str:
    """A target entry (TOML) from a measurement; the better of read and copy bandwidth is the one floors use."""
    from importlib.metadata import version
    today = dt.date.today().isoformat()
    src = (f"boltbeam measure-target through tinygrad {version('tinygrad')} on {m['device']}, {m['size_bytes']:,} bytes"
           + (f", BEAM={m['beam']}" if m.get("beam") else ""))
    bw = max(m["read_bandwidth"], m["copy_bandwidth"])
    lines = [f"[{name}]", f'description = "{description}"',
             f'memory_bandwidth = {{ value = {bw:.4g}, unit = "B/s", status = "measured", '
             f'source = "{src}: best of read and copy, median of {len(m["read_samples_s"])}", date = "{today}" }}',
             f'measured_bandwidth = {{ value = {bw:.4g}, unit = "B/s", status = "measured", source = "{src}", date = "{today}" }}',
             f'read_bandwidth = {{ value = {m["read_bandwidth"]:.4g}, unit = "B/s", status = "measured", source = "{src}: sum", date = "{today}" }}',
             f'copy_bandwidth = {{ value = {m["copy_bandwidth"]:.4g}, unit = "B/s", status = "measured", source = "{src}: x + 1, read + write counted", date = "{today}" }}']
    if "launch" in m:
        lc = m["launch"]
        kernels = ", ".join(str(x["kernels"]) for x in lc["samples"])
        lsrc = (f"boltbeam measure-target --launch through tinygrad {version('tinygrad')} on {lc['device']}: decodes of "
                f"{kernels} kernels a token (synthetic models of width {lc['width']}), plain token minus the device span of the "
                f"timed token beside it ({lc['samples'][0]['timing']}), {len(lc['samples'][0]['plain_wall_us'])} tokens each, "
                f"the middle half of pairs averaged, a line over the kernel counts weighted by each point's precision")
        for key, us in (("launch_sync_per_call", lc["per_call_us"]), ("launch_sync_per_kernel", lc["per_kernel_us"])):
            method = f', method = "{lc["method"]}"' if lc.get("method") else ""
            lines.append(f'{key} = {{ value = {us * 1e-6:.4g}, unit = "s", status = "measured", '
                         f'source = "{lsrc}", date = "{today}", engine = "tinygrad"{method} }}')
    if "matmul_fp16_rate" in m:
        lines.append(f'measured_matmul_fp16 = {{ value = {m["matmul_fp16_rate"]:.4g}, unit = "FLOP/s", status = "measured", '
                     f'source = "{src}: {m["matmul_n"]}^3 fp16 matmul, tinygrad default kernels (a lower bound on the chip)", date = "{today}" }}')
    return "\n".join(lines) + "\n"


def cpu_facts() -> str:
    """The CPU's facts that the search's rules read, in target TOML: its vector registers (what a kernel's
    upcast and unrolled values are held in) and its cores. A CPU has no thread groups: it declares none."""
    today, lines = dt.date.today().isoformat(), []
    machine = platform.machine().lower()
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text(errors="replace").split() if cpuinfo.is_file() else []
    registers = (32, "x86-64 with AVX-512 (avx512f in /proc/cpuinfo): 32 vector registers") if "avx512f" in flags \
        else (16, "x86-64: 16 vector registers") if machine in ("x86_64", "amd64") \
        else (32, "AArch64: 32 SIMD and floating-point registers") if machine in ("aarch64", "arm64") else None
    if registers:
        lines.append(f'registers_per_thread = {{ value = {registers[0]}, unit = "count", status = "spec", '
                     f'source = "{registers[1]}", date = "{today}" }}')
    if cores := len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count():
        lines.append(f'multiprocessors = {{ value = {cores}, unit = "count", status = "measured", '
                     f'source = "the logical CPUs this process may run on (its affinity)", date = "{today}" }}')
    return "".join(line + "\n" for line in lines)


def measure_host() -> None:
    """The machine at hand, measured and cached. Runs in a child process of its own (targets.measure_host_apart)."""
    m = measure(size_bytes=256 << 20, reps=7)
    text = target_toml(HOST, f"this machine ({platform.machine()}, {platform.processor() or 'cpu'})", m) + cpu_facts()
    _load_file(text, "the host's measurement")   # refuse a measurement no chip could give before caching it
    write_atomic(host_cache_path(), text)


if __name__ == "__main__":
    try:
        measure_host()
    except BadInput as e:
        sys.exit(f"{e}")
