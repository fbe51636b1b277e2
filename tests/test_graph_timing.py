"""Device records to kernels: CUPTI's records are placed by launch facts and order, and any record
that does not fit the graph the host built is refused, never guessed past."""
import sys

import pytest

from boltbeam.errors import Refused
from boltbeam.measure.graph_timing import (GraphRecord, KernelRecord, LaunchCall, LaunchFacts, Records, Segment, alternate,
                                           launch_timed, match_records, split_by_token)

Q = LaunchFacts("r_32_32_4", (32, 1, 1), (32, 1, 1))
DOWN = LaunchFacts("r_32_48_2", (32, 1, 1), (32, 1, 1))
ADD = LaunchFacts("E_2n7", (1, 1, 1), (64, 1, 1))


def rec(facts, graph, start, dur=5):
    return KernelRecord(facts, graph, start, start + dur)


def test_records_find_their_nodes_by_facts_and_order():
    # Two graphs; in the first, two launches of Q (two layers) run in dependency order, and ADD runs
    # at the same time as the second Q: start order is not node order across different kernels.
    segments = [Segment(True, [Q, ADD, Q]), Segment(False, [DOWN]), Segment(True, [DOWN, Q])]
    records = [rec(Q, 7, 100), rec(Q, 7, 130), rec(ADD, 7, 131), rec(DOWN, 0, 200),
               rec(Q, 9, 320), rec(DOWN, 9, 300)]
    matched = match_records(segments, list(reversed(records)), "test")
    assert [[r.start_ns for r in seg] for seg in matched] == [[100, 131, 130], [200], [300, 320]]


@pytest.mark.parametrize("records, says", [
    ([rec(Q, 7, 100), rec(DOWN, 7, 110)], "holds 2 kernel(s) r_32_32_4"),          # a record of another kernel
    ([rec(Q, 7, 100)], "the device recorded 1"),                                     # one missing
    ([rec(Q, 7, 100), rec(Q, 7, 110), rec(Q, 7, 120)], "the device recorded 3"),    # one too many
    ([rec(Q, 7, 100), rec(Q, 8, 110)], "recorded 2 launches"),                      # split over two graphs
    ([rec(Q, 0, 100), rec(Q, 0, 110)], "recorded 2 launches"),                      # not in a graph at all
    ([rec(LaunchFacts("r_32_32_4", (16, 1, 1), (32, 1, 1)), 7, 100), rec(Q, 7, 110)], "grid (32, 1, 1)"),
])
def test_a_wrong_mapping_is_refused(records, says):
    with pytest.raises(Refused, match="adapter-incomplete") as e:
        match_records([Segment(True, [Q, Q])], records, "test")
    assert says in str(e.value)


def test_single_kernel_where_the_host_launched_a_graph_is_refused():
    with pytest.raises(Refused, match="is a graph on the host but not on the device"):
        match_records([Segment(True, [Q])], [rec(Q, 0, 100)], "test")


def test_records_split_by_host_marks_and_strays_refused():
    records = [rec(Q, 7, 105), rec(Q, 7, 215), rec(Q, 7, 110)]
    assert [[r.start_ns for r in t] for t in split_by_token(records, [100, 200, 300], "t")] == [[105, 110], [215]]
    with pytest.raises(Refused, match="1 record"):
        split_by_token(records + [rec(Q, 7, 300)], [100, 200, 300], "t")


def test_a_token_timed_per_launch_from_its_graph_records_and_launch_calls():
    """Marks at 1,000 and 9,000 ns; two graphs launched by calls at 3,000 and 5,000 ns run 4,000-6,000 and
    6,500-8,000: host 2 µs to the first call, 3 µs to the first graph's start, span 4 µs, 1 µs after the last."""
    graphs = [GraphRecord(11, 2, 6_500, 8_000), GraphRecord(10, 1, 4_000, 6_000)]
    calls = [LaunchCall(1, 3_000), LaunchCall(2, 5_000), LaunchCall(99, 500)]      # 99: another token's call
    t = launch_timed((1_000, 9_000), 8.0, graphs, calls, 2, "t")
    assert (t.host_us, t.lead_us, t.span_us, t.trail_us) == (2.0, 3.0, 4.0, 1.0)
    assert launch_timed((1_000, 9_000), 8.0, graphs, [], None, "t").host_us is None   # no call recorded: not guessed
    with pytest.raises(Refused, match="recorded 2 graph execution.*the host launched 3"):
        launch_timed((1_000, 9_000), 8.0, graphs, calls, 3, "t")
    with pytest.raises(Refused, match="could not time a graph"):
        launch_timed((1_000, 9_000), 8.0, [GraphRecord(10, 1, 0, 0)], calls, 1, "t")


def test_tokens_timed_per_kernel_and_per_launch_alternate():
    marks = [(100, 190), (200, 290), (300, 390), (400, 490)]     # per kernel, per launch, per kernel, per launch
    records = Records([rec(Q, 7, 110), rec(Q, 7, 310)], [GraphRecord(7, 1, 210, 280), GraphRecord(7, 2, 410, 480)],
                      [LaunchCall(1, 205), LaunchCall(2, 405)])
    kernels, graphs, calls = alternate(records, marks, "t")
    assert [[r.start_ns for r in t] for t in kernels] == [[110], [310]]
    assert [[g.correlation for g in t] for t in graphs] == [[1], [2]] and [[c.start_ns for c in t] for t in calls] == [[205], [405]]
    records.kernels.append(rec(Q, 7, 220))       # a kernel recorded while only graphs should have been
    with pytest.raises(Refused, match="did not switch"):
        alternate(records, marks, "t")


def test_a_cupti_that_does_not_load_against_the_driver_is_refused(tmp_path, monkeypatch):
    """cupti-python present but its libcupti built for another CUDA: one line, never a traceback."""
    from boltbeam.errors import BadInput
    from boltbeam.measure.graph_timing import Cupti
    pkg = tmp_path / "cupti"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cupti.py").write_text("raise OSError('libcupti.so.12: cannot open shared object file')\n")
    dist = tmp_path / "cupti_python-12.9.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cupti-python\nVersion: 12.9.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(Refused, match=r"cupti-python 12\.9\.0 does not load here \(libcupti\.so\.12.*matches the CUDA driver"):
            Cupti().start()
    finally:   # the fake package must not stay imported for the tests after this one
        for name in ("cupti", "cupti.cupti"):
            sys.modules.pop(name, None)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(BadInput, match="needs cupti-python"):
        Cupti()
