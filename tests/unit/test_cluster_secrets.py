"""The cluster edition never puts a command's environment (the job's secret) in an argv.

Every command line the cluster code builds for another server (a host's
worker, the agent, the controller's nft and cross-traffic agents) is
inspected with the secret in the caller's environment; the variables travel
to the agent over its ssh session's stdin instead, into a 0600 file the
command sources and removes.
"""
import io
import json
import os
import stat
import subprocess

import pytest

from testbed.config.servers import LOCAL, parse_server
from testbed.emulation import cleanup
from testbed.emulation.cluster import agent as agent_mod
from testbed.emulation.cluster.agent import ENV_WRAPPER, Agent, env_file_text
from testbed.emulation.cluster.fabric import HERE, ClusterFabric, RemoteAgent
from testbed.emulation.cluster.nodes import SshPlan
from testbed.emulation.fabric import HostHandle
from topologies import FatTreeTopo

pytestmark = pytest.mark.unit

SECRET = "5ec7e7" * 10 + "f00d"
REMOTE = "root@lab2"


class FakeAgent:
    """The remote agent's replies, and every request it was sent (what crossed its stdin)."""

    def __init__(self):
        self.requests = []

    def call(self, req, timeout_s=60):
        self.requests.append(req)
        if req["op"] == "envfile":
            return {"ok": True, "path": "/run/dblp-testbed/env-fab/env-x1"}
        if req["op"] == "run":
            return {"ok": True, "rc": 0, "out": "10.250.0.1 dev eth0 src 10.250.0.2 uid 0", "err": ""}
        return {"ok": True}

    request = call


@pytest.fixture
def fabric(tmp_path):
    fab = ClusterFabric(FatTreeTopo(4), run_dir=str(tmp_path / "run"), servers=[LOCAL, REMOTE],
                        ssh_options=["-i", "/root/.ssh/lab"])
    fab.ssh = SshPlan({HERE: parse_server(LOCAL), REMOTE: parse_server(REMOTE)}, tuple(fab.ssh_options),
                      str(tmp_path / "ssh"), 5)
    fab.agents = {REMOTE: FakeAgent()}
    fab.endpoints = {HERE: "10.250.0.1", REMOTE: "10.250.0.2"}
    fab.of_host = "10.250.0.1"
    for i, h in enumerate(fab.topo.hosts()):
        info = fab.topo.host_info[h]
        fab._hosts[h] = HostHandle(h, info.ip, info.mac, fab.topo.host_intf(h), 1000 + i)
    return fab


def _remote_host(fab):
    return next(h for h in fab.topo.hosts() if fab.placement[h] == REMOTE)


def _argvs_hold_secret(argvs) -> list:
    return [a for a in argvs if any(SECRET in str(w) for w in a)]


def test_a_remote_hosts_command_carries_its_environment_over_the_agent_not_the_argv(fabric, monkeypatch,
                                                                                     tmp_path):
    seen = []

    class Recorder:
        def __init__(self, argv, **kw):
            seen.append(list(argv))
            self.pid = 4242

    monkeypatch.setattr(subprocess, "Popen", Recorder)
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: seen.append(list(argv))
                        or subprocess.CompletedProcess(argv, 0, "", ""))
    env = dict(os.environ, DBLP_SECRET=SECRET, RANK="1")
    host = _remote_host(fabric)
    fabric.popen(host, ["python", "-m", "workloads.worker"], env=env, cwd="/tmp")
    fabric.run(host, ["python", "-c", "pass"], env=env)
    assert len(seen) == 2 and not _argvs_hold_secret(seen)
    assert all(a[0] == "ssh" for a in seen)
    sent = [r for r in fabric.agents[REMOTE].requests if r["op"] == "envfile"]
    assert [r["env"] for r in sent] == [{"DBLP_SECRET": SECRET, "RANK": "1"}] * 2
    assert ENV_WRAPPER in seen[0][-1] and "/run/dblp-testbed/env-fab/env-x1" in seen[0][-1]
    # a command whose environment is this process's own needs no file
    fabric.run(host, ["true"], env=dict(os.environ))
    assert len([r for r in fabric.agents[REMOTE].requests if r["op"] == "envfile"]) == 2


def test_no_other_argv_the_cluster_builds_holds_the_secret(fabric, monkeypatch):
    monkeypatch.setenv("DBLP_SECRET", SECRET)  # even with it in the harness's own environment
    built = []

    class Proc:
        def __init__(self, argv, **kw):
            built.append(list(argv))
            self.stdout = io.StringIO(json.dumps(agent_mod.READY) + "\n")
            self.stdin = io.StringIO()
            self.stderr = io.StringIO()

        def poll(self):
            return None

    monkeypatch.setattr(subprocess, "Popen", Proc)
    RemoteAgent(fabric.ssh.servers[REMOTE], fabric.ssh, REMOTE, fabric.project_dir)
    extra = fabric._controller_extra()
    built += list(extra["remote"]["servers"].values()) + list(extra["remote"]["cross_agents"].values())
    built += [fabric.host_argv(h, ["sleep", "1"]) for h in fabric.topo.hosts()]
    assert len(built) > 3 and not _argvs_hold_secret(built)
    assert extra["of_peer_addrs"] == ["10.250.0.2"]


@pytest.mark.parametrize("value", [SECRET, "it's \"quoted\" $HOME `id` \\ and\nlines", ""])
def test_the_env_file_is_root_only_and_sourced_back_exactly_then_removed(tmp_path, monkeypatch, value):
    monkeypatch.setattr(cleanup, "STATE_DIR", str(tmp_path / "state"))
    agent = Agent()
    agent.state = {"id": "fabric-test"}
    path = agent.envfile({"env": {"DBLP_SECRET": value, "RANK": "3"}})["path"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    out = subprocess.run(["sh", "-c", ENV_WRAPPER, path, "sh", "-c", 'printf "%s|%s" "$DBLP_SECRET" "$RANK"'],
                         capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0 and out.stdout == f"{value}|3"
    assert not os.path.exists(path)
    # the folder (with any file no command took) goes when the agent stops
    left = agent.envfile({"env": {"DBLP_SECRET": value}})["path"]
    monkeypatch.setattr(cleanup, "clean", lambda only_state: {"files": []})
    monkeypatch.setattr(cleanup, "release_machine", lambda lock: None)
    monkeypatch.setattr(agent_mod, "_shells", lambda state: [])
    monkeypatch.setattr(agent_mod, "_kill_in_hosts", lambda shells: None)
    agent.state.setdefault("processes", [])
    agent.stop()
    assert not os.path.exists(os.path.dirname(left))


@pytest.mark.parametrize("env", [{"BAD NAME": "x"}, {"1X": "x"}, {"A;rm": "x"}, {"OK": 3}])
def test_the_env_file_refuses_what_a_shell_would_not_read_back(env):
    with pytest.raises(ValueError, match="envfile"):
        env_file_text(env)
