"""The tie-out (account) and the region-by-region comparison (compare), on traces built here against
the tiny synthetic model's bound, so every expected number is known in advance."""
from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltbeam.account import account, compare
from boltbeam.account.tieout import paired_tokens
from boltbeam.bound.roofline import Bound, bound
from boltbeam.bound.targets import Fact, get_target
from boltbeam.cli import main
from boltbeam.errors import Refused
from boltbeam.files import sha256_file
from boltbeam.measure.launch_cost import BRACKETED
from boltbeam.measure.trace import Environment, Kernel, KernelPass, Provenance, RouteRecord, Trace, Workload, save
from boltbeam.read.census import take_census

H200 = get_target("h200")
PER_CALL_US, PER_KERNEL_US = 300.0, 0.5


def with_launch_facts(target, per_call_us=PER_CALL_US, per_kernel_us=PER_KERNEL_US):
    fact = lambda us: Fact(us * 1e-6, "s", "measured", "test", "2026-11-30")
    return dataclasses.replace(target, facts={**target.facts, "launch_sync_per_call": fact(per_call_us),
                                              "launch_sync_per_kernel": fact(per_kernel_us)})


H200L = with_launch_facts(H200)
H200_BARE = dataclasses.replace(H200, facts={k: f for k, f in H200.facts.items() if not k.startswith("launch_sync")})


def packaged_launch_us(kernels: int) -> float:
    """What the packaged h200 target's launch facts count for a token of this many kernels."""
    return sum((H200.fact(k) or 0.0) * 1e6 * n for k, n in (("launch_sync_per_call", 1), ("launch_sync_per_kernel", kernels)))
NEEDED_IN_FLIGHT = H200.bandwidth * H200.fact("memory_latency")   # Little's law: bandwidth x latency


@pytest.fixture(scope="module")
def model(tiny_model) -> str:   # conftest's tiny synthetic qwen3 file
    return tiny_model


@pytest.fixture(scope="module")
def tiny_bound(model) -> Bound:
    return bound(take_census(model), H200, context=0, batch=1)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def kernel(duration: float, role: str | None = None, category: str | None = None, **kw) -> Kernel:
    category = category or ("norm" if role and "norm" in role else "weights" if role else "other")
    return Kernel(token=0, index=0, name=role or category, duration_us=duration, role=role, category=category, **kw)


def token(kernels: list[Kernel], token_id: int = 0, gap_us: float = 0.0) -> list[Kernel]:
    """Place kernels one after another on the device timeline, gap_us apart."""
    placed, t = [], 0.0
    for i, k in enumerate(kernels):
        placed.append(Kernel(**{**vars(k), "token": token_id, "index": i, "start_us": t}))
        t += k.duration_us + gap_us
    return placed


def span(kernels: list[Kernel]) -> float:
    return max(k.start_us + k.duration_us for k in kernels) - min(k.start_us for k in kernels)


def make_trace(tokens: list[list[Kernel]], token_walls: list[float], pass_walls: list[float] | None,
               sha: str | None = None, context: int | None = 0, engine: str = "tinygrad") -> Trace:
    return Trace(Environment(engine=engine, model_sha256=sha), Workload(context=context, batch=1),
                 RouteRecord("test-route"), token_wall_us=token_walls, provenance=Provenance("profile"),
                 kernel_pass_wall_us=pass_walls or [], kernels=[k for ks in tokens for k in ks],
                 kernel_pass=KernelPass("cupti", [1] * len(tokens), [2] * len(tokens)) if tokens else None)


def full_token(b: Bound, token_id: int = 0, excess_us: float = 20.0, gap_us: float = 2.0) -> list[Kernel]:
    """Every weight role's kernel at its floor plus excess_us (ffn_down 100 µs above), and some kernels that
    read no weights; big launches, bytes at the floor: no cause but the gap itself."""
    big = {"global_size": [4096], "local_size": [256]}
    ks = [kernel(r.floor_us + (100.0 if r.role == "ffn_down" else excess_us), r.role, bytes=r.bytes, **big)
          for r in b.roles if r.role not in ("kv_cache", "activations")]
    kv = b.role("kv_cache").bytes
    ks += [kernel(7.0, category="attention", bytes=kv), kernel(2.0, category="attention", bytes=kv),   # float32: twice
           kernel(3.0, category="copy"), kernel(2.0, category="elementwise")]
    return token(ks, token_id, gap_us)


def line(acc, label: str):
    return next(x for x in acc.lines if x.label == label)


# --- the tie-out closes, and each line is what its rule says ---------------------------------------

def test_lines_add_up_to_the_wall(tiny_bound):
    tokens = [full_token(tiny_bound, t) for t in range(3)]
    n = len(tokens[0])
    launch = PER_CALL_US + PER_KERNEL_US * n                  # the target's fact times the token's launches
    plain = span(tokens[0]) + launch
    trace = make_trace(tokens, token_walls=[plain - 5.0, plain, plain + 5.0], pass_walls=[plain + 40.0] * 3)
    acc = account(trace, tiny_bound, H200L)
    assert acc.residual_us == pytest.approx(0.0, abs=1e-9)
    assert acc.closed and acc.refusals == []
    assert acc.wall_us == pytest.approx(plain) and acc.tokens_used == 3
    assert acc.kernel_pass_wall_us == pytest.approx(plain + 40.0) and acc.outside_span_us == pytest.approx(launch + 40.0)
    assert sum(x.us for x in acc.lines) == pytest.approx(acc.wall_us, abs=1e-9)
    assert line(acc, "floor").us == pytest.approx(tiny_bound.token_floor_us)
    down = line(acc, "ffn_down")
    assert down.kind == "role" and down.measured_us == pytest.approx(tiny_bound.role("ffn_down").floor_us + 100.0)
    assert down.us == pytest.approx(down.measured_us - tiny_bound.role("ffn_down").floor_us)
    # No measured cause; the GGML blocks its kernels decode in place are the one that names a fix.
    assert down.causes == ["unpacking"] and "draw" in down.detail and "repacked-layout" in down.detail
    attention = line(acc, "attention")
    assert attention.us == pytest.approx(9.0 - tiny_bound.role("kv_cache").floor_us)
    assert attention.moved_bytes == 2 * tiny_bound.role("kv_cache").bytes and "(2.00x the floor's)" in attention.detail
    assert line(acc, "activations").us == pytest.approx(-tiny_bound.role("activations").floor_us)
    assert line(acc, "copy").cause == "boundary" and line(acc, "attention").cause == "attention"
    assert line(acc, "gaps between kernels").us == pytest.approx(2.0 * (n - 1))
    assert line(acc, "launch and sync").us == pytest.approx(launch)
    assert f"launching {n} kernels in 2 graph(s)" in line(acc, "launch and sync").detail
    roles = [x for x in acc.lines if x.kind == "role"]
    assert roles[0].role == "ffn_down" and [x.us for x in roles] == sorted((x.us for x in roles), reverse=True)
    assert [x.kind for x in acc.lines][0] == "floor" and acc.lines[-1].kind == "launch"
    assert not any(x.kind in ("graph", "host") for x in acc.lines)      # no line is a difference of two totals


def test_waits_between_host_launches_are_a_line_of_their_own(tiny_bound):
    """Kernels that say which host launch (a graph) they ran in: the idle time where one launch ends and
    the next begins is its own line, the rest of the gaps stay gaps; the lines and the residual are the
    same as without launch numbers (a split, never a second measurement)."""
    ks = full_token(tiny_bound, gap_us=2.0)
    half = len(ks) // 2
    late = [Kernel(**{**vars(k), "start_us": k.start_us + (50.0 if i >= half else 0.0)}) for i, k in enumerate(ks)]
    numbered = [Kernel(**{**vars(k), "launch": int(i >= half)}) for i, k in enumerate(late)]
    launch = PER_CALL_US + PER_KERNEL_US * len(ks)
    plain = span(late) + launch
    plainly, split = (account(make_trace([t], [plain], [plain]), tiny_bound, H200L) for t in (late, numbered))
    assert split.closed and split.residual_us == pytest.approx(plainly.residual_us, abs=1e-9)
    wait = line(split, "waits for the next launch")
    assert wait.kind == "gap" and wait.cause == "launch boundary" and wait.us == pytest.approx(52.0)
    assert "at 1 boundary a token" in wait.detail
    assert line(split, "gaps between kernels").us == pytest.approx(2.0 * (len(ks) - 2))
    assert line(plainly, "gaps between kernels").us == pytest.approx(wait.us + line(split, "gaps between kernels").us)
    assert not any(x.label == "waits for the next launch" for x in plainly.lines)
    # One launch for every kernel: no boundary, no line.
    one = [Kernel(**{**vars(k), "launch": 0}) for k in late]
    assert not any(x.label == "waits for the next launch" for x in account(make_trace([one], [plain], [plain]),
                                                                             tiny_bound, H200L).lines)


def test_the_residual_can_come_out_wrong(tiny_bound):
    """The timed tokens' own walls never enter a line: a plain token longer than the lines is refused,
    and the refusal names the measurement that disagrees."""
    ks = full_token(tiny_bound)
    launch = PER_CALL_US + PER_KERNEL_US * len(ks)
    plain = (span(ks) + launch) * 1.03
    acc = account(make_trace([ks], [plain], [plain]), tiny_bound, H200L)
    assert acc.residual_us == pytest.approx(plain - span(ks) - launch) and not acc.closed
    assert f"launch and sync count {launch:,.2f} µs; the timed tokens spent {plain - span(ks):,.2f} µs outside" \
        in acc.refusals[0]
    slow = account(make_trace([ks], [span(ks) + launch], [(span(ks) + launch) * 1.05]), tiny_bound, H200L)
    assert slow.closed                       # the timing cost the timed tokens 5%, but the lines still meet the wall
    slower = account(make_trace([ks], [(span(ks) + launch) * 0.9], [span(ks) + launch]), tiny_bound, H200L)
    assert not slower.closed and "timing the kernels changed the token" in slower.refusals[0]


def test_pairs_of_a_machine_that_changes_speed(tiny_bound):
    """A token's time that jumps between two speeds, the timed token beside each plain one: means over the
    kept pairs add up, and a pair split by a change of speed is left out; plain tokens all longer than
    their timed ones still refuse (leaving pairs out is no plug)."""
    base = full_token(tiny_bound)
    launch = PER_CALL_US + PER_KERNEL_US * len(base)
    speeds = [1.0, 1.0, 1.4, 1.4, 1.4, 1.0, 1.0, 1.4]          # the machine's state, token by token
    tokens = [token([dataclasses.replace(k, duration_us=k.duration_us * f) for k in base], i, 2.0 * f)
              for i, f in enumerate(speeds)]
    walls = [span(ks) + launch for ks in tokens]
    split = list(walls)
    split[3] = walls[3] / 1.4 * 2.0                           # the machine slowed between this pair's two tokens
    acc = account(make_trace(tokens, split, walls), tiny_bound, H200L)
    assert acc.tokens_used == 4 and 3 not in paired_tokens(make_trace(tokens, split, walls)).groups
    assert acc.residual_us == pytest.approx(0.0, abs=1e-6) and acc.closed
    assert acc.method.startswith("mean over the middle half")
    longer = account(make_trace(tokens, [w * 1.03 for w in split], walls), tiny_bound, H200L)
    assert not longer.closed and longer.residual_us == pytest.approx(0.03 * longer.wall_us / 1.03)


def test_no_launch_fact_no_launch_line(tiny_bound):
    ks = full_token(tiny_bound)
    acc = account(make_trace([ks], [span(ks)], [span(ks)]), tiny_bound, H200_BARE)
    assert not any(x.kind == "launch" for x in acc.lines)
    assert any("measure-target --launch" in n for n in acc.notes)
    imported = dataclasses.replace(make_trace([ks], [span(ks)], [span(ks)]), kernel_pass=None)
    assert any("does not say what the host launched" in n for n in account(imported, tiny_bound, H200L).notes)


def test_launch_facts_hold_for_the_engine_they_were_measured_through(tiny_bound):
    ks = full_token(tiny_bound)
    wall = span(ks) + packaged_launch_us(len(ks))
    assert {H200.facts[k].engine for k in ("launch_sync_per_call", "launch_sync_per_kernel")} == {"tinygrad"}
    ours = account(make_trace([ks], [wall], [wall]), tiny_bound, H200)
    assert any(x.kind == "launch" for x in ours.lines) and ours.closed
    other = account(make_trace([ks], [wall], [wall], engine="llama.cpp"), tiny_bound, H200)
    assert not any(x.kind == "launch" for x in other.lines)
    assert other.residual_us == pytest.approx(packaged_launch_us(len(ks)))   # the uncounted launch is in the residual
    assert any("measured through tinygrad" in n and "llama.cpp" in n for n in other.notes)
    anyone = account(make_trace([ks], [wall], [wall], engine="llama.cpp"), tiny_bound, H200L)   # no engine named
    assert any(x.kind == "launch" for x in anyone.lines)


def test_the_timing_cost_measured_by_brackets_is_taken_out_once(tiny_bound):
    """A timed token's kernels stretched by the timing: the brackets (CUDA events, plain and timed) measure
    the stretch apart from the kernels, and the account takes it out only under launch facts measured the
    same way; under facts that are net of it already, it stays out (a note), else it would count twice."""
    tokens = [full_token(tiny_bound, t) for t in range(4)]
    n = len(tokens[0])
    stretch = [30.0, 34.0, 26.0, 30.0]                      # what the timing added, token by token
    bracketed = dataclasses.replace(H200L, facts={
        **H200L.facts, **{k: dataclasses.replace(H200L.facts[k], method=BRACKETED)
                          for k in ("launch_sync_per_call", "launch_sync_per_kernel")}})
    plain = span(tokens[0]) - 30.0 + PER_CALL_US + PER_KERNEL_US * n     # the kernels without the stretch
    trace = make_trace(tokens, token_walls=[plain] * 4, pass_walls=[plain + 30.0] * 4)
    trace.kernel_pass.plain_bracket_us = [1000.0] * 4
    trace.kernel_pass.timed_bracket_us = [1000.0 + s for s in stretch]
    assert trace.timing_cost_us() == stretch
    acc = account(trace, tiny_bound, bracketed)
    cost = line(acc, "timing's cost")
    assert cost.kind == "timing" and cost.us == pytest.approx(-30.0)   # the mean over the kept pairs (26 and 34 dropped)
    assert acc.closed and acc.residual_us == pytest.approx(0.0, abs=1e-9)
    net = account(trace, tiny_bound, H200L)
    assert not any(x.kind == "timing" for x in net.lines) and net.residual_us == pytest.approx(-30.0)
    assert any("not taken out twice" in n for n in net.notes)
    unbracketed = dataclasses.replace(trace, kernel_pass=dataclasses.replace(trace.kernel_pass, plain_bracket_us=None))
    assert any("no brackets" in n for n in account(unbracketed, tiny_bound, bracketed).notes)


def test_launch_and_sync_measured_on_the_token_where_the_timing_cost_is(tiny_bound):
    """With brackets and the host's marks, launch and sync come from the token itself: the plain tokens'
    host time before their first launch, the timed tokens' first launch to first kernel and last kernel to
    return. The launch facts then only speak in a note. The residual still comes out wrong when a part of
    the plain token is none of these (here: a plain token 90 µs slower to synchronize). Means over the kept
    pairs (the middle two of four: the outer tokens' host times would pull the mean to 425 µs)."""
    tokens = [full_token(tiny_bound, t) for t in range(4)]
    host_p, host_t, latency, trail, stretch = 400.0, 430.0, 25.0, 60.0, 40.0
    plain = host_p + latency + (span(tokens[0]) - stretch) + trail

    def with_marks(walls):
        trace = make_trace(tokens, token_walls=walls, pass_walls=[host_t + latency + span(tokens[0]) + trail] * 4)
        trace.kernel_pass = dataclasses.replace(
            trace.kernel_pass, plain_bracket_us=[5000.0] * 4, timed_bracket_us=[5000.0 + stretch] * 4,
            plain_host_us=[host_p + 50.0, host_p - 10.0, host_p + 10.0, host_p + 50.0], timed_host_us=[host_t] * 4,
            lead_us=[host_t + latency] * 4, trail_us=[trail] * 4)
        return trace
    acc = account(with_marks([plain] * 4), tiny_bound, H200L)
    launch = {x.label: x.us for x in acc.lines if x.kind == "launch"}
    assert launch == pytest.approx({"host before the first launch": host_p, "first launch to first kernel": latency,
                                    "synchronization and read-back": trail})
    assert line(acc, "timing's cost").us == pytest.approx(-stretch)
    assert acc.closed and acc.residual_us == pytest.approx(0.0, abs=1e-9)
    assert any("launch facts would have counted" in n for n in acc.notes)
    slow = account(with_marks([plain + 90.0] * 4), tiny_bound, H200L)
    assert slow.residual_us == pytest.approx(90.0) and not slow.closed
    assert slow.plain_outside_us - slow.counted_outside_us == pytest.approx(90.0)     # the check that names it
    assert "the plain tokens spent" in slow.refusals[0] and "the timed tokens' launch and sync count" in slow.refusals[0]
    assert acc.timing_cost_per_kernel_us == pytest.approx(stretch / len(tokens[0]))
    # Without brackets the timing's cost is unmeasured: the facts' line stands, as on the CPU.
    bare = with_marks([plain] * 4)
    bare.kernel_pass.plain_bracket_us = None
    assert [x.label for x in account(bare, tiny_bound, H200L).lines if x.kind == "launch"] == ["launch and sync"]


def per_launch_trace(b: Bound, per_kernel_cost: float, plain_host: float | None, launch_host: float | None,
                     plain_slower: float = 0.0) -> tuple[Trace, float]:
    """Four tokens timed per kernel, each kernel stretched by the timing, beside four timed per launch (their
    span the kernels' own): the host's work 300 µs, launch to first kernel 40 µs, synchronization 60 µs in the
    tokens timed per launch; the tokens timed per kernel slowed on the host by the timing (1,000 µs before the
    first kernel, 150 after the last), as CUPTI slows llama.cpp's. Returns the trace and the kernels' own span."""
    true = [full_token(b, t) for t in range(4)]
    stretched = [token([dataclasses.replace(k, duration_us=k.duration_us + per_kernel_cost) for k in ks], t, 2.0)
                 for t, ks in enumerate(true)]
    own = span(true[0])
    plain = 300.0 + 40.0 + own + 60.0 + plain_slower
    trace = make_trace(stretched, [plain] * 4, [1000.0 + span(stretched[0]) + 150.0] * 4, engine="llama.cpp")
    trace.kernel_pass = dataclasses.replace(
        trace.kernel_pass, graph_launches=[1] * 4, lead_us=[1000.0] * 4, trail_us=[150.0] * 4,
        plain_host_us=None if plain_host is None else [plain_host] * 4,
        launch_wall_us=[300.0 + 40.0 + own + 60.0] * 4, launch_span_us=[own] * 4,
        launch_host_us=None if launch_host is None else [launch_host] * 4, launch_lead_us=[340.0] * 4,
        launch_trail_us=[60.0] * 4)
    return trace, own


def test_the_timing_cost_and_launch_measured_against_tokens_timed_per_launch(tiny_bound):
    """CUDA: each timed token beside one timed per launch (CUPTI's graph records, no kernel recorded). The timing's
    cost is the two device spans' difference (its per-kernel figure a check); launch and sync come from the
    tokens timed per launch, not from the timed tokens whose host the timing slowed; the account closes with no
    launch fact (the packaged ones were measured through tinygrad, this is llama.cpp)."""
    trace, own = per_launch_trace(tiny_bound, 0.6, plain_host=None, launch_host=300.0)
    n = len(trace.kernels_of_token(0))
    acc = account(trace, tiny_bound, H200)
    assert acc.closed and acc.residual_us == pytest.approx(0.0, abs=1e-6)
    assert line(acc, "timing's cost").us == pytest.approx(-0.6 * n) and "timed per launch" in line(acc, "timing's cost").detail
    assert acc.timing_cost_per_kernel_us == pytest.approx(0.6) and acc.kernels_per_token == n
    assert {x.label: x.us for x in acc.lines if x.kind == "launch"} == pytest.approx(
        {"host before the first launch": 300.0, "first launch to first kernel": 40.0, "synchronization and read-back": 60.0})
    assert "graph-launch call" in line(acc, "host before the first launch").detail
    assert acc.launch_wall_us == pytest.approx(acc.wall_us) and acc.outside_span_us == pytest.approx(400.0)
    assert not any("measured through tinygrad" in note for note in acc.notes)
    # The host's time before its launch from the plain tokens where the engine shows it (tinygrad's hook)
    hooked, _ = per_launch_trace(tiny_bound, 0.6, plain_host=300.0, launch_host=300.0)
    assert "plain tokens" in line(account(hooked, tiny_bound, H200), "host before the first launch").detail
    # No launch call recorded: the host's work and the launch as one line
    bare, _ = per_launch_trace(tiny_bound, 0.6, plain_host=None, launch_host=None)
    assert [(x.label, x.us) for x in account(bare, tiny_bound, H200).lines if x.kind == "launch"] == [
        ("before the first kernel", pytest.approx(340.0)), ("synchronization and read-back", pytest.approx(60.0))]
    # Plain tokens 2% slower than those timed per launch: refused, naming them
    slow, _ = per_launch_trace(tiny_bound, 0.6, plain_host=None, launch_host=300.0, plain_slower=0.02 * (400.0 + own) / 0.98)
    refused = account(slow, tiny_bound, H200)
    assert not refused.closed and "the tokens timed per launch took" in refused.refusals[0]


def test_pairs_are_judged_by_the_timed_token_less_its_timing_cost(tiny_bound):
    """With brackets, a timed token slower by what its timing added (measured: the brackets) is no change of the
    machine's speed: the pairs left out are those where the plain token and the timed one less its cost differ
    most, here the pair whose plain token waited 400 µs longer and the one that waited 300 µs less."""
    tokens = [full_token(tiny_bound, t) for t in range(8)]
    costs = [10.0, 200.0, 30.0, 400.0, 20.0, 50.0, 300.0, 40.0]
    waits = [0.0, 0.0, 400.0, 0.0, 0.0, -300.0, 0.0, 0.0]
    plain = [1000.0 + w for w in waits]
    trace = make_trace(tokens, plain, [1000.0 + c for c in costs])
    trace.kernel_pass.plain_bracket_us = [5000.0] * 8
    trace.kernel_pass.timed_bracket_us = [5000.0 + c for c in costs]
    kept = trace.kept_pairs()
    assert 2 not in kept and 5 not in kept and {1, 3, 6} <= set(kept)


def test_account_cli_json_contract(capsys, tmp_path, model, tiny_bound):
    ks = full_token(tiny_bound)
    path = tmp_path / "t.json"
    wall = span(ks) + packaged_launch_us(len(ks))
    save(make_trace([ks], [wall - 1.0], [wall], sha=sha256_file(model)), path)
    code, out, _ = run(capsys, "account", path, "--model", model, "--target", "h200", "--json")
    assert code == 0
    d = json.loads(out)
    assert {"wall_us", "floor_us", "lines", "residual_us", "closed", "tokens_used", "method", "timing"} <= d.keys()
    assert d["closed"] is True and d["method"].startswith("mean over") and d["timing"] == "cupti"
    assert {"label", "us", "cause", "detail", "kind"} <= d["lines"][0].keys()
    down = next(x for x in d["lines"] if x["role"] == "ffn_down")
    assert down["us"] == pytest.approx(down["measured_us"] - down["floor_us"])
    assert {x["kind"] for x in d["lines"]} == {"floor", "role", "boundary", "gap", "overlap"} | (
        {"launch"} if H200.fact("launch_sync_per_call") else set())
    code, out, _ = run(capsys, "account", path, "--model", model, "--target", "h200")
    assert code == 0 and "residual" in out and "closed" in out


# --- refusals ---------------------------------------------------------------------------------------

def test_account_that_does_not_close_is_refused_after_printing(capsys, tmp_path, model, tiny_bound):
    ks = full_token(tiny_bound)
    # The plain token is 5% longer than the lines can reach.
    launch = packaged_launch_us(len(ks))
    wall = (span(ks) + launch) / 0.95
    path = tmp_path / "t.json"
    save(make_trace([ks], [wall], None), path)
    acc = account(make_trace([ks], [wall], None), tiny_bound, H200)
    assert not acc.closed and acc.residual_us == pytest.approx(0.05 * wall)
    code, out, err = run(capsys, "account", path, "--model", model, "--target", "h200")
    assert code == 3
    assert "ffn_down" in out                                  # the account is printed first
    assert f"residual {acc.residual_us:+,.2f} µs is 5.0%" in err
    assert len(err.strip().splitlines()) == 1


def test_inflated_kernels_are_refused(capsys, tmp_path, model, tiny_bound):
    ks = full_token(tiny_bound, gap_us=0.0)
    kernel_sum = sum(k.duration_us for k in ks)
    wall = kernel_sum / 1.03                                  # the graph token is shorter than its kernels
    trace = make_trace([ks], [wall], [kernel_sum])
    acc = account(trace, tiny_bound, H200)
    assert acc.inflation_us == pytest.approx(kernel_sum - wall)
    assert any("inflated the kernels" in r for r in acc.refusals)
    path = tmp_path / "t.json"
    save(trace, path)
    code, _, err = run(capsys, "account", path, "--model", model, "--target", "h200")
    assert code == 3 and "inflated the kernels" in err
    assert f"{kernel_sum - wall:,.2f} µs (3.0%)" in err


def test_kernels_slower_by_their_measured_timing_cost_are_not_inflated(tiny_bound):
    """The timed tokens' kernels 3% longer than the plain token (a loaded machine, or the timing itself), the
    difference measured by the brackets: the timing's cost line takes it out, and the kernels are not called
    inflated; 3% more than that is."""
    ks = full_token(tiny_bound, gap_us=0.0)
    busy = sum(k.duration_us for k in ks)
    for extra, refused in ((0.0, False), (0.03 * busy, True)):
        trace = make_trace([ks], [busy / 1.03], [busy])
        trace.kernel_pass.plain_bracket_us, trace.kernel_pass.timed_bracket_us = [busy / 1.03 + extra], [busy]
        acc = account(trace, tiny_bound, H200)
        assert acc.timing_cost_us == pytest.approx(busy - busy / 1.03 - extra)
        assert any("inflated the kernels" in r for r in acc.refusals) == refused, acc.refusals


def test_whole_token_trace_is_refused(capsys, tmp_path, model):
    path = tmp_path / "t.json"
    save(make_trace([], [1000.0, 1001.0], None), path)
    code, _, err = run(capsys, "account", path, "--model", model, "--target", "h200")
    assert code == 3 and "whole-token figures only: no kernels to account" in err


def test_trace_of_another_model_is_refused(capsys, tmp_path, model, tiny_bound):
    ks = full_token(tiny_bound)
    path = tmp_path / "t.json"
    wall = span(ks) + packaged_launch_us(len(ks))
    save(make_trace([ks], [wall], [wall], sha="0" * 64), path)
    code, _, err = run(capsys, "account", path, "--model", model, "--target", "h200")
    assert code == 3 and "different model" in err
    assert run(capsys, "account", path, "--model", model, "--target", "h200", "--no-hash-check")[0] == 0


# --- causes ----------------------------------------------------------------------------------------

def one_role_account(b: Bound, role: str, **geometry) -> object:
    ks = token([kernel(50.0, role, bytes=b.role(role).bytes, **geometry)])
    return line(account(make_trace([ks], [50.0], [50.0]), b, H200), role)


def test_tiny_launch_is_starving_by_littles_law(tiny_bound):
    down = one_role_account(tiny_bound, "ffn_down", global_size=[32], local_size=[32])
    assert down.cause == "starving"
    assert "32 groups of 32 threads = 1,024 threads" in down.detail
    assert "16.38 KB in flight" in down.detail                 # 1,024 threads x 16 B
    assert (f"{NEEDED_IN_FLIGHT / 1e6:.2f} MB in flight ({H200.bandwidth / 1e12:.2f} TB/s x "
            f"{H200.fact('memory_latency') * 1e9:.0f} ns)") in down.detail
    assert f"{16384 / NEEDED_IN_FLIGHT:.1%} of it" in down.detail


def test_global_size_counts_threads_without_a_local_size(tiny_bound):
    down = one_role_account(tiny_bound, "ffn_down", global_size=[1024], local_size=None)
    assert down.cause == "starving" and "1,024 threads (no local size)" in down.detail


def test_huge_launch_is_not_starving(tiny_bound):
    down = one_role_account(tiny_bound, "ffn_down", global_size=[4096], local_size=[256])
    assert "starving" not in down.causes and down.cause == "unpacking"


def test_unpacking_names_the_layout_only_where_blocks_are_decoded_in_place(tiny_bound):
    ks = token([kernel(tiny_bound.role(r).floor_us * 9, r, bytes=tiny_bound.role(r).bytes, global_size=[4096],
                       local_size=[256]) for r in ("ffn_down", "ffn_up")])
    wall = [span(ks)]
    blocks = account(make_trace([ks], wall, wall), tiny_bound, H200)
    formats_of = lambda role: {t.format for t in tiny_bound.tensors if t.role == role}
    assert formats_of("ffn_down") == {"Q4_K", "Q6_K"} and formats_of("ffn_up") == {"Q4_K"}   # the Q4_K_M mix
    down, up = line(blocks, "ffn_down"), line(blocks, "ffn_up")
    assert down.cause == up.cause == "unpacking"
    assert "Q6_K in 210-byte records of 256 values" in down.detail and "not a whole number of 16-byte loads" in down.detail
    assert "Q4_K in 144-byte records" in up.detail and "16-byte loads" not in up.detail    # 144 = 9 x 16
    drawn = tiny_bound.role("ffn_up").bytes / line(blocks, "ffn_up").measured_us * 1e6
    assert f"{drawn / H200.bandwidth:.1%} of" in up.detail
    planes = make_trace([ks], wall, wall)
    planes.route = RouteRecord("generated-layout + tinygrad-scheduler")
    assert line(account(planes, tiny_bound, H200), "ffn_down").cause == "unexplained"


def test_roles_a_stacked_product_reads_together_share_one_line(tiny_bound):
    """One kernel reads gate and up (a stacked product): one line holds both roles' time against both
    floors, with no "no kernel" line for the one it did not take its role from."""
    names = lambda role: sorted(t.name for t in tiny_bound.tensors if t.role == role)
    both = tiny_bound.role("ffn_gate").bytes + tiny_bound.role("ffn_up").bytes
    floor = tiny_bound.role("ffn_gate").floor_us + tiny_bound.role("ffn_up").floor_us
    ks = token([kernel(floor + 30.0, "ffn_gate", bytes=both, tensors=names("ffn_gate") + names("ffn_up") + names("ffn_norm"),
                       global_size=[4096], local_size=[256]), kernel(floor, "ffn_down", bytes=10)])
    acc = account(make_trace([ks], [span(ks)], [span(ks)]), tiny_bound, H200)
    stacked = line(acc, "ffn_gate+ffn_up")
    assert stacked.floor_us == pytest.approx(floor) and stacked.us == pytest.approx(30.0) and stacked.kernels == 1
    assert stacked.stacked == ("ffn_gate", "ffn_up") and line(acc, "ffn_down").stacked == ()
    assert "bytes" not in stacked.causes        # it moved exactly the two floors' bytes
    assert not any(x.label in ("ffn_gate", "ffn_up") for x in acc.lines)
    assert line(acc, "ffn_norm").cause == "no kernel"     # a norm a product reads stays a line of its own
    # Read apart, each role keeps its own line.
    apart = token([kernel(10.0, "ffn_gate", tensors=names("ffn_gate")), kernel(10.0, "ffn_up", tensors=names("ffn_up"))])
    acc = account(make_trace([apart], [span(apart)], [span(apart)]), tiny_bound, H200)
    assert line(acc, "ffn_gate").measured_us == line(acc, "ffn_up").measured_us == pytest.approx(10.0)


def test_extra_bytes_are_a_cause(tiny_bound):
    floor_bytes = tiny_bound.role("ffn_down").bytes
    ks = token([kernel(50.0, "ffn_down", bytes=2 * floor_bytes, global_size=[4096], local_size=[256])])
    down = line(account(make_trace([ks], [50.0], [50.0]), tiny_bound, H200), "ffn_down")
    assert down.cause == "bytes" and f"{floor_bytes:,} B (2.00x) more" in down.detail


def test_compute_floor_is_the_primary_cause(model):
    slow = "peak_fp32"   # so slow a unit that the arithmetic, not the bytes, sets every floor
    target = dataclasses.replace(H200, facts={**H200.facts, slow: dataclasses.replace(H200.facts[slow], value=1e9)})
    b = bound(take_census(model), target, context=0, batch=1)
    assert b.role("ffn_down").limit == "compute"
    ks = token([kernel(b.role("ffn_down").floor_us + 50.0, "ffn_down", bytes=b.role("ffn_down").bytes,
                       global_size=[32], local_size=[32])])
    down = line(account(make_trace([ks], [ks[0].duration_us], [ks[0].duration_us]), b, target), "ffn_down")
    assert down.causes == ["compute", "starving", "unpacking"] and "floor binds on peak_fp32" in down.detail


# --- the timeline ----------------------------------------------------------------------------------

@pytest.mark.parametrize("second_start, gaps, overlap", [(15.0, 5.0, 0.0), (7.0, 0.0, 3.0)])
def test_gaps_and_overlap_from_timestamps(tiny_bound, second_start, gaps, overlap):
    ks = [Kernel(0, 0, "a", 10.0, start_us=0.0, category="copy"),
          Kernel(0, 1, "b", 10.0, start_us=second_start, category="elementwise")]
    acc = account(make_trace([ks], [30.0], [30.0]), tiny_bound, H200)
    assert line(acc, "gaps between kernels").us == pytest.approx(gaps)
    assert line(acc, "overlap").us == pytest.approx(-overlap)
    assert acc.outside_span_us == pytest.approx(30.0 - (second_start + 10.0))
    launch = sum(x.us for x in acc.lines if x.kind == "launch")
    assert acc.residual_us == pytest.approx(30.0 - 20.0 - gaps + overlap - launch, abs=1e-9)


# --- compare -----------------------------------------------------------------------------------------

def test_compare_regions_and_winners(capsys, tmp_path, model, tiny_bound):
    a = token([kernel(30.0, "ffn_down"), kernel(10.0, "attn_q"), kernel(5.0, category="attention")])
    b = token([kernel(20.0, "ffn_down"), kernel(15.0, "attn_q"), kernel(5.0, category="attention"),
               kernel(2.0, category="copy")])
    ta, tb = make_trace([a], [50.0], [50.0]), make_trace([b], [46.0], [46.0])
    regions = {r.region: r for r in compare(ta, tb).regions}
    assert (regions["down"].diff_us, regions["down"].winner) == (-10.0, "B")
    assert (regions["qkv"].diff_us, regions["qkv"].winner) == (5.0, "A")
    assert regions["attention"].winner == "tie"
    assert (regions["other"].a_us, regions["other"].b_us, regions["other"].winner) == (0.0, 2.0, "A")
    assert regions["down"].floor_us is None

    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    save(ta, pa)
    save(tb, pb)
    code, out, _ = run(capsys, "compare", pa, pb, "--model", model, "--target", "h200", "--json")
    d = json.loads(out)
    assert code == 0 and d["net_us"] == -4.0 and d["region_net_us"] == pytest.approx(-3.0)
    assert d["a_wall_us"] == 50.0 and d["b_wall_us"] == 46.0 and d["incomparable"] == []
    down = next(r for r in d["regions"] if r["region"] == "down")
    assert down["floor_us"] == pytest.approx(tiny_bound.role("ffn_down").floor_us)
    code, out, _ = run(capsys, "compare", pa, pb)
    assert code == 0 and "floors are not shown" in out


def test_compare_shows_gaps_and_overlap_as_rows():
    a = token([kernel(30.0, "ffn_down"), kernel(10.0, "attn_q")], gap_us=2.0)
    b = token([kernel(30.0, "ffn_down"), kernel(10.0, "attn_q")])
    b[1] = dataclasses.replace(b[1], start_us=25.0)          # starts 5 µs before the first one ends
    cmp = compare(make_trace([a], [42.0], [42.0]), make_trace([b], [35.0], [35.0], engine="llama.cpp"))
    rows = {r.region: r for r in cmp.regions}
    assert (rows["gaps"].a_us, rows["gaps"].b_us) == (2.0, 0.0)
    assert (rows["overlap"].a_us, rows["overlap"].b_us, rows["overlap"].winner) == (0.0, -5.0, "B")
    assert cmp.region_net_us == pytest.approx(cmp.net_us)    # the rows now hold every µs of both tokens
    unplaced = make_trace([[dataclasses.replace(k, start_us=None) for k in b]], [36.0], [36.0])
    why = {x["region"]: x["reason"] for x in compare(make_trace([a], [44.0], [44.0]), unplaced).incomparable}
    assert set(why) == {"gaps", "overlap"} and "no start times" in why["gaps"]


def test_compare_exclusive_counts_each_microsecond_once(capsys, tmp_path):
    """With --exclusive, time two kernels share goes to the one that started first: a kernel that starts
    5 µs before its predecessor ends (as under programmatic dependent launch, waiting) loses those 5 µs from
    its region, a kernel wholly inside another counts nothing, and no overlap row is left; the rows still
    hold every µs of both tokens."""
    a = token([kernel(30.0, "ffn_down"), kernel(10.0, "attn_q")])
    b = token([kernel(30.0, "ffn_down"), kernel(10.0, "attn_q"), kernel(4.0, "attn_output")])
    b[1] = dataclasses.replace(b[1], start_us=25.0)           # 5 µs inside ffn_down
    b[2] = dataclasses.replace(b[2], start_us=26.0)           # wholly inside attn_q (26-30 of 25-35)
    ta, tb = make_trace([a], [40.0], [40.0]), make_trace([b], [35.0], [35.0], engine="llama.cpp")
    summed = {r.region: r for r in compare(ta, tb).regions}
    assert (summed["qkv"].b_us, summed["attn_output"].b_us, summed["overlap"].b_us) == (10.0, 4.0, -9.0)
    cmp = compare(ta, tb, exclusive=True)
    rows = {r.region: r for r in cmp.regions}
    assert "overlap" not in rows and rows["gaps"].b_us == 0.0
    assert (rows["down"].b_us, rows["qkv"].b_us, rows["attn_output"].b_us) == (30.0, 5.0, 0.0)
    assert (rows["down"].a_us, rows["qkv"].a_us) == (30.0, 10.0)      # no overlap: the same as summed
    assert cmp.region_net_us == pytest.approx(cmp.net_us) and cmp.to_dict()["method"].endswith("exclusive device time")
    unplaced = make_trace([[dataclasses.replace(k, start_us=None) for k in b]], [36.0], [36.0])
    with pytest.raises(Refused, match="start time"):
        compare(ta, unplaced, exclusive=True)
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    save(ta, pa), save(tb, pb)
    code, out, _ = run(capsys, "compare", str(pa), str(pb), "--exclusive")
    assert code == 0 and "each µs of device time once" in out and "overlap" not in out


def test_a_kernel_inside_another_overlaps_by_its_length_and_leaves_no_gap():
    from boltbeam.measure.trace import timeline
    ks = token([kernel(30.0, "ffn_down"), kernel(4.0, "attn_q"), kernel(10.0, "attn_output")])
    ks[1] = dataclasses.replace(ks[1], start_us=10.0)        # wholly inside the first (0-30)
    ks[2] = dataclasses.replace(ks[2], start_us=32.0)        # 2 µs after the first ends, not 18 after the second
    t = timeline(ks)
    assert (t.gaps_us, t.overlap_us, t.span_us) == (2.0, 4.0, 42.0)


@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 20), st.integers(0, 2)), min_size=1, max_size=12))
@settings(max_examples=300, derandomize=True, deadline=None, database=None)
def test_a_timeline_holds_every_kernel_once(placed):
    """Any placement: the span is the kernels' sum plus the gaps less the overlap, the gaps split into those
    at launch boundaries and those within a launch, and --exclusive parts sum to the span less the gaps."""
    from boltbeam.account.compare import exclusive_times
    from boltbeam.measure.trace import timeline
    ks = [dataclasses.replace(kernel(d, "ffn_up"), start_us=s, index=i, launch=n) for i, (s, d, n) in enumerate(placed)]
    t = timeline(ks)
    total = sum(k.duration_us for k in ks)
    assert t.span_us == pytest.approx(total + t.gaps_us - t.overlap_us, abs=1e-9)
    assert t.between_launches_us + t.within_launches_us == pytest.approx(t.gaps_us, abs=1e-9)
    assert t.gaps_us >= 0 and 0 <= t.overlap_us <= total + 1e-9
    assert sum(us for _, us in exclusive_times(ks)) == pytest.approx(t.span_us - t.gaps_us, abs=1e-9)


def test_compare_against_whole_token_figures(capsys, tmp_path):
    a = token([kernel(30.0, "ffn_down"), kernel(5.0, category="attention")])
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    save(make_trace([a], [40.0], [40.0]), pa)
    save(make_trace([], [25.0, 26.0, 27.0], None), pb)        # llama-bench: whole tokens only
    code, out, _ = run(capsys, "compare", pa, pb, "--json")
    d = json.loads(out)
    assert code == 0 and d["net_us"] == -14.0
    assert [x["region"] for x in d["incomparable"]] == [r["region"] for r in d["regions"]]
    assert all("B has whole-token figures only" in x["reason"] for x in d["incomparable"])
    assert all(r["diff_us"] is None and r["winner"] is None for r in d["regions"])
    code, out, _ = run(capsys, "compare", pa, pb)
    every_region = ", ".join(r["region"] for r in d["regions"])
    assert code == 0 and f"cannot compare {every_region}: B has whole-token figures only" in out


# --- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [None, "not json {", json.dumps({"format": "something-else", "version": 1})])
def test_malformed_trace_is_one_line_exit_2(capsys, tmp_path, model, content):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    for argv in (["account", path, "--model", model, "--target", "h200"], ["compare", path, path]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unknown_target_is_exit_2(capsys, tmp_path, model, tiny_bound):
    ks = full_token(tiny_bound)
    path = tmp_path / "t.json"
    save(make_trace([ks], [span(ks)], [span(ks)]), path)
    code, _, err = run(capsys, "account", path, "--model", model, "--target", "no-such-gpu")
    assert code == 2 and "unknown target 'no-such-gpu'" in err
    assert run(capsys, "compare", path, path, "--model", model)[0] == 2      # floors need both flags


def test_overlapping_kernels_are_not_inflation(tiny_bound):
    """Kernels that run at the same time may sum past the wall; only their busy time must fit it."""
    a = kernel(60.0, "ffn_gate", start_us=0.0)
    b = kernel(60.0, "ffn_up", start_us=10.0)   # overlaps a by 50 µs: busy 70 µs
    acc = account(make_trace([[a, b]], [70.0], [70.0]), tiny_bound, H200)
    assert acc.kernel_sum_us == pytest.approx(120.0) and acc.overlap_us == pytest.approx(50.0)
    assert acc.busy_us == pytest.approx(70.0) and acc.inflation_us == 0
    assert not any("inflated" in r for r in acc.refusals)


def test_compare_refuses_a_token_faster_than_physics(capsys, tmp_path, model, tiny_bound):
    fast = tiny_bound.token_floor_us * 0.5
    a = token([kernel(fast, "ffn_down")])
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    save(make_trace([a], [fast], [fast]), pa)
    save(make_trace([a], [2 * tiny_bound.token_floor_us], None), pb)
    code, out, err = run(capsys, "compare", pa, pb, "--model", model, "--target", "h200")
    assert code == 3 and out == "" and "measurement error: A's fastest token" in err and err.count("\n") == 1
    assert run(capsys, "compare", pa, pb)[0] == 0          # without floors there is nothing to check it against


def test_a_launch_faster_than_its_assumed_loads_allow_is_not_called_starving(tiny_bound):
    """Little's law at one 16-byte load a thread caps 32 x 32 threads far below the memory; a role measured
    faster than that cap keeps more loads in flight than assumed: the account says so instead of starving."""
    b = tiny_bound.role("ffn_down")
    reach = 32 * 32 * 16 / H200.fact("memory_latency")
    least_us = b.bytes / reach * 1e6
    fast = least_us / 2
    assert fast > b.floor_us
    ks = token([kernel(fast, "ffn_down", bytes=b.bytes, global_size=[32], local_size=[32])])
    down = line(account(make_trace([ks], [span(ks)], [span(ks)]), tiny_bound, H200), "ffn_down")
    assert "starving" not in down.causes
    assert "Little's law not judged" in down.detail and "more than one load in flight each" in down.detail
    slow = token([kernel(least_us * 2, "ffn_down", bytes=b.bytes, global_size=[32], local_size=[32])])
    assert line(account(make_trace([slow], [span(slow)], [span(slow)]), tiny_bound, H200), "ffn_down").cause == "starving"
