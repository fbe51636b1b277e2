"""Every place BoltBeam reaches into tinygrad is there in the pinned tinygrad; one that is gone refuses a run
in one line naming it, before anything loads."""
import pytest

from boltbeam.errors import Refused
from boltbeam.measure import seam


def test_every_patch_point_is_where_boltbeam_reaches_it():
    assert seam.missing() == []
    seam.check()


def test_a_patch_point_gone_is_named(monkeypatch):
    from tinygrad.engine import realize
    from tinygrad.llm import model
    monkeypatch.delattr(realize, "to_program")
    monkeypatch.setattr(model.Transformer, "generate", lambda self, tokens: iter(tokens))   # no _cached_tokens kept
    gone = seam.missing()
    assert any(g.startswith("tinygrad.engine.realize.to_program (") for g in gone)
    assert any("Transformer.generate setting _cached_tokens" in g for g in gone)
    with pytest.raises(Refused, match="lacks what BoltBeam reaches into.*to_program"):
        seam.check()


def test_profile_refuses_before_loading(monkeypatch, tiny_model):
    from tinygrad.engine import jit

    from boltbeam.measure.tinygrad_run import profile
    monkeypatch.delattr(jit, "run_linear")
    with pytest.raises(Refused, match="run_linear"):
        profile(tiny_model, "CPU", context=4, tokens=1)
