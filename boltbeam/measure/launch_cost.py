"""Launch and synchronization cost of this device through tinygrad: a measured fact for the account.

A decode token is one JIT replay: the host runs the model's decode step, launches its graphs, and
waits for the one token it reads back. The time that takes beyond the device span of the token's
kernels is launch and synchronization. It is measured here on decodes that do nothing else: small
synthetic models (the narrowest shape GGUF's k-quant blocks allow, at a few depths, with a short
context so that even tables of positions stay small) whose kernels are trivial, decoded by
`boltbeam profile` itself, so the host does what it does for any model of that many kernels and
the kernels are timed exactly as a real profile times them. Per depth: the median plain token
minus the median device span of the timed tokens; a line over the kernels per token gives the cost
of a call and of each kernel it launches. The per-kernel figure is net of what timing a kernel
costs the timed tokens, so it is negative where that costs more than a launch (tinygrad's CPU
device writes each timestamp from Python, ~10 µs a kernel): the account counts the plain token
against the timed kernels, and this is the measured figure that bridges them.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from boltbeam.errors import BadInput
from boltbeam.measure.trace import Trace, load

DEPTHS = (2, 16, 48)       # blocks of the calibration models: from a few dozen kernels a token to ~900
# Rows of 256 elements (one k-quant block), two heads of 128, a 64-position context.
SHAPE = dict(embedding=256, heads=2, kv_heads=1, head_dim=128, ffn=256, vocabulary=256, context_length=64)


@dataclass
class LaunchSample:
    blocks: int
    kernels: int               # kernels per token
    graphs: int                # graphs launched per token
    plain_wall_us: list[float]
    span_us: list[float]       # device span of each timed token

    @property
    def outside_us(self) -> float:
        return statistics.median(self.plain_wall_us) - statistics.median(self.span_us)


@dataclass
class LaunchCost:
    device: str
    timing: str
    per_call_us: float         # beyond the device span, per decode step
    per_kernel_us: float       # and per kernel it launches, net of the timing's own cost per kernel
    samples: list[LaunchSample]


def spans_us(trace: Trace) -> list[float]:
    """Each timed token's device span: its first kernel's start to the last kernel's end."""
    return [max(k.start_us + k.duration_us for k in ks) - min(k.start_us for k in ks)
            for ks in trace.by_token().values()]


def measure_launch_cost(device: str, tokens: int = 16, progress: Callable[[int], None] | None = None) -> LaunchCost:
    """Decode each calibration model in its own process (tinygrad's hook must precede its first compile)."""
    from boltbeam.synth.writer import shape_from, write
    samples, timing = [], None
    with tempfile.TemporaryDirectory(prefix="boltbeam-launch-") as tmp:
        for blocks in DEPTHS:
            model, out = Path(tmp) / f"launch-{blocks}.gguf", Path(tmp) / f"launch-{blocks}.json"
            write(model, "qwen3", shape_from(None, blocks=blocks, **SHAPE), "q4_k_m")
            cmd = [sys.executable, "-m", "boltbeam", "profile", str(model), "--device", device, "--context", "8",
                   "--tokens", str(tokens), "--no-hash", "--out", str(out), "--json"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                raise BadInput(f"launch benchmark: decoding a {blocks}-block model failed: {last}")
            trace = load(str(out))
            timing = trace.kernel_pass.timing
            samples.append(LaunchSample(blocks, len(trace.kernels_of_token(0)),
                                        round(statistics.median(trace.kernel_pass.graph_launches)),
                                        trace.token_wall_us, spans_us(trace)))
            if progress:
                progress(1)
    slope, intercept = np.polyfit([s.kernels for s in samples], [s.outside_us for s in samples], 1)
    if intercept <= 0:
        raise BadInput(f"launch benchmark: the line through {', '.join(f'{s.outside_us:.1f} µs' for s in samples)} "
                       f"(plain token minus timed span at {', '.join(str(s.kernels) for s in samples)} kernels) gives "
                       f"no positive cost per call: the device was too noisy to state one")
    return LaunchCost(device, timing, per_call_us=float(intercept), per_kernel_us=float(slope), samples=samples)
