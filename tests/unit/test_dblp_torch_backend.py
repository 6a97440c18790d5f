"""dblp as a torch.distributed backend: collectives, DDP under torchrun, the join's errors.

The collectives are checked in one process (three ``DblpProcessGroup``s in
threads sharing a HashStore, as c10d would give each rank its store); DDP is
checked the way a user runs it: ``torchrun`` with three ranks and no other
process, against gloo with the same seeds.
"""
import datetime
import json
import logging
import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import dblp
from dblp.testing import free_port

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
tb = pytest.importorskip("dblp.torch_backend")

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_dblp.py"
TIMEOUT = datetime.timedelta(seconds=30)


def run_ranks(fn, world=3, config=None):
    """``fn(pg, rank)`` on ``world`` in-process process groups; returns the results by rank."""
    store = dist.HashStore()
    config = config or tb.options()
    out, errors = {}, []

    def one(rank):
        pg = tb.DblpProcessGroup(store, rank, world, TIMEOUT, config, "127.0.0.1")
        try:
            out[rank] = fn(pg, rank)
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            pg.shutdown()
    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return out


def _opts(op):
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return o


def _rs_opts(op):
    o = dist.ReduceScatterOptions()
    o.reduceOp = op
    return o


def test_collectives_are_exact_for_any_dtype_and_size():
    def fn(pg, rank):
        got = {}
        # broadcast: odd byte counts and non-float dtypes arrive bit for bit
        for dtype, shape in ((torch.float64, (3, 5)), (torch.int64, (7,)), (torch.bool, (3,)),
                             (torch.float16, (5,)), (torch.float32, ())):
            g = torch.Generator().manual_seed(100 + rank)
            t = (torch.randn(shape, generator=g) * 1e6).to(dtype)
            o = dist.BroadcastOptions()
            o.rootRank = 2
            pg.broadcast([t], o).wait()
            got[f"bcast {dtype}"] = t.clone()
        # all_gather of an int tensor (what DDP's parameter-shape check sends)
        outs = [[torch.zeros(3, dtype=torch.int64) for _ in range(3)]]
        pg.allgather(outs, [torch.tensor([rank, -rank, 2**40 + rank])]).wait()
        got["gather"] = torch.stack(outs[0])
        # exact reductions: integers, MAX, and a float MIN
        t = torch.tensor([rank + 1, 10 * rank], dtype=torch.int32)
        pg.allreduce([t], _opts(dist.ReduceOp.SUM)).wait()
        got["int sum"] = t
        t = torch.tensor([float(rank), -float(rank)])
        pg.allreduce([t], _opts(dist.ReduceOp.MAX)).wait()
        got["max"] = t
        # lossy path at bound 0: several tensors of different dtypes in one call
        a, b = torch.full((4, 3), float(rank + 1)), torch.full((5,), 2.0 * rank, dtype=torch.float64)
        pg.allreduce_coalesced([a, b], _opts(dist.ReduceOp.AVG)).wait()
        got["avg"] = (a.clone(), b.clone())
        pg.barrier().wait()
        got["stats"] = pg.stats()
        return got

    res = run_ranks(fn)
    for dtype, shape in ((torch.float64, (3, 5)), (torch.int64, (7,)), (torch.bool, (3,)),
                         (torch.float16, (5,)), (torch.float32, ())):
        want = (torch.randn(shape, generator=torch.Generator().manual_seed(102)) * 1e6).to(dtype)
        for r in range(3):
            assert torch.equal(res[r][f"bcast {dtype}"], want), (dtype, r)
    for r in range(3):
        assert res[r]["gather"].tolist() == [[k, -k, 2**40 + k] for k in range(3)]
        assert res[r]["int sum"].tolist() == [6, 30]
        assert res[r]["max"].tolist() == [2.0, 0.0]
        a, b = res[r]["avg"]
        assert torch.allclose(a, torch.full((4, 3), 2.0)) and b.dtype == torch.float64
        assert torch.allclose(b, torch.full((5,), 2.0, dtype=torch.float64))
    # one lossy stream for the coalesced all_reduce (12 + 5 elements), the rest exact
    assert [k for k in res[0]["stats"] if k.startswith("grad/")] == ["grad/17"]


def test_sum_is_n_times_the_mean_and_replicas_agree_under_a_loose_bound():
    """DDP divides each bucket by N and asks for SUM: the backend returns N x mean."""
    def grads(rank):
        return torch.from_numpy(np.random.default_rng(rank).standard_normal(50_000)
                                .astype(np.float32))

    def fn(pg, rank):
        t = grads(rank)
        pg.allreduce([t], _opts(dist.ReduceOp.SUM)).wait()
        return t
    exact = run_ranks(fn, config=tb.options(policy="reliable"))
    assert torch.allclose(exact[0], sum(grads(r) for r in range(3)), atol=1e-5)
    loose = run_ranks(fn, config=tb.options(policy="static", p=0.4))
    for res in (exact, loose):
        assert torch.equal(res[0], res[1]) and torch.equal(res[0], res[2])  # bit-identical


def test_unsupported_collectives_and_settings_say_what_to_do():
    with pytest.raises(ValueError, match="mode='sharded'"):
        tb.DblpProcessGroup(dist.HashStore(), 0, 1, TIMEOUT, dblp.TransportConfig(), "127.0.0.1")
    with pytest.raises(ValueError, match="control='udp'"):
        tb.DblpProcessGroup(dist.HashStore(), 0, 1, TIMEOUT, tb.options(control="tcp"),
                            "127.0.0.1")
    pg = tb.DblpProcessGroup(dist.HashStore(), 0, 1, TIMEOUT, tb.options(), "127.0.0.1")
    try:
        with pytest.raises(NotImplementedError, match="all_to_all is not supported.*gloo"):
            pg.alltoall([torch.zeros(1)], [torch.zeros(1)])
        with pytest.raises(NotImplementedError, match="reduce_scatter_tensor with op PREMUL_SUM"):
            pg.reduce_scatter_single(torch.zeros(1), torch.zeros(1),
                                     _rs_opts(dist.ReduceOp.PREMUL_SUM(0.5)))
        with pytest.raises(NotImplementedError, match="send is not supported"):
            pg.send([torch.zeros(1)], 0, 0)
        # an op the backend cannot do is refused at the call and leaves the group usable
        with pytest.raises(NotImplementedError, match="op BAND on torch.float32"):
            pg.allreduce([torch.zeros(2)], _opts(dist.ReduceOp.BAND))
        t = torch.tensor([5, 3])
        pg.allreduce([t], _opts(dist.ReduceOp.BXOR)).wait()
        assert t.tolist() == [5, 3]  # one rank
    finally:
        pg.shutdown()


def test_unreachable_aggregator_fails_within_seconds_naming_the_address():
    """Rank 0 published an address where nothing answers: rank 1 says so, fast."""
    store = dist.HashStore()
    port = free_port()
    store.set("dblp/grad/5/stream", "1")  # as rank 0 publishes it, before the address
    store.set("dblp/grad/5/addr", f"127.0.0.1:{port}")
    store.set("dblp/grad/5/ready", "1")
    pg = tb.DblpProcessGroup(store, 1, 2, TIMEOUT, tb.options(), "127.0.0.1")
    t0 = time.monotonic()
    try:
        with pytest.raises(Exception, match=f"cannot reach its aggregator.*127.0.0.1:{port}"):
            pg.allreduce([torch.ones(5)], _opts(dist.ReduceOp.SUM)).wait()
        elapsed = time.monotonic() - t0
        # a failed join fails what follows, at once
        with pytest.raises(Exception, match="earlier collective failed"):
            pg.barrier().wait()
    finally:
        pg.shutdown()
    assert elapsed < 2 * dblp.TransportConfig().hello_timeout


def test_member_without_a_server_says_so_within_seconds(caplog):
    """torchrun + from_env in PS mode: no silent wait for a server that never comes."""
    port = free_port()
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "DBLP_HELLO_TIMEOUT": "0.3", "DBLP_JOIN_TIMEOUT": "1.5"}
    with caplog.at_level(logging.WARNING, logger="dblp"):
        t0 = time.monotonic()
        with dblp.TransportGroup.from_env(env) as g:
            with pytest.raises(dblp.TransportError, match=f"127.0.0.1:{port}.*torchrun"):
                g.allreduce_(np.ones(4, np.float32))
    warned = [r for r in caplog.records if f"127.0.0.1:{port}" in r.getMessage()]
    assert warned and "mode='sharded'" in warned[0].getMessage()
    assert time.monotonic() - t0 < 5


# -- DDP under torchrun ---------------------------------------------------------------------
#: How gloo's C++ threads die when torn down while in use: std::terminate, SIGABRT.
GLOO_ABORT = "terminate called without an active exception"
#: Runs of the gloo baseline after one that aborted so: two CI runs of one evening on
#: this machine saw it abort twice in a row.
GLOO_AGAIN = 3


def torchrun(*args, timeout=240, again_on_gloo_abort=False):
    """Run the DDP example on 3 local ranks; its rank 0's summary.

    ``again_on_gloo_abort``: for the gloo baseline only. Its ranks leave
    together and destroy the group (examples/ddp_dblp.py), yet one CI run on
    this 2-core machine still saw rank 0 abort with ``GLOO_ABORT`` in gloo's
    own threads. That is the baseline's library failing, not a result: the
    run is repeated (up to ``GLOO_AGAIN`` times), and each abort is printed. A
    DBLP run is never repeated.
    """
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3",
           str(EXAMPLE), *args]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    for _ in range(GLOO_AGAIN if again_on_gloo_abort else 0):
        if out.returncode == 0 or GLOO_ABORT not in out.stderr:
            break
        print(f"gloo baseline aborted in gloo's threads ({GLOO_ABORT!r}); running it again")
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def test_ddp_unchanged_over_dblp_matches_gloo_at_bound_zero(record_property):
    """3 ranks, the digits CNN in 2 DDP buckets: identical replicas, gloo's accuracy."""
    steps = ["--steps", "120", "--seed", "3"]
    ours = torchrun("--policy", "reliable", *steps)
    gloo = torchrun("--backend", "gloo", *steps, again_on_gloo_abort=True)
    assert len(ours["bucket_sizes_bytes"]) >= 2
    assert ours["bucket_sizes_bytes"] == gloo["bucket_sizes_bytes"]
    assert ours["replicas_identical"] is True
    assert ours["transport"]["mode"] == "sharded" and ours["transport"]["policy"] == "reliable"
    # one lossy stream per bucket size, a round per bucket per step
    grads = {k: v for k, v in ours["rounds"].items() if k.startswith("grad/")}
    assert sorted(v for v in grads.values() if v > 1) == [119, 119]
    # Same seeds, same data, bound 0: only the order of float additions differs.
    assert abs(ours["accuracy"] - gloo["accuracy"]) <= 0.01, (ours["accuracy"], gloo["accuracy"])
    assert ours["accuracy"] > 0.85
    ratio = ours["step_s_median"] / gloo["step_s_median"]
    record_property("dblp_over_gloo_step_time", ratio)
    print(f"per-step time dblp/gloo on loopback: {ratio:.2f} "
          f"({ours['step_s_median'] * 1e3:.1f} ms / {gloo['step_s_median'] * 1e3:.1f} ms); "
          f"accuracy {ours['accuracy']:.4f} / {gloo['accuracy']:.4f}")


def test_options_take_the_jobs_secret_from_the_environment(monkeypatch):
    from dblp.torch_backend import options
    monkeypatch.setenv("DBLP_SECRET", "ab" * 32)
    assert options(policy="static", p=0.01).secret == "ab" * 32
    assert options(secret="cd" * 32).secret == "cd" * 32
    monkeypatch.delenv("DBLP_SECRET")
    assert options().secret is None


def test_a_groups_rank0_advertises_its_own_address_not_the_stores(monkeypatch):
    """A subgroup's rank 0 may sit on another host than the store: it names its own address.

    On loopback the store can listen at 127.0.0.2 while this host's source address
    towards it is 127.0.0.1: the address chosen is the latter (the route's source),
    behind any PrefixStore c10d wraps around the store, and members reach it there.
    """
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    for store_host in ("127.0.0.1", "127.0.0.2"):
        store = dist.TCPStore(store_host, 0, 1, is_master=True, timeout=TIMEOUT)
        assert store.host == store_host
        assert tb._advertised_host(store) == "127.0.0.1"
        assert tb._advertised_host(dist.PrefixStore("g/", dist.PrefixStore("h/", store))) \
            == "127.0.0.1"
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    assert tb._advertised_host(dist.HashStore()) == "127.0.0.1"
    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")
    with pytest.raises(ValueError, match="'no-such-host.invalid' does not resolve"):
        tb._advertised_host(dist.HashStore())

    # two ranks through the groups c10d builds on a store at 127.0.0.2: rank 0's
    # stream is published at its own address, and the reduction is exact
    store = dist.TCPStore("127.0.0.2", 0, 2, is_master=True, timeout=TIMEOUT,
                          wait_for_workers=False)
    monkeypatch.delenv("MASTER_ADDR")
    host = tb._advertised_host(store)
    out, errors = {}, []

    def one(rank):
        client = store if rank == 0 else dist.TCPStore("127.0.0.2", store.port, 2,
                                                       is_master=False, timeout=TIMEOUT)
        pg = tb.DblpProcessGroup(dist.PrefixStore("sub", client), rank, 2, TIMEOUT,
                                 tb.options(policy="reliable"), host)
        try:
            t = torch.full((1000,), float(rank + 1))
            pg.allreduce([t], _opts(dist.ReduceOp.SUM)).wait()
            out[rank] = (t.min().item(), t.max().item())
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            pg.shutdown()
    threads = [threading.Thread(target=one, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert out == {0: (3.0, 3.0), 1: (3.0, 3.0)}
    assert store.get(f"sub/{tb._KEY}/grad/1000/addr").decode().startswith("127.0.0.1:")
