"""TransportConfig: ranges beside fields, validated once, exact JSON round trip, env and files."""
import dataclasses
import json
import os
import stat

import pytest

import dblp
from dblp.config import SCHEMA, SETTINGS, TransportConfig, default_of

pytestmark = pytest.mark.unit

SECRET = "5e" * 32


def test_registries_live_in_one_place():
    assert dblp.CONTROLS == ("udp", "tcp") and dblp.MODES == ("ps", "sharded")
    assert dblp.MISSING == ("zero", "mean", "error_feedback")
    assert set(dblp.POLICIES) == {"reliable", "static", "dblp"}


@pytest.mark.parametrize("cfg", [
    TransportConfig(),
    TransportConfig(policy="static", p=0.02, control="tcp", rate_bps=1e8, secret=SECRET,
                    session_id=2**64 - 1, round_timeout=7),
    TransportConfig(policy="dblp", p_low=0.024, p_high=0.5, check_every="epoch",
                    rounds_per_epoch=11, norm="last", mode="sharded", missing="error_feedback"),
])
def test_json_round_trip_is_exact(cfg, tmp_path):
    text = cfg.to_json()
    assert json.loads(text)["schema"] == SCHEMA
    assert TransportConfig.from_json(text) == cfg
    path = tmp_path / dblp.CONFIG_FILE
    cfg.write(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # it may hold the key
    assert TransportConfig.read(path, env={}) == cfg


def test_ints_become_floats_once():
    cfg = TransportConfig(round_timeout=7, rate_bps=100_000_000)
    assert isinstance(cfg.round_timeout, float) and isinstance(cfg.rate_bps, float)
    assert TransportConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("bad,field", [
    ({"policy": "fancy"}, "policy"), ({"p": 1.0}, "p"), ({"p": -0.1}, "p"), ({"p": "0.1"}, "p"),
    ({"p_low": float("nan")}, "p_low"), ({"p_low": 0.5, "p_high": 0.1}, "p_high"),
    ({"threshold": 0}, "threshold"), ({"check_every": 0}, "check_every"),
    ({"check_every": 2.5}, "check_every"), ({"check_every": "epoch"}, "rounds_per_epoch"),
    ({"norm": "median"}, "norm"), ({"control": "quic"}, "control"), ({"mode": "ring"}, "mode"),
    ({"missing": "guess"}, "missing"), ({"rate_bps": 0}, "rate_bps"),
    ({"rate_bps": float("inf")}, "rate_bps"), ({"round_timeout": -1}, "round_timeout"),
    ({"join_timeout": True}, "join_timeout"), ({"session_id": 0}, "session_id"),
    ({"session_id": 2**64}, "session_id"), ({"secret": "xyz"}, "secret"),
    ({"secret": "ab" * 4}, "secret"), ({"early_bytes": -1}, "early_bytes"),
])
def test_bad_values_name_the_setting(bad, field):
    with pytest.raises(ValueError, match=field):
        TransportConfig(**bad)


def test_unknown_schema_and_keys_are_refused_in_one_line():
    doc = json.loads(TransportConfig().to_json())
    for schema in (None, 0, 2, "1"):
        d = dict(doc, schema=schema)
        with pytest.raises(ValueError, match="schema") as e:
            TransportConfig.from_json(json.dumps(d))
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="colour"):
        TransportConfig.from_json(json.dumps(dict(doc, colour="red")))
    for junk in ("[", "[]", '{"schema": 1, "p": NaN}', '{"schema": 1, "p": 1e999}', "[" * 50000):
        with pytest.raises(ValueError):
            TransportConfig.from_json(junk)


def test_policies_take_their_defaults_from_the_config():
    """One default per setting: the dataclass's."""
    cfg = TransportConfig()
    pol = dblp.make_policy("dblp")
    assert (pol.p_low, pol.threshold, pol.check_every, pol.norm) == (
        cfg.p_low, cfg.threshold, cfg.check_every, cfg.norm)
    assert dblp.make_policy("static").p == default_of("p") == cfg.p
    assert cfg.make_policy().knobs() == pol.knobs()
    assert TransportConfig(policy="static", p=0.03).make_policy().bound(0) == 0.03


def test_from_env_reads_every_setting_and_names_the_variable():
    env = {"DBLP_POLICY": "static", "DBLP_P": "0.02", "DBLP_SESSION_ID": "0x2a",
           "DBLP_RATE_BPS": "1e8", "DBLP_CHECK_EVERY": "epoch", "DBLP_ROUNDS_PER_EPOCH": "9",
           "DBLP_SECRET": SECRET.upper()}
    cfg = TransportConfig.from_env(env, missing="mean")
    assert (cfg.policy, cfg.p, cfg.session_id, cfg.rate_bps, cfg.check_every) == (
        "static", 0.02, 42, 1e8, "epoch")
    assert cfg.missing == "mean" and cfg.secret == SECRET
    for var, val in (("DBLP_RATE_BPS", "fast"), ("DBLP_P", "2"), ("DBLP_SECRET", "nothex")):
        with pytest.raises(ValueError, match=var):
            TransportConfig.from_env({var: val})


def test_from_env_starts_from_a_file_and_the_secret_may_stay_out_of_it(tmp_path):
    path = tmp_path / "t.json"
    TransportConfig(policy="static", p=0.1).write(path)
    cfg = TransportConfig.from_env({"DBLP_CONFIG": str(path), "DBLP_SECRET": SECRET,
                                    "DBLP_ROUND_TIMEOUT": "3"})
    assert (cfg.policy, cfg.p, cfg.round_timeout, cfg.secret) == ("static", 0.1, 3.0, SECRET)
    TransportConfig(secret=SECRET).write(path)
    with pytest.raises(ValueError, match="DBLP_SECRET"):
        TransportConfig.read(path, env={"DBLP_SECRET": "7f" * 32})
    with pytest.raises(ValueError, match="cannot read"):
        TransportConfig.read(tmp_path / "missing.json")


def test_secret_stays_out_of_repr_and_public_dict():
    cfg = TransportConfig(secret=SECRET)
    assert SECRET not in repr(cfg) and SECRET not in json.dumps(cfg.public_dict())
    assert cfg.public_dict()["authenticated"] is True and cfg.key == bytes.fromhex(SECRET)


def test_server_and_group_take_a_config_and_keywords_override_it():
    cfg = TransportConfig(policy="static", p=0.05, missing="mean")
    with dblp.ParameterServer("127.0.0.1", 0, 1, config=cfg, p=0.07) as srv:
        assert srv.policy.bound(0) == 0.07 and srv.missing == "mean"
        assert srv.config == dataclasses.replace(cfg, p=0.07)
    g = dblp.TransportGroup(0, 2, "127.0.0.1", 47999, config=cfg, mode="sharded")
    try:
        assert g.mode == "sharded" and g.policy.bound(0) == 0.05
    finally:
        g.close()
    with pytest.raises(ValueError, match="sharded"):
        dblp.ParameterServer("127.0.0.1", 0, 1, config=dataclasses.replace(cfg, mode="sharded"))
    with pytest.raises(ValueError, match="colour"):
        dblp.ParameterServer("127.0.0.1", 0, 1, colour="red")


def test_settings_are_declared_with_their_ranges():
    for f in dataclasses.fields(TransportConfig):
        assert f.metadata["doc"], f.name
    assert "secret" in SETTINGS and "policy" in SETTINGS


def test_slowdown_is_refused_outside_the_regression_test(monkeypatch):
    """The test-only slowdown needs DBLP_TEST_SLOWDOWN=1; off by default."""
    from dblp.config import SLOWDOWN_ENV
    monkeypatch.delenv(SLOWDOWN_ENV, raising=False)
    assert TransportConfig().slowdown == 0.0
    with pytest.raises(ValueError, match="slowdown=0.1 is a test-only setting"):
        TransportConfig(slowdown=0.1)
    monkeypatch.setenv(SLOWDOWN_ENV, "1")
    assert TransportConfig(slowdown=0.1).slowdown == 0.1


def test_slowdown_makes_every_exchange_that_much_longer(monkeypatch):
    """Real rounds on loopback: each member pauses slowdown x its exchange, inside the round."""
    import sys
    import threading
    import time

    import numpy as np

    from dblp import group
    from dblp.config import SLOWDOWN_ENV
    monkeypatch.setenv(SLOWDOWN_ENV, "1")
    pauses: list[float] = []
    real_sleep = time.sleep

    def recorded(s):
        if sys._getframe(1).f_code.co_name == "allreduce_":   # the group's pause only
            pauses.append(s)
        real_sleep(s)
    monkeypatch.setattr(group.time, "sleep", recorded)
    srv = dblp.ParameterServer("127.0.0.1", 0, 2, "reliable")
    th = threading.Thread(target=srv.serve, args=(3,))
    th.start()
    seen: dict[int, list[float]] = {}

    def work(rank):
        cfg = TransportConfig(policy="reliable", slowdown=0.5)
        with dblp.TransportGroup(rank=rank, world_size=2, master_addr="127.0.0.1",
                                 master_port=srv.port, config=cfg) as g:
            for _ in range(3):
                seen.setdefault(rank, []).append(g.allreduce_(np.ones(50_000, np.float32)).latency_s)
    ts = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    [t.start() for t in ts]
    [t.join(60) for t in ts]
    th.join(60)
    srv.close()
    assert sorted(map(len, seen.values())) == [3, 3] and len(pauses) == 6
    # Each round's latency is its exchange plus a pause of half the exchange, so at least three
    # times the pause (sleep only ever overshoots, which a loaded machine makes larger).
    latencies = [x for xs in seen.values() for x in xs]
    assert all(p > 0 for p in pauses)
    assert sum(latencies) >= 3 * sum(pauses) - 1e-3, (latencies, pauses)
