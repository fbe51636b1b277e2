"""Direct replay: a decode token's host step as the captured graphs need it, and no more.

Once tinygrad's decode JIT has captured, each token still pays, on the host and before anything runs
on the device, for what a first call needs: `Transformer.__call__` builds a lazy `contiguous()` of the
last token, the JIT prepares its inputs again (graph rewrites over each input's UOp, the variables
unbound, the inputs' shapes checked), and because the token it is given is the buffer the JIT itself
writes, it copies that buffer into a new one through a freshly lowered one-copy program. On the
8B-shaped model on the H200 that host work was 500-930 µs a token before the first kernel, the largest
line of the account after the weights. Then `item()` lowers a cast-and-copy of the output to read
four bytes.

This family drives the same captured program (`CapturedJit.linear`, its kernels and graphs unchanged)
through tinygrad's own `run_linear`, with the inputs prepared once, by tinygrad's `_prepare_jit_inputs`,
and checked against what the JIT captured (their names, shapes, dtypes and devices); each later token
binds only the position. The token goes back in as the JIT's own output buffer, uncopied: the one kernel
that reads it (the embedding's gather) runs before the one that writes it (the sampler), which depends
on it through every layer, so it always reads the last token. The token is read from that buffer.
The prefill, the warm-up tokens that capture the JIT and any token whose inputs do not check run
through tinygrad's own call. A model with recurrent blocks (their own reset and chunking) keeps
tinygrad's `generate` whole.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import ClassVar

from boltbeam.measure.prepared import Prepared
from boltbeam.route.family import Family, Replaces, Switch, switch
from boltbeam.foresight.future import Foreseen

LABEL = "direct-replay"          # what it adds to a trace's route label
SPACE = "direct_replay"          # its one knob: data/spaces.toml


@dataclass(frozen=True)
class Direct(Switch):
    """The family's setting, as the search judges it (profile --direct-replay; the route's direct_replay)."""
    SPACE: ClassVar[str] = SPACE
    direct: int = 1


class _Replayer:
    """The captured decode JIT's inputs, prepared and checked once for each (JIT, input token) pair."""
    def __init__(self, prepared: Prepared):
        self.prepared = prepared
        self.inputs: dict[tuple[int, int], tuple] = {}   # (id(captured), id(token)) -> (captured, token, input UOps or None)

    def step(self, net, token, start_pos: int, variable, temperature) -> bool:
        """Replay the decode JIT once with `token` at `start_pos` (the JIT's variable `variable`); False where
        tinygrad's own call must run (not captured yet, or inputs that do not check)."""
        from tinygrad.engine import jit
        tj = net.rollout_jit
        captured = tj.captured
        if captured is None or tj.cnt < 2:
            return False
        self.prepared.eligible += 1
        key = (id(captured), id(token))
        if key not in self.inputs:
            uops, _, names, info = jit._prepare_jit_inputs((token, variable.bind(start_pos), temperature), {})
            fits = names == captured.expected_names and info == captured.expected_input_info
            self.inputs[key] = (captured, token, tuple(uops) if fits else None)   # holding both keeps the ids theirs
        uops = self.inputs[key][2]
        if uops is None:
            return False
        jit.run_linear(captured.linear, {variable.expr: start_pos}, input_uops=uops, jit=True)   # (looked up now: a recorder may wrap it)
        tj.cnt += 1
        self.prepared.applied += 1
        return True


def read_token(out) -> int:
    """The sampled token, read from its buffer where the output is one (else through `item()`)."""
    from tinygrad.uop.ops import Ops
    base = out.uop.base
    if base.op is Ops.BUFFER and base.is_realized and base.buffer.size == 1 == out.numel():
        buf = base.buffer
        return int(buf.as_memoryview().cast(buf.dtype.fmt)[0])
    return int(out.item())


def generate(net, replayer: _Replayer, tokens: list[int], chunk_size: int = 32, temperature: float = 0.0):
    """tinygrad.llm's `Transformer.generate` (0.13.0), its decode steps replayed directly. Like it, it starts after
    the prefix of `tokens` the cache already holds (no state to reset: models with recurrent blocks keep its own)."""
    from tinygrad import Tensor, UOp
    v_start_pos = UOp.variable("start_pos", 0, net.max_context - 1)
    v_toks = UOp.variable("toks", 1, chunk_size)
    temp = Tensor(temperature).contiguous()
    t = Tensor(tokens + [0] * (net.max_context - len(tokens)), dtype="int32").reshape(1, net.max_context)
    start_pos, out, prompt_len = net.get_start_pos(tokens), None, len(tokens)
    while len(tokens) < net.max_context:
        if out is not None and start_pos >= prompt_len and \
                replayer.step(net, out, start_pos, v_start_pos, temp):
            out = net.rollout_jit.captured.ret
            start_pos += 1
        else:
            sp, nt = v_start_pos.bind(start_pos), v_toks.bind(min(chunk_size, len(tokens) - start_pos))
            out = net(t[:, sp:sp + nt] if start_pos < prompt_len or out is None else out, sp, temp).realize()
            start_pos += nt.val
            if start_pos < len(tokens):      # chunked prefill: the prompt's next chunk
                continue
        tokens.append(read_token(out))
        net._cached_tokens = tokens[:-1]
        yield tokens[-1]


def install(net, census=None, model_path: str | None = None, setting: Direct | None = None) -> Prepared:
    """Give the loaded model a `generate` whose decode steps replay the captured JIT directly. `applied` counts
    the tokens replayed so, `eligible` those decoded on a captured JIT (all of them, where every input checked)."""
    t0 = time.perf_counter()
    prepared = Prepared(LABEL, asdict(setting or Direct()))
    if getattr(net, "has_recurrent_block", False):
        prepared.notes.append(f"{LABEL}: the model has recurrent blocks; tinygrad's own generate runs")
        return prepared
    replayer = _Replayer(prepared)

    def direct_generate(tokens: list[int], chunk_size: int = 32, temperature: float = 0.0):
        return generate(net, replayer, tokens, chunk_size, temperature)
    net.generate = direct_generate
    prepared.seconds = time.perf_counter() - t0
    return prepared


def foresee(census, direct: Direct, context: int, target, cal, on=None) -> Foreseen:
    """The host's step before the first kernel, shortened: the device moves the same bytes in the same kernels."""
    return Foreseen(0, 0, 0.0, ("host time only",))


FAMILY = Family(SPACE, LABEL, "direct_replay", install=install, read=switch(Direct),
                of_values=lambda values: Direct(**values), foresee=foresee, replaces=Replaces(host=True),
                help="replay the captured decode graphs directly: each token's inputs prepared once, the token fed "
                     "back uncopied and read from its buffer, where tinygrad prepares, copies and lowers again every "
                     "token (also on when the route says so)")
