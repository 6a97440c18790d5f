"""The cluster edition's lesser doors (issue 60): ssh options, shells the agent adopts, Docker's socket."""
import os
import stat
import subprocess

import pytest

from testbed.emulation import cleanup
from testbed.emulation.cluster import SshOptionError, check_ssh_options, machines, parse_server
from testbed.emulation.cluster import agent as agent_mod
from testbed.emulation.cluster.fabric import ClusterFabric
from testbed.emulation.cluster.nodes import SshPlan
from testbed.emulation.cluster.preflight import preflight
from topologies import FatTreeTopo

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("options", [
    [], ["-i", "/root/.ssh/lab"], ["-i/root/.ssh/lab"], ["-o", "UserKnownHostsFile=/tmp/kh"],
    ["-oStrictHostKeyChecking=yes", "-o", "ServerAliveInterval 5"], ["-4", "-C", "-q"],
    ["-c", "aes128-gcm@openssh.com", "-m", "hmac-sha2-256"], ["-o", "identityfile=/k"],
])
def test_the_ssh_options_a_lab_needs_pass(options):
    check_ssh_options(options)
    assert parse_server("root@lab2").ssh_argv(2, options)[-2:] == ["--", "root@lab2"]


@pytest.mark.parametrize("options,named", [
    (["-oProxyCommand=sh -c 'id >/tmp/x'"], "-oProxyCommand"),
    (["-o", "ProxyCommand nc %h %p"], "-oProxyCommand nc %h %p"),
    (["-o", "proxyjump=evil"], "-oproxyjump=evil"),
    (["-o", "LocalCommand=id", "-o", "PermitLocalCommand=yes"], "-oLocalCommand=id"),
    (["-o", "KnownHostsCommand=/bin/id"], "-oKnownHostsCommand"),
    (["-o", "ControlPath=/tmp/%C"], "-oControlPath"),
    (["-F", "/tmp/evil_config"], "-F"),
    (["-J", "jump"], "-J"),
    (["-L", "8080:localhost:80"], "-L"),
    (["-A"], "-A"),
    (["-i"], "-i"),
    (["-4C"], "-4C"),
])
def test_an_ssh_option_that_runs_or_forwards_is_refused_in_one_line_naming_it(options, named):
    with pytest.raises(SshOptionError) as err:
        check_ssh_options(options)
    msg = str(err.value)
    assert named in msg and "\n" not in msg
    with pytest.raises(SshOptionError):
        parse_server("root@lab2").ssh_argv(2, options)
    with pytest.raises(SshOptionError):
        ClusterFabric(FatTreeTopo(4), run_dir="/tmp/none", servers=["local", "root@lab2"],
                      ssh_options=options)
    with pytest.raises(SshOptionError):
        preflight(["local", "root@lab2"], project_dir="/tmp/none", ssh_options=options)


def test_the_fabrics_own_multiplexing_options_are_not_the_specs_to_give():
    plan = SshPlan({"lab2": parse_server("root@lab2")}, ("-i", "/k"), "/run/x", 5)
    argv = plan.argv("lab2", tty=True)
    assert "ControlMaster=auto" in argv and "-tt" in argv and argv[-2:] == ["--", "root@lab2"]


def test_the_node_classes_are_module_level_and_need_the_fabrics_ssh():
    """`node_classes` picks the module's own classes (made once, not per call) on the cluster
    edition's; a node without the fabric's SshPlan is refused before any shell starts."""
    cluster = pytest.importorskip("mininet.examples.cluster")
    from testbed.emulation.cluster import remote

    classes = remote.node_classes()
    assert classes == remote.node_classes() == (remote.ClusterHost, remote.ClusterSwitch,
                                                remote.VxlanLink)
    assert "<locals>" not in classes.host.__qualname__
    assert issubclass(classes.host, cluster.RemoteHost)
    assert issubclass(classes.switch, cluster.RemoteOVSSwitch)
    assert issubclass(classes.link, cluster.RemoteLink)
    with pytest.raises(TypeError, match="SshPlan"):
        classes.host("h000")


def test_the_agent_adopts_only_its_fabrics_nodes_started_over_its_own_connection(monkeypatch):
    me = 100
    procs = {  # pid -> (parent, command line)
        me: (50, "/opt/p/.venv/bin/python -m testbed.emulation.cluster.agent"),
        50: (40, "sshd: root@notty,pts/1"),       # the fabric's multiplexed connection
        60: (40, "sshd: alice@pts/2"),            # someone else's
        40: (1, "sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups"),
        200: (50, "bash --norc --noediting -is mininet:h000"),
        201: (60, "bash --norc --noediting -is mininet:h000"),   # same name, another connection
        202: (50, "bash --norc --noediting -is mininet:h999"),   # not a node of ours here
        203: (1, "bash --norc --noediting -is mininet:s1000"),   # no ssh above it
        204: (50, "bash --norc --noediting -is mininet:s1000"),
    }
    monkeypatch.setattr(os, "getpid", lambda: me)
    monkeypatch.setattr(cleanup, "all_processes", lambda: [(p, cl) for p, (_, cl) in procs.items()])
    monkeypatch.setattr(cleanup, "parent", lambda pid: procs.get(pid, (0, ""))[0])
    monkeypatch.setattr(cleanup, "cmdline", lambda pid: procs.get(pid, (0, ""))[1])
    state = {"bridges": ["s1000"], "hosts": ["h000", "h001"]}
    assert sorted(agent_mod._shells(state)) == [(200, "mininet:h000"), (204, "mininet:s1000")]
    procs[me] = (1, procs[me][1])  # an agent not under ssh adopts nothing
    assert agent_mod._shells(state) == []


def test_the_rehearsals_docker_socket_is_roots_alone(tmp_path, monkeypatch):
    run = tmp_path / "docker-run"
    run.mkdir(mode=0o755)
    monkeypatch.setattr(machines, "DOCKER_RUN", str(run))
    monkeypatch.setattr(machines, "DOCKER_ROOT", str(tmp_path / "docker-root"))
    monkeypatch.setattr(machines, "DOCKER_SOCKET", str(run / "docker.sock"))
    monkeypatch.setattr(machines.shutil, "which", lambda name: "/usr/bin/" + name)
    started = []

    class Daemon:
        def __init__(self, argv, **kw):
            started.append(argv)

        def poll(self):
            return None

    ups = iter([False, True])
    monkeypatch.setattr(subprocess, "Popen", Daemon)
    docker = machines.Docker(log=lambda msg: None)
    monkeypatch.setattr(docker, "up", lambda: next(ups))
    docker.start()
    (argv,) = started
    assert argv[argv.index("--group") + 1] == "root"
    assert stat.S_IMODE(os.stat(run).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "docker-root").st_mode) == 0o700
