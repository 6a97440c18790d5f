"""A wrong or missing secret is named, and a job without one says so at start.

A member with another secret (or none) used to learn it only as "no WELCOME"
or "ranks [1] did not say HELLO". The cause is named (never the secret) in
the join timeout's error on both sides, as context: messages that fail
authentication prove nothing about who sent them, so a member no longer
gives up on them early (one forged CHALLENGE would abort a join; issue 60).
A member with a short join timeout therefore learns it within that timeout.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time

import numpy as np
import pytest

import dblp
from dblp import config

pytestmark = pytest.mark.unit


def _member_error(server_secret, member_secret, mode="ps"):
    """(TransportError text, seconds it took) of a member joining with ``member_secret``."""
    if mode == "ps":
        srv = dblp.ParameterServer("127.0.0.1", 0, 1, "reliable", secret=server_secret,
                                   join_timeout=3)
        port = srv.port
        th = threading.Thread(target=lambda: pytest.raises(dblp.TransportError, srv.serve, 1))
        member = (0, 1)
    else:
        lead = dblp.TransportGroup(0, 2, "127.0.0.1", 0, mode="sharded", secret=server_secret,
                                   join_timeout=3)
        port = lead.master_port
        th = threading.Thread(target=lambda: pytest.raises(dblp.TransportError, lead.allreduce_,
                                                           np.ones(10, np.float32)))
        member = (1, 2)
    th.start()
    try:
        g = dblp.TransportGroup(*member, "127.0.0.1", port, mode=mode, secret=member_secret,
                                join_timeout=1.5)
        t0 = time.monotonic()
        with pytest.raises(dblp.TransportError) as err:
            g.allreduce_(np.ones(10, np.float32))
        took = time.monotonic() - t0
        g.close()
    finally:
        th.join(30)
        (srv if mode == "ps" else lead).close()
    return str(err.value), took


@pytest.mark.parametrize("mode", ["ps", "sharded"])
def test_a_member_with_another_secret_says_so_within_its_join_timeout(mode):
    ours, theirs = secrets.token_hex(32), secrets.token_hex(32)
    text, took = _member_error(ours, theirs, mode)
    assert took < 2.0, took
    assert "secret differs" in text, text
    assert ours not in text and theirs not in text


def test_a_member_without_the_jobs_secret_says_so_within_its_join_timeout():
    text, took = _member_error(secrets.token_hex(32), None)
    assert took < 2.0 and "has a secret and this rank has none" in text, (took, text)


def test_a_member_with_a_secret_the_aggregator_lacks_says_so_within_its_join_timeout():
    text, took = _member_error(None, secrets.token_hex(32))
    assert took < 2.0 and "has no secret and this rank has one" in text, (took, text)


def test_the_aggregator_names_the_hellos_that_failed_authentication():
    srv = dblp.ParameterServer("127.0.0.1", 0, 1, "reliable", secret=secrets.token_hex(32),
                               join_timeout=1.5)
    g = dblp.TransportGroup(0, 1, "127.0.0.1", srv.port, secret=secrets.token_hex(32),
                            join_timeout=1.5)
    th = threading.Thread(target=lambda: pytest.raises(dblp.TransportError,
                                                       g.allreduce_, np.ones(10, np.float32)))
    th.start()
    try:
        with pytest.raises(dblp.TransportError, match="failed authentication .*the secrets "
                                                      "differ"):
            srv.serve(1)
    finally:
        th.join(30)
        g.close()
        srv.close()


def test_a_job_without_a_secret_warns_once_at_start_on_every_rank(caplog, monkeypatch):
    monkeypatch.setattr(config, "_WARNED_OPEN", set())  # as if each rank were a new process
    from dblp.testing import run_job
    with caplog.at_level(logging.WARNING, logger="dblp"):
        run_job(n_workers=2, rounds=3, numel=2_000)
    said = [r.getMessage() for r in caplog.records if "has no secret" in r.getMessage()]
    ranks = sorted(int(m.split(" rank ")[1].split(":")[0]) for m in said)
    assert ranks == [0, 1, 2], said  # two members and the server (rank 2), once each
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dblp"):
        run_job(n_workers=2, rounds=1, numel=2_000, secret=secrets.token_hex(32))
    assert not [r for r in caplog.records if "has no secret" in r.getMessage()]


def test_a_refusal_is_never_larger_than_the_hello_it_answers():
    """A short datagram shaped like a HELLO with a bad tag gets no answer (no amplifier);
    a member's HELLO, longer than any refusal, gets one."""
    import json
    import socket

    from dblp import wire
    from dblp.wire import MsgType
    srv = dblp.ParameterServer("127.0.0.1", 0, 1, "reliable", secret=secrets.token_hex(32),
                               join_timeout=1.0)
    th = threading.Thread(target=lambda: pytest.raises(dblp.TransportError, srv.serve, 1))
    th.start()
    atk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    atk.bind(("127.0.0.1", 0))
    atk.settimeout(0.3)
    try:
        short = wire.pack_header(MsgType.HELLO, src=0) + bytes(wire.TAG_SIZE)
        body = json.dumps({"rank": 0, "numel": 10, "mode": "ps", "nonce": 5}).encode()
        hello = wire.pack_header(MsgType.HELLO, src=0, length=len(body)) + body \
            + bytes(wire.TAG_SIZE)
        got = []
        for msg in (short, hello):
            atk.sendto(msg, ("127.0.0.1", srv.port))
            try:
                got.append(atk.recv(65536))
            except TimeoutError:
                got.append(None)
        assert got[0] is None
        assert got[1] is not None and len(got[1]) <= len(hello)
        assert wire.unpack_header(got[1]).type == MsgType.CHALLENGE
    finally:
        th.join(30)
        atk.close()
        srv.close()
