"""The paper's star (3 workers + 1 server) on one switch, and a burst on it."""
import json
import time

import pytest

from testbed.bench import bursts as burstbench
from testbed.emulation import netcheck
from testbed.emulation.fabric import Fabric
from topologies import StarTopo

pytestmark = pytest.mark.emu


def test_star_routes_roles_and_loss_burst(tmp_path, emulator):
    with Fabric(StarTopo(), run_dir=str(tmp_path), bw_mbps=20, queue_pkts=50,
                monitor_s=0.5) as fab:
        assert fab.server == "srv" and fab.workers == ["w1", "w2", "w3"]
        r = netcheck.all_pairs(fab, count=2)
        assert r["pairs_ok"] == r["pairs"] == 20
        row = burstbench.measure_window(fab, "loss", {"p": 0.7}, duration_ms=300, tag="star")
        assert abs(row["measured_in_window"] - 0.7) <= 0.06, row
        assert row["measured_outside"] <= 0.005, row
        time.sleep(1.0)
    stats = [json.loads(line) for line in open(tmp_path / "raw" / "port_stats.jsonl")]
    assert stats and stats[0]["switch"] == "dtr1" and len(stats[0]["ports"]) == 5
