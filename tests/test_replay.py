"""Direct replay on CPU: the decode token's host step without re-preparing the captured JIT's inputs, copying
the token or lowering its read-back; the same greedy tokens as tinygrad's own generate on a real model."""
import gc
import json

import pytest

from boltbeam.judge.verdicts import VERDICTS
from boltbeam.route import replay
from tests.processes import profile
from tests.test_profile import refuses_routes

PROMPT = [1, 504, 3458, 282, 4102, 314, 260, 1345, 30, 12, 2000, 17, 99]   # SmolLM2's ids; any ids would do
TOKENS = 12


def _decode(model: str, direct: bool, spy: list[str]):
    """Greedy tokens from a fresh SmolLM2, with or without the family, counting the JIT's input copies. The cyclic
    collector is kept off meanwhile: run on one of tinygrad 0.13.0's CPU worker threads, it can free an earlier
    model's graph there, whose finalizer waits for that same thread's queue (the test process hung so)."""
    gc.collect()                 # earlier tests' graphs, freed here on the main thread
    gc.disable()
    try:
        return _greedy(model, direct, spy)
    finally:
        gc.enable()


def _greedy(model: str, direct: bool, spy: list[str]):
    import pathlib

    from tinygrad import Context
    from tinygrad.engine import jit
    from tinygrad.llm.model import Transformer
    net, _ = Transformer.from_gguf(pathlib.Path(model), 64)
    prepared = replay.install(net) if direct else None
    gen = net.generate(list(PROMPT))
    with Context(JIT=2):
        out = [next(gen)]
    own_copy = jit._copy_input

    def counted(u):
        spy.append("copy")
        return own_copy(u)
    jit._copy_input = counted
    try:
        out += [next(gen) for _ in range(TOKENS - 1)]
    finally:
        jit._copy_input = own_copy
    return out, prepared, net


def test_direct_replay_gives_tinygrads_tokens_without_its_per_token_copy(smollm2):
    own_copies, direct_copies = [], []
    own, _, _ = _decode(smollm2, False, own_copies)
    direct, prepared, net = _decode(smollm2, True, direct_copies)
    assert len(set(own)) > 3           # a real model's tokens vary: a stale or misplaced token would show
    assert direct == own
    # tinygrad copies the token it gets back (the JIT's own output) every captured replay; the family never does
    assert len(own_copies) >= TOKENS - 3 and direct_copies == []
    # tokens 1 and 2 capture the JIT through tinygrad's call; every later one is replayed directly
    assert prepared.applied == prepared.eligible == TOKENS - 3 == net.rollout_jit.cnt - 2
    assert prepared.summary()["direct"] == 1
    # inputs that do not check what the JIT captured: tinygrad's own call runs (and says what is wrong)
    from tinygrad import Tensor, UOp
    replayer = replay._Replayer(prepared)
    before = (prepared.applied, prepared.eligible, net.rollout_jit.cnt)
    variable = UOp.variable("start_pos", 0, net.max_context - 1)
    wide = Tensor([[5, 6]], dtype="int32").realize()      # two tokens: not the shape the decode JIT captured
    assert replayer.step(net, wide, len(PROMPT) + TOKENS, variable, Tensor(0.0).contiguous().realize()) is False
    assert (prepared.applied, prepared.eligible, net.rollout_jit.cnt) == (before[0], before[1] + 1, before[2])


def test_read_token_reads_the_buffer_or_falls_back_to_item():
    from tinygrad import Tensor
    assert replay.read_token(Tensor([[41]], dtype="int32").realize()) == 41
    assert replay.read_token(Tensor([[7, 8]], dtype="int32").realize()[:, 1:]) == 8     # a view: item() reads it


def test_profile_and_search_with_direct_replay(tiny_model, tiny_default, tmp_path):
    """search --family direct_replay judges its one setting against the default route; the setting's profile
    (`profile --direct-replay`, in a process of its own) gives tinygrad's tokens with the same kernels."""
    from boltbeam.measure import route as routes
    from boltbeam.measure import trace as tracefile
    from tests.test_search import _ok, _run, whole_search_cmd
    out = tmp_path / "search"
    base = tiny_default.path     # the default route at the search's depth, as the search would profile it
    summary = json.loads(_ok(_run([*whole_search_cmd(tiny_model, "direct_replay", tmp_path / "ledger.sqlite"),
                                   "--baseline", str(base), "--out", str(out)])).stdout)
    (only,) = summary["candidates"]
    assert only["setting"] == "direct" and only["verdict"] in VERDICTS and only["predicted_terms"] == ["host time only"]
    default, direct = tracefile.load(base), tracefile.load(only["trace"])
    fam = direct.route.settings["families"]["direct-replay"]
    assert direct.route.label == "direct-replay + tinygrad-scheduler"
    assert fam["applied"] == fam["eligible"] > 0 and fam["bytes"] == 0
    assert direct.output_tokens == default.output_tokens
    assert [k.name for k in direct.kernels_of_token(0)] == [k.name for k in default.kernels_of_token(0)]   # same kernels
    if summary["chosen"]:
        route = routes.load(str(out / "route.json"))
        assert route.families == {"direct_replay": True}
        ran = profile(tiny_model, tmp_path / "routed.json", "--context", "4", "--tokens", "2", "--route",
                      str(out / "route.json"))
        assert ran.route.label == "direct-replay + boltbeam-search"


def test_route_direct_replay_must_be_true_or_false(tiny_model, tmp_path, capsys):
    refuses_routes(tiny_model, tmp_path, capsys, {"family": "direct_replay"}, "direct_replay",
                   (("yes", "direct_replay must be true or false"), (1, "direct_replay must be true or false")))


@pytest.mark.parametrize("value", [0, 2])
def test_the_setting_takes_only_spaces_values(value):
    from boltbeam.errors import BadInput
    with pytest.raises(BadInput, match="direct must be one of 1"):
        replay.Direct(value)
