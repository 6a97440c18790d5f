"""Data-path tools behind the burst kinds that live outside OpenFlow (``controllers.kinds``).

``loss``: an nftables ``netdev`` table whose chains hook egress (or ingress)
of switch-side ports and drop ``numgen random`` packets. Rules go through
libnftables in-process (ctypes), because forking ``nft`` costs milliseconds
and the burst's start-lag budget is 5 ms; the ``nft`` binary is the fallback.
``congest``: a paced UDP sender (``controllers.crosstraffic``) started in a
cross-traffic host's namespace; the drops are read from the port's pfifo.
"""
from __future__ import annotations

import ctypes
import json
import re
import subprocess
import threading

from controllers.traffic import nft_matches

NFT_PREFIX = "dtburst_"   # `dblp-testbed clean` removes netdev tables with this prefix
NUMGEN_MOD = 10000


class Nft:
    """Run nft scripts through libnftables when available (no fork)."""

    def __init__(self):
        self.lock = threading.Lock()  # one nft context, used from several threads
        self.ctx = None
        try:
            lib = ctypes.CDLL("libnftables.so.1")
            lib.nft_ctx_new.restype = ctypes.c_void_p
            lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
            lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
            lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
            lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
            lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
            lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
            lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
            ctx = lib.nft_ctx_new(0)
            lib.nft_ctx_buffer_output(ctx)
            lib.nft_ctx_buffer_error(ctx)
            self.lib, self.ctx = lib, ctx
        except (OSError, AttributeError):
            self.lib = None

    @property
    def in_process(self) -> bool:
        return self.ctx is not None

    def run(self, script: str) -> str:
        if self.ctx is not None:
            with self.lock:
                return self._run_ctx(script)
        p = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"nft failed: {p.stderr.strip()[:400]}")
        return p.stdout

    def _run_ctx(self, script: str) -> str:
        rc = self.lib.nft_run_cmd_from_buffer(self.ctx, script.encode())
        out = (self.lib.nft_ctx_get_output_buffer(self.ctx) or b"").decode()
        err = (self.lib.nft_ctx_get_error_buffer(self.ctx) or b"").decode()
        if rc != 0:
            raise RuntimeError(f"nft failed: {err.strip()[:400]}")
        return out


class RemoteNft:
    """`Nft` on another machine: ``controllers.nft_agent`` there, over ``argv`` (its ssh command)."""

    def __init__(self, argv: list[str], cwd: str | None = None):
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, cwd=cwd)
        first = self.proc.stdout.readline() if self.proc.stdout else ""
        if not first.startswith("{"):
            err = self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""
            raise RuntimeError(f"nft agent did not start: {(first + err).strip()[-300:]}")
        self.in_process = bool(json.loads(first).get("in_process"))

    def run(self, script: str) -> str:
        return self.request({"script": script})

    def tc(self, args: list[str]) -> str:
        """``tc ARGS`` there: its output."""
        return self.request({"tc": list(args)})

    def request(self, req: dict) -> str:
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps(req) + "\n")
                self.proc.stdin.flush()
                line = self.proc.stdout.readline()
            except (OSError, ValueError) as exc:
                raise RuntimeError(f"nft agent gone: {exc}") from None
        if not line:
            raise RuntimeError("nft agent gone (its ssh session ended)")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(reply.get("error", "nft agent failed"))
        return reply.get("out", "")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


class NftPool:
    """The nft context of every machine a fabric's ports are on: this one's, and an agent per other.

    ``remote`` (the fabric's config, ``testbed.emulation.cluster``): ``servers``
    (name -> the argv, run here, that starts ``controllers.nft_agent`` there)
    and ``switches`` (switch -> server, for those not here). A machine's agent
    starts on its first burst and lives until `close`.
    """

    def __init__(self, remote: dict | None = None):
        self.local = Nft()
        self.remote = remote or {}
        self.agents: dict[str, RemoteNft] = {}

    @property
    def in_process(self) -> bool:
        return self.local.in_process

    def server_of(self, intf: str) -> str | None:
        """The server of the switch that owns ``intf`` (None: this machine)."""
        return self.remote.get("switches", {}).get(intf.split("-eth")[0])

    def get(self, server: str | None):
        if server is None:
            return self.local
        if server not in self.agents:
            self.agents[server] = RemoteNft(list(self.remote["servers"][server]))
        return self.agents[server]

    def start_all(self) -> None:
        """Every other machine's agent now: a burst must not wait for an ssh session and a Python."""
        for server in self.remote.get("servers", {}):
            self.get(server)

    def close(self) -> None:
        for agent in self.agents.values():
            agent.close()
        self.agents = {}


def loss_table_name(burst_id: str, prefix: str = NFT_PREFIX) -> str:
    """The burst's nftables table: the fabric's own prefix (so clean-up of one fabric
    finds exactly its tables), then the burst id."""
    return prefix + re.sub(r"[^A-Za-z0-9_]", "_", burst_id)[:40]


def loss_hooks(topo, ports):
    """[(intf, match)] egress hooks that drop what crosses ``ports`` in their direction.

    An egress target is hooked on its own port. An ingress target (what a host
    or neighbour sends into the switch) cannot be hooked at ingress: OVS's
    userspace datapath reads through a packet socket, which sees frames
    before the ingress hook. So it is hooked at the egress of the neighbour
    switch's port, or, for a host, at the switch's other ports for IP packets
    from that host.
    """
    hooks = []
    for tp in ports:
        if tp.direction == "egress":
            hooks.append((tp.intf, ""))
            continue
        nb, nb_port = topo.ports(tp.switch)[tp.port]
        if topo.isSwitch(nb):
            hooks.append((f"{nb}-eth{nb_port}", ""))
        else:
            ip = topo.host_info[nb].ip
            for p in sorted(topo.ports(tp.switch)):
                if p != tp.port:
                    hooks.append((f"{tp.switch}-eth{p}", f"meta protocol ip ip saddr {ip} "))
    return hooks


def loss_script(table: str, hooks, p: float, sink: str, traffic: str = "all") -> str:
    """An nft script (multi-line syntax): count what is hit, steal with probability p.

    ``traffic`` (``controllers.traffic.TRAFFIC``): which packets the rules
    may take; "all" writes the one rule pair per hook it always wrote.

    Why ``fwd to`` a sink veth and not ``drop``: userspace OVS sends a batch
    with one sendmmsg(); a drop verdict fails that call and OVS discards the
    rest of the batch (the loss overshot p: 0.72 for p = 0.6). A packet
    forwarded away counts as sent, so exactly the chosen packets vanish.
    """
    threshold = int(round(p * NUMGEN_MOD))
    # p = 1 steals every packet: nft refuses "numgen random mod N < N" (out of range)
    draw = "" if threshold >= NUMGEN_MOD else f"numgen random mod {NUMGEN_MOD} < {threshold} "
    lines = [f"table netdev {table} {{"]
    for i, (intf, match) in enumerate(hooks):
        lines += [f"  chain c{i} {{",
                  f"    type filter hook egress device \"{intf}\" priority 0;"]
        for which in nft_matches(traffic):
            lines += [f"    {match}{which}counter",
                      f"    {match}{which}{draw}counter fwd to \"{sink}\""]
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


_COUNTER = re.compile(r"counter packets (\d+) bytes \d+")


def parse_loss_counters(listing: str):
    """(seen, dropped) summed over the table's chains."""
    seen = dropped = 0
    for line in listing.splitlines():
        m = _COUNTER.search(line)
        if not m:
            continue
        if "drop" in line or "fwd to" in line:
            dropped += int(m.group(1))
        else:
            seen += int(m.group(1))
    return seen, dropped


def pfifo_drops(intf: str, remote: RemoteNft | None = None) -> int:
    """Drops counted by the bounded drop-tail queue (pfifo, handle 10:) of an interface.

    ``remote``: the agent of the server that holds it (`NftPool.get`), None here.
    """
    args = ["-s", "-j", "qdisc", "show", "dev", intf]
    if remote is not None:
        out = remote.tc(args)
    else:
        p = subprocess.run(["tc", *args], capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"tc -s qdisc show dev {intf}: {p.stderr.strip()}")
        out = p.stdout
    total = 0
    for q in json.loads(out or "[]"):
        if q.get("kind") in ("pfifo", "bfifo"):
            total += int(q.get("drops", 0))
    return total


class CrossAgent:
    """A long-lived ``controllers.crosstraffic --agent`` in one host's namespaces.

    It stays in the controller's process group, so stopping the controller's
    group (the fabric's tear-down) stops the agents too.
    """

    def __init__(self, host: str, host_pid: int, python: str, cwd: str, argv: list[str] | None = None):
        """``argv``: the command that starts the agent in the host, where it is not here
        (a fabric across machines gives it: ssh to the host's server, then ``mnexec``)."""
        self.host = host
        self.proc = subprocess.Popen(
            argv or ["mnexec", "-a", str(host_pid), python, "-m", "controllers.crosstraffic", "--agent"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, cwd=cwd)
        self.cond = threading.Condition()
        self.go, self.sent, self.errors = {}, {}, []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            parts = line.split()
            with self.cond:
                if len(parts) == 3 and parts[0] == "go":
                    self.go[parts[1]] = int(parts[2])
                elif len(parts) == 3 and parts[0] == "sent":
                    self.sent[parts[1]] = int(parts[2])
                else:
                    self.errors.append(line.strip())
                self.cond.notify_all()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, fid, dst, sport, rate_mbps, pkt_bytes):
        self.proc.stdin.write(f"start {fid} {dst} {sport} {rate_mbps} {pkt_bytes}\n")
        self.proc.stdin.flush()

    def stop(self, fid):
        self.proc.stdin.write(f"stop {fid}\n")
        self.proc.stdin.flush()

    def wait_for(self, table: str, fid, timeout=3.0):
        with self.cond:
            self.cond.wait_for(lambda: fid in getattr(self, table) or not self.alive(), timeout)
            return getattr(self, table).pop(fid, None)

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
