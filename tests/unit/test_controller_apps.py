"""The controller's apps compose the way simple_monitor_13 extends simple_switch_13."""
import inspect
import threading

import pytest
from click.testing import CliRunner

from controllers.control_server import ControlServer
from controllers.protocol import BurstReply, BurstRequest, StatusReply, StatusRequest
from testbed.cli import main

pytestmark = pytest.mark.unit


def test_one_app_class_with_every_concern_and_every_handler():
    pytest.importorskip("os_ken")
    import controllers.fabric_app as mod
    from controllers.bursts_app import FabricBursts
    from controllers.compat import BaseApp
    from controllers.monitor_app import FabricMonitor
    from controllers.routing_app import FabricRouting

    # os-ken loads the first app class *defined* in the module: there must be exactly one
    apps = [c for _, c in inspect.getmembers(mod, inspect.isclass)
            if issubclass(c, BaseApp) and c.__module__ == mod.__name__]
    assert [c.__name__ for c in apps] == ["FabricController"]
    (app,) = apps
    assert issubclass(FabricBursts, FabricRouting) and issubclass(FabricMonitor, FabricRouting)
    assert app.__mro__[1:4] == (FabricMonitor, FabricBursts, FabricRouting)
    handlers = {n for n, m in inspect.getmembers(app, inspect.isfunction) if hasattr(m, "callers")}
    assert handlers == {"switch_features_handler", "barrier_reply_handler", "error_msg_handler",
                        "state_change_handler", "meter_stats_reply_handler", "port_stats_reply_handler"}


@pytest.fixture
def stub_controller(tmp_path):
    def burst(req: BurstRequest):
        if req.target == "mars":
            raise ValueError("unknown target 'mars'")
        return BurstReply(req.id or "m001", 2, 1, 3)

    path = str(tmp_path / "c.sock")
    srv = ControlServer(path, {StatusRequest: lambda r: StatusReply("stub", {}, 0, 0, True, 0, 1),
                               BurstRequest: burst}, threading.RLock())
    srv.bind()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield path
    srv.close()


def test_burst_command_prints_the_reply_and_exits_by_it(stub_controller):
    ok = CliRunner().invoke(main, ["burst", "--socket", stub_controller, "--p", "0.5"])
    assert ok.exit_code == 0 and '"id": "m001"' in ok.stdout
    refused = CliRunner().invoke(main, ["burst", "--socket", stub_controller, "--target", "mars"])
    assert refused.exit_code == 1 and "mars" in refused.stdout
    assert len(refused.stderr.strip().splitlines()) == 1 and "refused" in refused.stderr
    status = CliRunner().invoke(main, ["burst", "--socket", stub_controller, "--status"])
    assert status.exit_code == 0 and '"ready": true' in status.stdout


@pytest.mark.parametrize("args,why", [
    (["--p", "1.5"], "params.p"),
    (["--kind", "police", "--p", "0.5"], "params.p"),          # police has no p
    (["--duration-ms", "0"], "duration_ms"),
])
def test_burst_command_refuses_a_bad_burst_before_sending(stub_controller, args, why):
    res = CliRunner().invoke(main, ["burst", "--socket", stub_controller, *args])
    assert res.exit_code == 2 and why in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_burst_command_without_a_controller_is_one_line_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["burst", "--socket", str(tmp_path / "none.sock")])
    assert res.exit_code == 2 and "cannot reach the controller" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.output
