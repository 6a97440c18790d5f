"""DBLP rounds through a real 20 Mbit/s HTB + drop-tail bottleneck, before and after an 80 % burst.

Workers in one namespace, the server in the other, both directions shaped like
a fabric link and paced like the runner paces (server 0.95 x rate, each worker
its fair share). The burst drops 80 % of what the server receives for one round
(its downlink). Before the fix, control datagrams outnumbered data ever after
and overflowed the server's queue (thousands of drops of pull data).
"""
import json
import os
import subprocess
import sys

import pytest

from dblp.testing import collect_agents
from testbed.emulation.netns import NetnsPair

pytestmark = pytest.mark.emu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RATE = 20e6
N, ROUNDS, BURST, NUMEL = 3, 10, 3, 38_282  # 107 chunks per stream (the digits CNN)

JOB = r"""
import json, sys, threading
import dblp
from dblp.testing import gradients
a = json.loads(sys.argv[1])
N, R = a["n"], a["rounds"]
grads = gradients(N, R, a["numel"], seed=4)
if a["role"] == "server":
    srv = dblp.ParameterServer("0.0.0.0", a["port"], N, "static", p=0.008, round_timeout=30,
                               session_id=a["session"], rate_bps=0.95 * a["rate"])
    rows, before = [], {}
    def start(r):
        srv.engine.fault_rx_drop = 0.8 if r == a["burst"] else 0.0
        before.update(srv.engine.datagrams)
    def end(r, st):
        rows.append({k: v - before[k] for k, v in srv.engine.datagrams.items()})
    srv.serve(R, on_round_start=start, on_round_end=end)
    srv.close()
    print(json.dumps(rows))
    sys.exit(0)
out = {}
def work(rank):
    with dblp.TransportGroup(rank, N, a["master"], a["port"], policy="static", p=0.008,
                             session_id=a["session"], round_timeout=30,
                             rate_bps=0.95 * a["rate"] / N) as g:
        res = []
        for r in range(R):
            d0 = dict(g.engine.datagrams)
            st = g.allreduce_(grads[rank][r].copy())
            res.append({"latency_s": st.latency_s, "passes_push": st.passes_push,
                        **{k: v - d0[k] for k, v in g.engine.datagrams.items()}})
        out[rank] = res
ts = [threading.Thread(target=work, args=(r,)) for r in range(N)]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps(out))
"""


def _spawn(pair, side, args):
    return subprocess.Popen(["ip", "netns", "exec", pair.ns[side], sys.executable, "-c", JOB,
                             json.dumps(args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)


def _qdisc_drops(pair, side) -> int:
    out = pair.exec(side, "tc", "-s", "qdisc", "show", "dev", pair.dev[side]).stdout
    return sum(int(tok.split()[0].rstrip(",")) for tok in out.split("dropped")[1:])


def test_control_budget_and_no_queue_overflow_after_a_burst():
    with NetnsPair(rate_bps=RATE, queue_packets=64) as pair:
        base = {"n": N, "rounds": ROUNDS, "numel": NUMEL, "port": 47650, "session": 4242,
                "burst": BURST, "rate": RATE, "master": pair.ip[1]}
        procs = [_spawn(pair, 1, dict(base, role="server")),
                 _spawn(pair, 0, dict(base, role="workers"))]
        outs = collect_agents(procs, timeout=150)
        drops = [_qdisc_drops(pair, side) for side in (0, 1)]
    srv, workers = outs
    assert max(w[BURST]["passes_push"] for w in workers.values()) >= 4  # the burst was real
    quiet = [w[r]["latency_s"] for w in workers.values() for r in range(1, BURST)]
    after = range(BURST + 3, ROUNDS)
    ctrl = sum(srv[r]["control"] + sum(w[r]["control"] for w in workers.values()) for r in after)
    data = sum(srv[r]["data"] + sum(w[r]["data"] for w in workers.values()) for r in after)
    assert ctrl <= 0.1 * data, (ctrl, data)  # before the fix: 2.8 x data
    # Paced data plus a small control budget never overflow the drop-tail queues.
    assert sum(drops) <= 10, drops  # before the fix: thousands on the server's side
    later = [w[r]["latency_s"] for w in workers.values() for r in after]
    # The burst round costs its extra data (80 % loss: ~5x the push), not control stalls.
    burst = [w[BURST]["latency_s"] for w in workers.values()]
    assert max(burst) < 6 * sorted(quiet)[len(quiet) // 2], (burst, quiet)
    # Rounds after the burst are as fast as before it (was +14 % on this bottleneck).
    assert sorted(later)[len(later) // 2] < 1.08 * sorted(quiet)[len(quiet) // 2] + 0.01
