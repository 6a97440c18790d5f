"""One registry of arms, and the transport settings crossing into workers as a file."""
import json

import pytest
from click.testing import CliRunner

from testbed.config import arms
from testbed.config.arms import ARMS, Arm
from testbed.config.presets import PRESETS
from testbed.config.spec import load


@pytest.mark.unit
def test_the_shipped_arms_and_what_each_one_is():
    assert list(ARMS) == ["local", "gloo", "reliable", "static", "dblp", "reliable-tcp",
                          "static-tcp", "dblp-tcp", "reliable-sharded", "static-sharded",
                          "dblp-sharded", "static-high", "static-high-tcp",
                          "static-high-sharded", "dblp-slowed", "ddp", "ddp-gloo"]
    assert ARMS["dblp-slowed"] == Arm("dblp-slowed", "dblp", "udp", "ps", slowdown=0.10)
    assert ARMS["dblp"].peer("dblp") is ARMS["dblp"]     # never the slowed twin
    assert ARMS["dblp-tcp"] == Arm("dblp-tcp", "dblp", "tcp", "ps")
    assert ARMS["static-high"] == Arm("static-high", "static", "udp", "ps", bound_from="p_high")
    assert [a for a in ARMS if ARMS[a].serverless] == ["local", "gloo", "reliable-sharded",
                                                       "static-sharded", "dblp-sharded",
                                                       "static-high-sharded", "ddp",
                                                       "ddp-gloo"]
    assert [a for a in ARMS if ARMS[a].bounded] == ["static", "dblp", "static-tcp", "dblp-tcp",
                                                    "static-sharded", "dblp-sharded",
                                                    "static-high", "static-high-tcp",
                                                    "static-high-sharded", "dblp-slowed",
                                                    "ddp"]
    assert not ARMS["gloo"].uses_dblp and ARMS["reliable"].uses_dblp
    assert ARMS["dblp-sharded"].peer("static") is ARMS["static-sharded"]
    assert ARMS["dblp-sharded"].peer("static", "p_high") is ARMS["static-high-sharded"]
    assert ARMS["gloo"].peer("static") is None
    assert ARMS["ddp"] == Arm("ddp", "dblp", "udp", "sharded", integration="ddp")
    assert ARMS["dblp-sharded"].peer("dblp") is ARMS["dblp-sharded"]   # never the ddp arm
    assert ARMS["ddp"].peer("dblp") is ARMS["ddp"] and ARMS["ddp"].peer("static") is None
    assert {a.integration for a in ARMS.values() if not a.name.startswith("ddp")} == {"flat"}
    # The backend is the arm's, asked of the registry: DDP over dblp's, and over gloo's.
    assert (ARMS["ddp"].backend, ARMS["ddp-gloo"].backend) == ("dblp", "gloo")
    assert ARMS["ddp-gloo"] == Arm("ddp-gloo", "gloo", integration="ddp", backend="gloo")
    assert {a.backend for a in ARMS.values() if a.integration == "flat"} == {None}
    # Like for like: each loop against gloo reached the same way.
    assert ARMS["ddp"].gloo_peer() is ARMS["ddp-gloo"]
    assert ARMS["dblp-sharded"].gloo_peer() is ARMS["gloo"]
    assert ARMS["gloo"].gloo_peer() is None and ARMS["ddp-gloo"].gloo_peer() is None


@pytest.mark.unit
def test_names_come_from_the_transport_registries():
    from dblp.config import CONTROLS, MISSING, MODES
    from dblp.policy import POLICIES

    assert arms.policies() == tuple(POLICIES)
    assert (arms.controls(), arms.modes(), arms.missing_policies()) == (CONTROLS, MODES, MISSING)
    # Every transport has a built-in arm but c10d, whose arms a spec declares ([ddp.NAME]).
    assert {a.transport for a in ARMS.values()} == set(arms.transports()) - {arms.C10D}


@pytest.mark.unit
@pytest.mark.parametrize("bad", [
    dict(name="x", transport="carrier-pigeon"),
    dict(name="x", transport="static", control="smoke-signal", mode="ps"),
    dict(name="x", transport="static", control="udp", mode="ring"),
    dict(name="x", transport="gloo", control="udp"),
    dict(name="a b", transport="gloo"),
    dict(name="x", transport="dblp", control="udp", mode="ps", bound_from="p_high"),
    dict(name="x", transport="gloo", bound_from="p_high"),
])
def test_an_arm_is_checked_against_the_registries(bad):
    with pytest.raises(ValueError):
        Arm(**bad)


@pytest.fixture
def user_policy(monkeypatch):
    """A researcher's own loss policy, registered in dblp and given its arms."""
    from dblp import policy

    monkeypatch.setitem(policy.POLICIES, "mine", policy.StaticBound)
    before = dict(ARMS)
    made = arms.register_policy("mine")
    yield made
    ARMS.clear()
    ARMS.update(before)


@pytest.mark.unit
def test_a_user_registered_policy_gets_every_arm_and_passes_the_spec(user_policy):
    assert [a.name for a in user_policy] == ["mine", "mine-tcp", "mine-sharded"]
    spec = load(None, PRESETS["smoke"], ["arms=mine,mine-sharded,static"])
    assert spec.arms == ["mine", "mine-sharded", "static"]
    with pytest.raises(ValueError):
        arms.register(Arm("mine", "static", "udp", "ps"))  # a taken name, another arm


@pytest.mark.unit
def test_cli_lists_the_registry_and_an_unknown_arm_is_one_line():
    from testbed.cli import main

    res = CliRunner().invoke(main, ["run", "--help"])
    assert "dblp-sharded" in res.output and "reliable-tcp" in res.output
    res = CliRunner().invoke(main, ["run", "--arms", "static,nope", "--dry-run"])
    assert res.exit_code == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "'arms'" in res.stderr


@pytest.mark.unit
def test_analysis_reads_transport_and_mode_from_the_registry():
    from testbed.analysis.arms import arm_mode, arm_transport

    assert arm_transport("static-tcp") == "static" and arm_mode("dblp-sharded") == "sharded"
    assert arm_mode("dblp-tcp") == "ps" and arm_mode("gloo") is None


class _Fab:
    control_socket = "/run/x/control.sock"
    controller = None

    def ip(self, host):
        return "10.0.0." + host[-1]

    def intf(self, host):
        return host + "-eth0"


def _arm_run(tmp_path, arm, overrides=(), seed=None):
    from testbed.run.runner import ArmRun

    spec = load(None, PRESETS["default"], list(overrides))
    return ArmRun(spec, arm, _Fab(), tmp_path, "h000", ["h100", "h200", "h300", "h310"], seed)


def _unit(tmp_path, arm, run):
    return tmp_path / "raw" / arm / f"seed-{run.unit.seed}"


@pytest.mark.unit
@pytest.mark.parametrize("arm", ["static", "dblp-tcp", "dblp-sharded"])
def test_transport_settings_cross_into_the_workers_as_a_config_file(tmp_path, arm):
    from dblp.config import SECRET_ENV, TransportConfig

    run = _arm_run(tmp_path, arm, ["transport.p_high=0.5", "transport.round_deadline_s=45"])
    argv = run.launcher.transport_args("worker")
    assert argv == ["--transport-config", str(_unit(tmp_path, arm, run) / "transport.json")]
    assert not any(a.startswith("--knob") or "=" in a for a in argv)
    text = (_unit(tmp_path, arm, run) / "transport.json").read_text()
    assert run.unit.secret not in text  # the key never lands in the run directory
    cfg = TransportConfig.from_json(text)
    a = ARMS[arm]
    assert (cfg.policy, cfg.control, cfg.mode) == (a.transport, a.control, a.mode)
    assert cfg.round_timeout == 45.0 and cfg.p_high == 0.5 and cfg.session_id == run.unit.session_id
    bps = run.unit.spec["topology"]["bw_mbps"] * 1e6
    assert cfg.rate_bps == pytest.approx(bps * 0.95 / (1 if a.serverless else 4))
    assert run.unit.env(0)[SECRET_ENV] == run.unit.secret
    if not a.serverless:
        run.launcher.transport_args("server")
        server = json.loads((_unit(tmp_path, arm, run) / "server.transport.json").read_text())
        assert server["rate_bps"] == pytest.approx(bps * 0.95)
        assert server["session_id"] == cfg.session_id


@pytest.mark.unit
def test_baseline_arms_get_no_transport_settings(tmp_path):
    run = _arm_run(tmp_path, "gloo")
    assert run.launcher.transport_args("worker") == []
    assert not (_unit(tmp_path, "gloo", run) / "transport.json").exists()
    from dblp.config import SECRET_ENV
    assert SECRET_ENV not in run.unit.env(0)


@pytest.mark.unit
def test_arm_runs_have_their_own_key_and_session(tmp_path):
    a, b = _arm_run(tmp_path, "dblp"), _arm_run(tmp_path, "static")
    assert a.unit.secret != b.unit.secret and a.unit.session_id != b.unit.session_id
    assert not hasattr(a.unit, "session")


@pytest.mark.unit
def test_a_unit_trains_with_its_seed_and_writes_under_its_seed(tmp_path):
    from testbed.run.runner import run_order, unit_label

    run = _arm_run(tmp_path, "dblp", ["seed=3", "seeds=2"], seed=4)
    assert run.unit.raw == tmp_path / "raw" / "dblp" / "seed-4" and run.unit.raw.is_dir()
    from workloads.training import TrainingSettings
    argv = run.launcher.training_args()
    assert argv == ["--training-config", str(run.unit.raw / "training.json")]
    assert TrainingSettings.read(argv[1]).seed == 4
    assert run.launcher.transport_args("worker")[1] == str(run.unit.raw / "transport.json")
    assert run.label == unit_label("dblp", 4) == "dblp s4"
    assert _arm_run(tmp_path, "gloo", ["seed=3"]).unit.seed == 3     # no seed given: the spec's
    # Seed by seed, the spec's arms within each: a drift of the machine hits every arm alike.
    spec = load(None, PRESETS["default"], ["arms=gloo,dblp", "seed=3", "seeds=2"])
    assert run_order(spec) == [("gloo", 3), ("dblp", 3), ("gloo", 4), ("dblp", 4)]


@pytest.mark.unit
def test_a_unit_s_launcher_is_picked_by_its_arm_s_kind(tmp_path):
    """A built-in arm's processes are the built-in launcher's; the contract itself starts
    nothing (a command arm's launcher: tests/unit/test_command_arms.py)."""
    from testbed.run.builtinlauncher import BuiltinLauncher
    from testbed.run.launch import Launcher

    for arm in ("dblp", "gloo", "ddp"):
        run = _arm_run(tmp_path, arm)
        assert type(run.launcher) is BuiltinLauncher and run.launcher.unit is run.unit
        assert run.launcher.poll_s == 0.5
    with pytest.raises(TypeError):
        Launcher(run.unit)


@pytest.mark.unit
def test_fabric_dead_helpers_are_gone():
    from testbed.emulation import fabric

    for name in ("env", "popen_on", "switch_intf"):
        assert not hasattr(fabric.Fabric, name)
    assert not hasattr(fabric, "OFP_PORT_BASE")


@pytest.mark.unit
@pytest.mark.parametrize("arm,p", [("static", 0.01), ("static-high", 0.5),
                                   ("static-high-sharded", 0.5)])
def test_a_static_arm_takes_its_bound_from_the_spec_field_its_arm_names(tmp_path, arm, p):
    from dblp.config import TransportConfig

    run = _arm_run(tmp_path, arm, ["transport.p_high=0.5", "transport.p_static=0.01"])
    run.launcher.transport_args("worker")
    cfg = TransportConfig.from_json((_unit(tmp_path, arm, run) / "transport.json").read_text())
    assert (cfg.policy, cfg.p) == ("static", p)
    assert cfg.make_policy().bound(0) == p


@pytest.mark.unit
def test_an_arm_naming_a_spec_field_that_does_not_exist_is_a_spec_error():
    from testbed.config.spec import SpecError, transport_config

    spec = load(None, PRESETS["default"])
    with pytest.raises(SpecError, match="transport.p_nope"):
        transport_config(spec["transport"], Arm("x", "static", "udp", "ps", bound_from="p_nope"))


@pytest.mark.unit
def test_progress_names_the_arm_and_the_seed(tmp_path, capsys):
    from testbed.run.progress import Progress

    log = tmp_path / "worker0.jsonl"
    log.write_text(json.dumps({"event": "round", "round": 39}) + "\n")
    Progress(_arm_run(tmp_path, "dblp", seed=2).label, 200, log).show(final=True)
    assert capsys.readouterr().err.strip().startswith("[dblp s2] round 40/200")


@pytest.mark.unit
@pytest.mark.parametrize("bad,why", [
    (dict(transport="local"), "'local' has none"),
    (dict(transport="dblp", control="tcp", mode="ps"), "sharded"),
    (dict(transport="dblp", control="udp", mode="ps"), "sharded"),
    (dict(transport="static", control="tcp", mode="sharded"), "sharded"),
    (dict(transport="gloo", backend="dblp"), "reached by backend 'gloo', not 'dblp'"),
    (dict(transport="dblp", control="udp", mode="sharded", backend="gloo"), "backend 'dblp'"),
    (dict(transport="c10d"), "name one"),
    (dict(transport="c10d", backend="gloo"), "built-in arm 'ddp-gloo'"),
    (dict(transport="c10d", backend="dblp"), "built-in arm 'ddp'"),
    (dict(transport="gloo", backend_module="mine"), "only a 'c10d' arm imports a module"),
])
def test_the_ddp_integration_refuses_what_the_torch_backend_cannot_run(bad, why):
    with pytest.raises(ValueError, match=why):
        Arm("x", integration="ddp", **bad)


@pytest.mark.unit
def test_an_integration_is_one_of_the_registry_and_commands_have_none():
    from workloads.integrations import INTEGRATIONS

    assert list(INTEGRATIONS) == ["flat", "ddp"]
    with pytest.raises(ValueError, match="integration 'nope' is not one of"):
        Arm("x", "dblp", "udp", "sharded", integration="nope")
    with pytest.raises(ValueError, match="a command arm has no"):
        Arm("x", arms.COMMAND, command=arms.Command(("true",)), integration="ddp")
    with pytest.raises(ValueError, match="a command arm has no"):
        Arm("x", arms.COMMAND, command=arms.Command(("true",)), backend="gloo")
    # The flat loop names no backend, and has no exchange for a backend the arm names.
    with pytest.raises(ValueError, match="named only under integration 'ddp'"):
        Arm("x", "gloo", backend="gloo")
    with pytest.raises(ValueError, match="'c10d' has no flat exchange"):
        Arm("x", arms.C10D)
    # Any dblp policy can run under DDP the one way the backend runs.
    assert Arm("x", "static", "udp", "sharded", integration="ddp").serverless


@pytest.mark.unit
def test_the_ddp_arm_is_accepted_everywhere_an_arm_is_and_mirrors_dblp_sharded(tmp_path):
    from dblp.config import SECRET_ENV
    from testbed.analysis.arms import arm_mode, is_dblp_arm, static_partner
    from testbed.cli import main
    from testbed.config.spec import transport_config

    assert "ddp" in CliRunner().invoke(main, ["run", "--help"]).output
    res = CliRunner().invoke(main, ["run", "--preset", "smoke", "--arms", "dblp,ddp",
                                    "--dry-run"])
    assert res.exit_code == 0, res.output
    spec = load(None, PRESETS["smoke"], ["arms=dblp-sharded,ddp,static-sharded,gloo"])
    assert spec.arms == ["dblp-sharded", "ddp", "static-sharded", "gloo"]
    # Its transport settings are dblp-sharded's, bound included: their rounds compare.
    assert transport_config(spec["transport"], ARMS["ddp"]) == \
        transport_config(spec["transport"], ARMS["dblp-sharded"])
    # The analysis judges it as it judges dblp-sharded: against static-sharded, and gloo.
    assert is_dblp_arm("ddp") and arm_mode("ddp") == "sharded"
    assert static_partner("ddp", spec.arms) == "static-sharded"
    # Its workers run the DDP loop over the sharded dblp transport, at the sharded rate,
    # rank 0 on the server's host (no server of its own).
    run = _arm_run(tmp_path, "ddp")
    assert run.unit.serverless and run.unit.workers[0] == "h000"
    assert run.launcher.integration_args() == ["--integration", "ddp", "--backend", "dblp"]
    assert _arm_run(tmp_path, "dblp-sharded").launcher.integration_args() == []
    run.launcher.transport_args("worker")
    cfg = json.loads((_unit(tmp_path, "ddp", run) / "transport.json").read_text())
    assert (cfg["policy"], cfg["control"], cfg["mode"]) == ("dblp", "udp", "sharded")
    assert cfg["rate_bps"] == pytest.approx(run.unit.spec["topology"]["bw_mbps"] * 1e6 * 0.95)
    assert run.unit.env(0)[SECRET_ENV] == run.unit.secret
