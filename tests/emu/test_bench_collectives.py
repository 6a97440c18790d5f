"""`dblp-testbed bench collectives --quick`: the sweep runs end to end on the veth pair, and its
numbers obey what nccl-tests' bus bandwidth promises and what each transport's algorithm moves."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.emu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
TRANSPORTS = ("dblp reliable", "dblp P=40.8%", "gloo")
#: A DBLP row's payload bytes per rank over a ring's, loss-free (headers and control on top):
#: all_reduce moves what a ring does, reduce_scatter is a whole all_reduce, all_gather an
#: all_reduce of 16-bit words in float32.
WIRE = {"all_reduce": (1.0, 1.3), "reduce_scatter": (2.0, 2.6), "all_gather": (4.0, 5.2)}


@pytest.mark.long
def test_bench_collectives_quick(tmp_path):
    out = tmp_path / "collectives.json"
    cli = os.path.join(os.path.dirname(sys.executable), "dblp-testbed")
    p = subprocess.run([cli, "bench", "collectives", "--quick", "--json-file", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=400)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["sizes"] == [256 << 10, 1 << 20] and doc["world_size"] == 2
    rows = {(r["collective"], r["transport"], r["loss"], r["size"]): r for r in doc["rows"]}
    assert set(rows) == {(c, t, x, s) for c in COLLECTIVES for t in TRANSPORTS
                         for x in (0.0, 0.1) for s in doc["sizes"]}
    for (c, t, x, s), r in rows.items():
        assert r["time_us"] is not None, r
        assert r["algbw_GBps"] == pytest.approx(s / (r["time_us"] / 1e6) / 1e9)
        # no algorithm beats the link: busbw at most its rate (a little slack for the clock)
        assert 0 < r["busbw_GBps"] <= 1.05 * doc["link_GBps"], r
        assert r["gro"] is (x == 0)
        if t != "dblp P=40.8%" or c == "all_gather":  # exact: gloo, bound 0, exact streams
            assert r["wrong"] == 0, r
        if t == "dblp reliable" and x == 0:
            lo, hi = WIRE[c]
            assert lo <= r["wire_factor"] <= hi, r
    # a 40.8 % bound under 10 % loss stops after a pass with chunks missing: zero-filled
    for c in ("all_reduce", "reduce_scatter"):
        assert all(rows[(c, "dblp P=40.8%", 0.1, s)]["wrong"] > 0 for s in doc["sizes"])
    assert "# all_reduce over gloo, loss 10 %" in p.stdout and "busbw" in p.stdout
