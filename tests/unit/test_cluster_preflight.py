"""The preflight refuses a bad server in seconds, with one line naming it and why.

The servers here are real: a closed port on this machine (ssh: connection
refused), a port that accepts but never speaks (ssh: its handshake times
out), and the probe script run for real on folders that are and are not a
project set-up. No address beyond this machine's loopback is contacted: the
unreachable pair is the broadcast address, which ping refuses before it
sends anything (the refusal takes the same path as a silent peer).
"""
import os
import pathlib
import socket
import subprocess
import threading
import time

import pytest

from testbed.emulation.cluster import ClusterError, parse_server, preflight
from testbed.emulation.cluster.preflight import (
    check_pair,
    judge,
    local_revision,
    parse_probe,
    probe_argv,
    probe_words,
)

pytestmark = pytest.mark.unit


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _remote_problems(servers, timeout=2.0):
    """The preflight's problems with the servers after "local" (this machine's OVS may be off)."""
    try:
        preflight(["local", *servers], connect_timeout_s=timeout)
    except ClusterError as exc:
        return [p for p in exc.problems if p.server != "local"], str(exc)
    return [], ""


@pytest.fixture
def silent_port():
    """A TCP port on loopback that accepts connections and never says a word."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def test_a_closed_port_is_unreachable_within_seconds():
    port = _closed_port()
    t0 = time.monotonic()
    problems, line = _remote_problems([f"root@127.0.0.1:{port}"])
    took = time.monotonic() - t0
    assert took < 5, took
    [p] = problems
    assert p.server == f"root@127.0.0.1:{port}" and p.why.startswith("unreachable")
    assert "Connection refused" in p.why
    assert "\n" not in line and f"cluster server 'root@127.0.0.1:{port}': unreachable" in line


def test_a_server_that_never_answers_is_refused_after_the_connect_timeout(silent_port):
    t0 = time.monotonic()
    problems, line = _remote_problems([f"root@127.0.0.1:{silent_port}"], timeout=2.0)
    took = time.monotonic() - t0
    assert 1.5 < took < 8, took
    [p] = problems
    assert p.why.startswith("unreachable") and "timed out" in p.why, p.why


def test_every_bad_server_is_named_in_one_line_and_checked_at_the_same_time(silent_port):
    closed = _closed_port()
    names = [f"root@127.0.0.1:{closed}", f"root@127.0.0.1:{silent_port}"]
    t0 = time.monotonic()
    problems, line = _remote_problems(names, timeout=2.0)
    assert time.monotonic() - t0 < 8  # one timeout, not one per server
    assert [p.server for p in problems] == names
    assert "\n" not in line and all(f"'{n}'" in line for n in names)


def _project(tmp_path: pathlib.Path, stamp=True) -> pathlib.Path:
    """A folder that ./setup.sh finished in: a git checkout with its venv's script and stamp."""
    d = tmp_path / "project"
    (d / ".venv" / "bin").mkdir(parents=True)
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "init", "-q", str(d)], check=True)
    subprocess.run(["git", "-C", str(d), "commit", "-q", "--allow-empty", "-m", "x"], check=True, env=env)
    script = d / ".venv" / "bin" / "dblp-testbed"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    if stamp:
        (d / ".venv" / ".dblp-setup-stamp").write_text("x\n")
    return d


def _probe(directory) -> dict:
    """The probe script exactly as ssh would run it on a server, run here instead."""
    out = subprocess.run(probe_words(str(directory)), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return parse_probe(out.stdout)


def test_the_probe_finds_a_project_set_up_and_its_revision(tmp_path):
    d = _project(tmp_path)
    facts = _probe(d)
    assert facts["root"] == "yes" and facts["setup"] == "yes"
    assert facts["revision"] == local_revision(d) and len(facts["revision"]) == 40
    assert facts["ovs"] in ("yes", "no")
    lab = parse_server("root@lab2")
    problem = judge(lab, facts, local_revision(d), str(d))
    assert problem is None if facts["ovs"] == "yes" else problem.why == "OVS not running"


def test_the_probe_finds_no_set_up_in_an_empty_folder(tmp_path):
    facts = _probe(tmp_path)
    assert facts["setup"] == "no" and facts["revision"] == ""
    problem = judge(parse_server("root@lab2"), facts, "a" * 40, str(tmp_path))
    assert problem.line() == (f"cluster server 'root@lab2': no project set-up in {tmp_path} "
                              f"(check out the project at {tmp_path} there and run ./setup.sh)")


def test_an_unfinished_set_up_is_no_set_up(tmp_path):
    assert _probe(_project(tmp_path, stamp=False))["setup"] == "no"


def test_another_revision_is_another_version(tmp_path):
    d = _project(tmp_path)
    problem = judge(parse_server("lab2"), _probe(d), "f" * 40, str(d))
    assert problem.why.startswith("other version") and "ffffffffffff here" in problem.why


def test_too_few_ssh_sessions_for_the_nodes_placed_there_is_named_with_the_fix(tmp_path):
    """sshd's default MaxSessions (10) cannot carry a pod's shells over one connection."""
    facts = dict(_probe(_project(tmp_path)), ovs="yes", maxsessions="10")
    problem = judge(parse_server("root@lab2"), facts, facts["revision"], str(tmp_path), sessions=42)
    assert problem.line() == ("cluster server 'root@lab2': sshd allows 10 sessions per connection, the "
                              "fabric needs 42 (set MaxSessions 100 in /etc/ssh/sshd_config there and "
                              "reload sshd)")
    assert judge(parse_server("root@lab2"), dict(facts, maxsessions="200"), facts["revision"],
                 str(tmp_path), sessions=42) is None


def test_the_probe_reaches_the_server_as_quoted_words():
    """What ssh sends the remote shell is the probe and the folder, each one quoted word."""
    argv = probe_argv(parse_server("root@lab2"), "/srv/dblp testbed", 2)
    assert argv[-3:-1] == ["--", "root@lab2"]
    import shlex
    assert shlex.split(argv[-1]) == probe_words("/srv/dblp testbed")
    assert probe_words("/srv/dblp testbed")[4] == "/srv/dblp testbed"


@pytest.fixture
def loopback_sshd(tmp_path):
    """A real sshd on 127.0.0.1 (a free high port), from a config in tmp_path; stopped by its PID.

    It admits this user with a key made here and nothing else. Yields ssh's
    options for it (the key, a known-hosts file of its own) and its name.
    """
    import getpass
    import shutil
    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
    if sshd is None:
        pytest.skip("sshd is not installed: ./setup.sh cluster installs it")
    keys = tmp_path / "ssh"
    keys.mkdir()
    for name in ("host_key", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    (keys / "authorized_keys").write_text((keys / "id.pub").read_text())
    port = _closed_port()
    config = keys / "sshd_config"
    config.write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys}/host_key\n"
                      f"PidFile {keys}/sshd.pid\nAuthorizedKeysFile {keys}/authorized_keys\n"
                      "StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                      "UsePAM no\nPermitRootLogin prohibit-password\n")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # its privilege-separation folder
    with open(keys / "sshd.log", "w") as log:
        proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                                stderr=log)
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, (keys / "sshd.log").read_text()
            assert time.monotonic() < deadline, "sshd did not listen within 10 s"
            time.sleep(0.1)
        yield (f"{getpass.getuser()}@127.0.0.1:{port}",
               ["-i", str(keys / "id"), "-o", f"UserKnownHostsFile={keys}/known_hosts"])
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_reachable_server_without_the_project_is_refused_naming_it(loopback_sshd, tmp_path):
    name, options = loopback_sshd
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    t0 = time.monotonic()
    with pytest.raises(ClusterError) as err:
        preflight(["local", name], project_dir=str(empty), connect_timeout_s=2, ssh_options=options)
    assert time.monotonic() - t0 < 10
    problems = [p for p in err.value.problems if p.server != "local"]
    assert [(p.server, p.why) for p in problems] == [(name, f"no project set-up in {empty}")]


def test_a_ready_server_passes_and_so_does_the_pair(loopback_sshd, tmp_path):
    """Set up, same revision, OVS running (this machine's), and both ways reachable: no error."""
    from testbed.emulation.capabilities import ovs_running
    if not ovs_running():
        pytest.skip("Open vSwitch is not running here (./setup.sh starts it)")
    name, options = loopback_sshd
    servers = preflight(["local", name], project_dir=str(_project(tmp_path)), connect_timeout_s=2,
                        ssh_options=options)
    assert [s.name for s in servers] == ["local", name]


def test_setup_sh_knows_the_cluster_group():
    """`./setup.sh cluster` is an optional group; an unknown one lists it and installs nothing."""
    root = pathlib.Path(__file__).resolve().parents[2]
    out = subprocess.run(["bash", str(root / "setup.sh"), "no-such-group"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2
    assert "unknown group 'no-such-group'" in out.stderr and "cluster" in out.stderr.split("known:")[1]


def test_a_pair_is_checked_with_a_real_ping():
    """This machine reaches a server at its loopback address; a pair ping cannot reach is named."""
    assert check_pair(parse_server("local"), parse_server("root@127.0.0.1")) is None
    t0 = time.monotonic()
    problem = check_pair(parse_server("local"), parse_server("root@255.255.255.255"))
    assert time.monotonic() - t0 < 5
    assert problem is not None and problem.server == "local" and problem.peer == "root@255.255.255.255"
    assert problem.why.startswith("cannot reach 255.255.255.255")
