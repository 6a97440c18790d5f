"""More machines on this one: containers that stand in for a lab's servers (the rehearsal).

Why containers: a fabric across machines has to be tried before anyone owns
two, and this machine reaches no other. A container here is a machine in
every way the fabric cares about: its own network stack (so its own Open
vSwitch, bridges, tunnel ends and Mininet namespaces), its own process
table, its own sshd and its own ``/run`` (so its own state files and
machine lock), set up by the very ``./setup.sh`` a lab machine runs.

What is built, and why so:

- **A project-owned Docker daemon** (``dockerd`` from Debian's ``docker.io``,
  ``./setup.sh rehearsal``), with its own data root, socket and pid file
  under ``/var/lib/dblp-testbed`` and ``/run/dblp-testbed``: a machine's own
  Docker (if it has one) is never touched, and the daemon adds no firewall
  rules or bridges (``--iptables=false --bridge=none``).
- **The image** is made from Debian's packages, since no image registry is
  reachable: ``debootstrap`` (minbase, plus git, which the preflight asks for
  the revision, and ca-certificates), ``docker import``, then this checkout
  copied in at the same path (`copy_tree`: its files and ``.git``, not its
  virtual environment or built core), ``./setup.sh cluster`` run there as on
  any lab machine (its own venv, its own C core, with Debian's Python), and
  ``docker commit``. Its tag is a digest of what made it (the debootstrap
  arguments, what ``setup.sh``'s own stamp covers, and the checkout's path),
  so a change to any builds a new one and an unchanged one is reused (the
  first build takes a few minutes: torch is downloaded). A new one starts
  from the last image of the same checkout, as a lab machine updates: the
  tree is replaced, and ``./setup.sh cluster`` finds its venv and reinstalls
  only what changed (a change to the C core: two machines were up in 8 s
  instead of 90), unless that image already stacks `MAX_LAYERS`
  layers, when it starts from Debian's root file system again.
- **The machines**: one container each, with the privileges Mininet needs (Mininet makes
  namespaces, OVS opens packet sockets), with no network of Docker's: a veth
  from each into a Linux bridge here, ``UNDERLAY`` (this machine ``.1``,
  machine *i* ``.(i+1)``), MTU 9000 so that the VXLAN tunnels' 50 bytes fit
  under the fabric's 1500. In each: this checkout copied in again (so the
  machine is at this revision, uncommitted edits included, as a lab machine
  is after ``git checkout``), ``./setup.sh cluster`` (starts its OVS), then an
  sshd that takes only the rehearsal's key.

Names: the bridge ``dblpmach0``, the veths ``dblpmach<i>``, the containers
``dtmach-<tag>-<i>``; none matches a switch or a switch port, so
``dblp-testbed clean`` on this machine leaves a running rehearsal alone.
`Machines.stop` removes the containers, the veths and the bridge, and stops
the daemon it started; the image stays (the next rehearsal reuses it).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence

from testbed import REPO_ROOT
from testbed.errors import MachineError

#: Where the project's Docker keeps images and containers, and its socket and pid file.
DOCKER_ROOT = "/var/lib/dblp-testbed/docker"
DOCKER_RUN = "/run/dblp-testbed/docker"
DOCKER_SOCKET = f"{DOCKER_RUN}/docker.sock"
#: The rehearsal's ssh key and the host keys its machines showed (fresh per rehearsal).
SSH_DIR = "/run/dblp-testbed/rehearsal"
IMAGE = "dblp-testbed-machine"
#: The image's label naming the checkout it was made for (older images of it are removed).
CHECKOUT_LABEL = "org.dblp-testbed.checkout"
#: An image is made on top of the checkout's last one while that one has fewer layers
#: than this (each update adds one), else from Debian's root file system again.
MAX_LAYERS = 12
#: Sessions one ssh connection may carry: a node's shell is one (docs/cluster.md).
SSH_MAX_SESSIONS = 200
#: What a machine may do: everything Mininet and OVS need (namespaces, packet
#: sockets, tun, sysctls), spelled out rather than ``--privileged``, which asks
#: for every capability and fails where this machine is itself a container
#: without some (``CAP_SYS_RESOURCE`` here).
PRIVILEGES = ("--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE", "--security-opt", "seccomp=unconfined",
              "--security-opt", "apparmor=unconfined", "--security-opt", "systempaths=unconfined",
              "--device", "/dev/net/tun")
#: The machines' network: this machine is .1, machine i is .(i + 1).
UNDERLAY_PREFIX = "10.250.0"
UNDERLAY_MTU = 9000
BRIDGE = "dblpmach0"
#: Debian release and mirror the image is made from (this machine's own release).
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
DEBOOTSTRAP_ARGS = ("--variant=minbase", "--include=git,ca-certificates,iproute2,procps")

Log = Callable[[str], None]


def _run(argv: Sequence[str], timeout: float = 120, check: bool = True,
         **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    try:
        p = subprocess.run(list(argv), timeout=timeout, **kw)
    except FileNotFoundError:
        raise MachineError(f"{argv[0]} is not installed: run ./setup.sh rehearsal") from None
    except subprocess.TimeoutExpired:
        raise MachineError(f"{' '.join(argv[:4])} took more than {timeout:g} s") from None
    if check and p.returncode:
        err = [x for x in (p.stderr or p.stdout or "").strip().splitlines()
               if x.strip() and not x.startswith("Run 'docker")]
        raise MachineError(f"{' '.join(argv[:4])} failed: {err[-1] if err else p.returncode}")
    return p


class Docker:
    """The project's own Docker daemon: started on demand, stopped by whoever started it."""

    def __init__(self, log: Log = print):
        self.log = log
        self.proc: subprocess.Popen | None = None

    def argv(self, *args: str) -> list[str]:
        return ["docker", "-H", f"unix://{DOCKER_SOCKET}", *args]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True,
                 **kw) -> subprocess.CompletedProcess:
        return _run(self.argv(*args), timeout=timeout, check=check, **kw)

    def up(self) -> bool:
        try:
            return self("version", "--format", "{{.Server.Version}}", timeout=10, check=False).returncode == 0
        except MachineError:
            return False

    def start(self, timeout_s: float = 60) -> None:
        """The daemon up, its socket root's alone.

        Why: whoever reaches a Docker socket is root on the machine (a
        container with the host's root mounted). dockerd gives its socket to
        the ``docker`` group by default; here the socket's group is root's
        (``--group root``) and its folder is 0700, which also closes a daemon
        an older checkout started with the default.
        """
        os.makedirs(DOCKER_RUN, mode=0o700, exist_ok=True)
        os.chmod(DOCKER_RUN, 0o700)
        if self.up():
            return
        if shutil.which("dockerd") is None:
            raise MachineError("dockerd is not installed: run ./setup.sh rehearsal")
        os.makedirs(DOCKER_ROOT, mode=0o700, exist_ok=True)
        self.log("starting the project's Docker daemon")
        log = open(os.path.join(DOCKER_RUN, "dockerd.log"), "ab")
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", DOCKER_ROOT, "--exec-root", f"{DOCKER_RUN}/exec",
             "-H", f"unix://{DOCKER_SOCKET}", "--group", "root", "--pidfile", f"{DOCKER_RUN}/dockerd.pid",
             "--iptables=false", "--ip6tables=false", "--bridge=none"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while not self.up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise MachineError(f"the project's Docker daemon did not start; see {DOCKER_RUN}/dockerd.log")
            time.sleep(0.3)

    def stop(self) -> None:
        """Stop the daemon if this object started it."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def has_image(self, tag: str) -> bool:
        return self("image", "inspect", tag, check=False, timeout=30).returncode == 0


#: What ``setup.sh``'s stamp covers (a change rebuilds the venv, so the image too).
SETUP_INPUTS = ("setup.sh", "pyproject.toml", "setup.py", "dblp/_fastpath.c", "constraints.txt")


def image_tag(repo: str = str(REPO_ROOT)) -> str:
    """The image's tag: a digest of what makes it (the set-up's inputs, the debootstrap arguments,
    and the checkout's path, where the image's venv lives: a checkout elsewhere needs its own)."""
    h = hashlib.sha256(os.path.realpath(repo).encode())
    for name in SETUP_INPUTS:
        with open(os.path.join(repo, name), "rb") as f:
            h.update(f.read())
    h.update(" ".join((SUITE, MIRROR, *DEBOOTSTRAP_ARGS)).encode())
    return f"{IMAGE}:{h.hexdigest()[:12]}"


def build_image(docker: Docker, repo: str = str(REPO_ROOT), log: Log = print) -> str:
    """The machines' image (made if missing): ``./setup.sh cluster`` run in this checkout's
    last image (`previous_image`), or in Debian from debootstrap where there is none."""
    tag = image_tag(repo)
    if docker.has_image(tag):
        return tag
    label = f"{CHECKOUT_LABEL}={os.path.realpath(repo)}"
    parent = previous_image(docker, label)
    if parent is None:
        parent = _base_image(docker, log)
        log("setting the image up with ./setup.sh cluster (first time: a few minutes)")
    else:
        log(f"updating the image {parent} with ./setup.sh cluster")
    name = f"dtmach-build-{uuid.uuid4().hex[:6]}"
    try:
        # The host's network only while packages are fetched; machines get none of Docker's.
        run_opts, env_opts = network_settings()
        docker("run", "-d", "--name", name, *PRIVILEGES, "--network", "host", *run_opts, parent,
               "sleep", "infinity", timeout=300)
        trust_local_cas(docker, name)
        # The last image's tree goes (files this checkout no longer has would stay), its
        # venv stays: setup.sh reinstalls what its stamp says changed.
        docker("exec", name, "sh", "-c", f"mkdir -p '{repo}' && find '{repo}' -mindepth 1 "
               "-maxdepth 1 ! -name .venv -exec rm -rf {} +", timeout=120)
        copy_tree(docker, name, repo)
        setup = docker("exec", "-w", repo, "-e", "PYTHON=/usr/bin/python3", *env_opts, name,
                       "./setup.sh", "cluster", timeout=3600, check=False)
        if setup.returncode:
            tail = (setup.stderr or setup.stdout).strip().splitlines()[-3:]
            raise MachineError("./setup.sh cluster failed in the image: " + " | ".join(tail))
        docker("commit", "--change", f"LABEL {label}", name, tag, timeout=600)
    finally:
        docker("rm", "-f", name, check=False, timeout=60)
    # An image of this checkout made from older inputs is never used again: its tag goes
    # (its layers stay while the new one stands on them; another checkout's image stays:
    # it is that checkout's current one).
    for old in _images(docker, label):
        if old != tag:
            docker("rmi", old, check=False, timeout=120)
    return tag


def _images(docker: Docker, label: str) -> list[str]:
    """This machine's images with ``label``, newest first."""
    return docker("images", "--filter", f"label={label}", "--format", "{{.Repository}}:{{.Tag}}",
                  IMAGE, check=False).stdout.split()


def previous_image(docker: Docker, label: str) -> str | None:
    """The newest image of the checkout ``label`` names that has room for another layer."""
    for name in _images(docker, label):
        layers = docker("image", "inspect", "-f", "{{len .RootFS.Layers}}", name,
                        check=False, timeout=30).stdout.strip()
        if layers.isdigit() and int(layers) < MAX_LAYERS:
            return name
    return None


def _base_image(docker: Docker, log: Log) -> str:
    """Debian's root file system (debootstrap) as an image, made if missing."""
    recipe = " ".join((SUITE, MIRROR, *DEBOOTSTRAP_ARGS)).encode()
    base = f"{IMAGE}-base:{hashlib.sha256(recipe).hexdigest()[:12]}"
    if not docker.has_image(base):
        log(f"making a Debian {SUITE} root file system (debootstrap, about a minute)")
        with tempfile.TemporaryDirectory(dir=os.path.dirname(DOCKER_ROOT)) as tmp:
            root = os.path.join(tmp, "root")
            _run(["debootstrap", *DEBOOTSTRAP_ARGS, SUITE, root, MIRROR], timeout=1200)
            tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
            _run(docker.argv("import", "-", base), stdin=tar.stdout, timeout=600)
            tar.wait()
    return base


#: This machine's network settings a machine made here needs to fetch what
#: ``setup.sh`` installs: extra CA certificates (a proxy's), pip's
#: configuration, and the environment variables that point at them.
CA_DIR = "/usr/local/share/ca-certificates"
PIP_CONFIGS = ("/etc/pip.conf", "/etc/xdg/pip", "~/.config/pip", "~/.pip")
NETWORK_ENV = ("PIP_CERT", "PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_DEFAULT_TIMEOUT",
               "PIP_DISABLE_PIP_VERSION_CHECK", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "http_proxy",
               "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


def network_settings() -> tuple[list[str], list[str]]:
    """(docker run options, docker exec options) that give a build container this machine's
    network settings: its pip configuration (files, or their folders where they name
    files beside them), the local directories they name, all read-only, and the
    environment variables above."""
    run: list[str] = []
    dirs: list[str] = []
    for conf in PIP_CONFIGS:
        conf = os.path.expanduser(conf)
        if not os.path.exists(conf):
            continue
        run += ["-v", f"{conf}:{conf}:ro"]
        texts = [os.path.join(conf, n) for n in os.listdir(conf) if n.endswith(".conf")] \
            if os.path.isdir(conf) else [conf]
        for path in texts:
            with open(path) as f:
                dirs += [w.removeprefix("file://") for w in f.read().replace("=", " ").split()]
    dirs += os.environ.get("PIP_FIND_LINKS", "").split()
    # A "simple" index links its files as ../files/...: its parent goes along.
    dirs = [os.path.dirname(d.rstrip("/")) if d.rstrip("/").endswith("/simple") else d for d in dirs]
    for path in dict.fromkeys(dirs):
        if path.startswith("/") and os.path.isdir(path):
            run += ["-v", f"{path}:{path}:ro"]
    env = [opt for name in NETWORK_ENV if name in os.environ for opt in ("-e", name)]
    return run, env


def trust_local_cas(docker: Docker, container: str) -> None:
    """This machine's extra CA certificates, trusted in ``container`` too."""
    if not os.path.isdir(CA_DIR) or not os.listdir(CA_DIR):
        return
    docker("exec", container, "mkdir", "-p", CA_DIR)
    docker("cp", f"{CA_DIR}/.", f"{container}:{CA_DIR}/")
    docker("exec", container, "update-ca-certificates", timeout=120)


def copy_tree(docker: Docker, container: str, repo: str) -> None:
    """This checkout's files (tracked and new, not ignored) and its ``.git`` into ``container``.

    The ignored ones stay behind: the virtual environment and the built C
    core are the machine's own, made by its ``./setup.sh``.
    """
    files = _run(["git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).stdout
    listing = "\0".join([".git", *[f for f in files.split("\0") if f and os.path.lexists(
        os.path.join(repo, f))]]) + "\0"
    docker("exec", container, "mkdir", "-p", repo)
    tar = subprocess.Popen(["tar", "-C", repo, "--null", "-T", "-", "-c"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE)
    assert tar.stdin is not None
    tar.stdin.write(listing.encode())
    tar.stdin.close()
    _run(docker.argv("exec", "-i", container, "tar", "-C", repo, "-x"), stdin=tar.stdout,
         timeout=300, capture_output=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tar.wait()


class Machines:
    """``n`` machines beside this one for the lifetime of a ``with`` block.

    ``servers``: their names for the spec (``root@10.250.0.2``, ...);
    ``ssh_options``: what ssh needs to reach them (the rehearsal's key and
    known-hosts file); ``containers``: their Docker names.
    """

    def __init__(self, n: int = 1, repo: str = str(REPO_ROOT), log: Log = print):
        if not isinstance(n, int) or not 1 <= n <= 8:
            raise ValueError(f"n must be 1..8 machines, got {n!r}")
        self.n, self.repo, self.log = n, repo, log
        self.tag = uuid.uuid4().hex[:6]
        self.docker = Docker(log)
        self.containers: list[str] = []
        self.addresses = [f"{UNDERLAY_PREFIX}.{i + 2}" for i in range(n)]
        self.servers = [f"root@{a}" for a in self.addresses]
        self.key = os.path.join(SSH_DIR, "id_ed25519")
        self.known_hosts = os.path.join(SSH_DIR, "known_hosts")
        self.ssh_options = ["-i", self.key, "-o", f"UserKnownHostsFile={self.known_hosts}"]
        self.start_s: float | None = None

    def __enter__(self) -> Machines:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def start(self) -> None:
        t0 = time.monotonic()
        self.docker.start()
        image = build_image(self.docker, self.repo, self.log)
        self._key()
        self._bridge()
        for i, address in enumerate(self.addresses):
            name = f"dtmach-{self.tag}-{i + 1}"
            self.docker("run", "-d", "--name", name, "--hostname", f"dtmach{i + 1}", *PRIVILEGES,
                        "--network", "none", image, "sleep", "infinity", timeout=300)
            self.containers.append(name)
            copy_tree(self.docker, name, self.repo)
            pid = self.docker("inspect", "-f", "{{.State.Pid}}", name).stdout.strip()
            veth = f"dblpmach{i + 1}"
            _run(["ip", "link", "add", veth, "mtu", str(UNDERLAY_MTU), "type", "veth", "peer",
                  "name", "eth0", "mtu", str(UNDERLAY_MTU), "netns", pid])
            _run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
            inside = ["nsenter", "-t", pid, "-n", "--"]
            _run([*inside, "ip", "addr", "add", f"{address}/24", "dev", "eth0"])
            _run([*inside, "ip", "link", "set", "eth0", "up"])
            _run([*inside, "ip", "link", "set", "lo", "up"])
            with open(self.key + ".pub") as f:
                pub = f.read().strip()
            self.docker("exec", "-w", self.repo, "-e", "PYTHON=/usr/bin/python3", name, "sh", "-c",
                        "./setup.sh cluster >/tmp/setup.log 2>&1 || { tail -3 /tmp/setup.log; exit 1; }; "
                        "mkdir -p /root/.ssh /run/sshd && chmod 700 /root/.ssh && "
                        f"printf '%s\\n' '{pub}' > /root/.ssh/authorized_keys && ssh-keygen -A >/dev/null && "
                        f"printf 'MaxSessions {SSH_MAX_SESSIONS}\\nPasswordAuthentication no\\n' "
                        "> /etc/ssh/sshd_config.d/dblp-testbed.conf && "
                        "/usr/sbin/sshd -o PermitRootLogin=prohibit-password",
                        timeout=600)
        self.start_s = time.monotonic() - t0
        self.log(f"{self.n} machine(s) up in {self.start_s:.0f} s: {', '.join(self.servers)}")

    def _key(self) -> None:
        os.makedirs(SSH_DIR, mode=0o700, exist_ok=True)
        if not os.path.exists(self.key):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dblp-testbed rehearsal",
                  "-f", self.key])
        # Each container makes new host keys: the last rehearsal's must not refuse them.
        with open(self.known_hosts, "w"):
            pass

    def _bridge(self) -> None:
        if _run(["ip", "link", "show", BRIDGE], check=False).returncode:
            _run(["ip", "link", "add", BRIDGE, "mtu", str(UNDERLAY_MTU), "type", "bridge"])
            _run(["ip", "addr", "add", f"{UNDERLAY_PREFIX}.1/24", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])

    def exec(self, i: int, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess:
        """Run ``argv`` on machine ``i`` (0-based) as root, outside ssh (what tests check there)."""
        return self.docker("exec", self.containers[i], *argv, timeout=timeout, check=False)

    def stop(self) -> None:
        for name in self.containers:
            self.docker("rm", "-f", name, check=False, timeout=120)
        self.containers = []
        for i in range(self.n):
            _run(["ip", "link", "del", f"dblpmach{i + 1}"], check=False)
        if _run(["ip", "link", "show", BRIDGE], check=False).returncode == 0 and not _bridge_ports():
            _run(["ip", "link", "del", BRIDGE], check=False)
        self.docker.stop()


def _bridge_ports() -> list[str]:
    out = _run(["ip", "-o", "link", "show", "master", BRIDGE], check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def prepare_image(repo: str = str(REPO_ROOT), log: Log = print) -> str:
    """The machines' image made ahead of time, the daemon stopped again if this started it.

    Why: a first image takes minutes, mostly waiting on the network and the
    disk (debootstrap, torch's download), so ``make test`` makes it while the
    unit tests use the CPU, and the rehearsal's tests find it ready.
    """
    docker = Docker(log)
    docker.start()
    try:
        t0 = time.monotonic()
        tag = build_image(docker, repo, log)
        log(f"image {tag} ready in {time.monotonic() - t0:.0f} s")
        return tag
    finally:
        docker.stop()


if __name__ == "__main__":
    # `python -m testbed.emulation.cluster.machines`: the image only (Makefile's test target).
    import sys
    try:
        prepare_image(log=lambda line: print(line, flush=True))
    except MachineError as exc:
        sys.exit(f"rehearsal image: {exc}")
