"""The spec's server names (``[cluster] servers``): ``"local"`` first, then ``[user@]host[:port]``.

Declared once here and read by the spec, the placement and the preflight.
Why so strict: a server name becomes an argument of ``ssh``; a name that
starts with ``-`` would be read as an option (``-oProxyCommand=...``) and a
shell character would reach the remote shell, so only plain user names,
host names, IPv4 addresses and port numbers pass. The spec's ssh options
(``[cluster] ssh_options``) are allow-listed for the same reason
(`check_ssh_options`): ``-oProxyCommand``, ``LocalCommand``, ``-F`` (a
config file that may hold them), forwardings and the like run commands or
open channels as root, so only options that choose how to authenticate,
verify the host and keep the connection pass.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Sequence

from testbed.errors import InputError

#: The first server: this machine, reached without ssh. It runs the controller.
LOCAL = "local"
#: A POSIX-portable user name (what ``useradd`` accepts by default).
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
#: An RFC 1123 host name: labels of letters, digits and inner hyphens.
HOST_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                     r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
SSH_PORT = 22
#: ssh flags the spec may give, alone.
SSH_FLAGS = frozenset({"-4", "-6", "-C", "-q", "-v", "-vv", "-vvv"})
#: ssh flags the spec may give with a value (``-i KEY`` or ``-iKEY``): a key, ciphers, MACs, an option.
SSH_FLAGS_WITH_VALUE = frozenset({"-i", "-c", "-m", "-o"})
#: ``-o`` options the spec may set (ssh_config(5) names, case-insensitive): how to authenticate,
#: how to check the host's key, how to keep the connection. None runs a command or opens a channel.
SSH_OPTIONS = frozenset(o.lower() for o in (
    "IdentityFile", "IdentitiesOnly", "CertificateFile", "PubkeyAuthentication",
    "PubkeyAcceptedAlgorithms", "PubkeyAcceptedKeyTypes", "PreferredAuthentications",
    "PasswordAuthentication", "KbdInteractiveAuthentication", "GSSAPIAuthentication", "BatchMode",
    "UserKnownHostsFile", "GlobalKnownHostsFile", "StrictHostKeyChecking", "HostKeyAlias",
    "HostKeyAlgorithms", "CheckHostIP", "UpdateHostKeys", "ConnectTimeout", "ConnectionAttempts",
    "ServerAliveInterval", "ServerAliveCountMax", "TCPKeepAlive", "Ciphers", "MACs", "KexAlgorithms",
    "Compression", "AddressFamily", "IPQoS", "LogLevel", "RekeyLimit"))
FORM = '"local" first, then "[user@]host[:port]" per further machine, e.g. "root@lab2:22"'


class SshOptionError(InputError):
    """An ssh option the cluster refuses; ``option`` is the word as given."""

    def __init__(self, option: str, problem: str):
        self.option, self.problem = option, problem
        self.fix = "use only -i KEY, -o with an authentication, host-key or keep-alive option, -c, -m, " \
                   "-4, -6, -C, -q or -v"
        super().__init__(f"ssh option {option!r}: {problem}; {self.fix}")


def check_ssh_options(options: Sequence[str]) -> None:
    """Refuse any ssh option outside the allow-list (`SshOptionError` naming it), one word at a time."""
    words = list(options)
    i = 0
    while i < len(words):
        word = words[i]
        if not isinstance(word, str) or not word or "\n" in word:
            raise SshOptionError(str(word), "not a one-line string")
        if word in SSH_FLAGS:
            i += 1
            continue
        flag, value = word[:2], word[2:]
        if flag not in SSH_FLAGS_WITH_VALUE:
            raise SshOptionError(word, "not an option the cluster lets reach ssh (it may run a command, "
                                       "read another config or forward a channel)")
        if not value:
            if i + 1 >= len(words):
                raise SshOptionError(word, "its value is missing")
            i += 1
            value = words[i]
        if flag == "-o":
            key = re.split(r"[=\s]", value.strip(), maxsplit=1)[0]
            if key.lower() not in SSH_OPTIONS:
                raise SshOptionError(f"-o{value}" if word == "-o" else word,
                                     f"{key} is not an ssh_config option the cluster allows "
                                     "(it may run a command, read another config or forward a channel)")
        i += 1


class ServerError(InputError):
    """A server name the cluster cannot use; ``index`` is its place in the list."""

    def __init__(self, index: int, problem: str, fix: str):
        self.index, self.problem, self.fix = index, problem, fix
        super().__init__(f"cluster server {index}: {problem}; {fix}")


@dataclasses.dataclass(frozen=True)
class Server:
    """One machine of the fabric, as the spec names it (``name``) and as ssh reaches it."""

    name: str
    host: str = ""
    user: str = ""
    port: int = SSH_PORT

    @property
    def is_local(self) -> bool:
        return self.name == LOCAL

    @property
    def destination(self) -> str:
        """``user@host`` (or ``host``): ssh's destination argument."""
        return f"{self.user}@{self.host}" if self.user else self.host

    def ssh_argv(self, connect_timeout_s: float, options: Sequence[str] = (),
                 own: Sequence[str] = ()) -> list[str]:
        """ssh to this server: never a prompt (BatchMode), a bounded connect, no host-key question.

        Why ``StrictHostKeyChecking=accept-new``: a first contact with a lab
        machine must not stop at a yes/no prompt nobody answers, while a
        *changed* key (another machine behind the name) still refuses.
        ``options``: more of ssh's own options, before the destination
        (``-i KEY``, ``-o UserKnownHostsFile=...``), allow-listed (`check_ssh_options`);
        ``own``: the project's own (``nodes.SshPlan``: multiplexing, a terminal).
        """
        if self.is_local:
            raise ValueError("the local server is reached without ssh")
        check_ssh_options(options)
        return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(connect_timeout_s))}",
                "-o", "StrictHostKeyChecking=accept-new", "-o", "LogLevel=ERROR",
                "-p", str(self.port), *options, *own, "--", self.destination]

    def __str__(self) -> str:
        return self.name


def parse_server(text: object, index: int = 0) -> Server:
    """One server name as a `Server`; anything else is a `ServerError` naming ``index``."""
    if not isinstance(text, str):
        raise ServerError(index, f"expected a string, got {text!r}", f"write {FORM}")
    if text == LOCAL:
        return Server(LOCAL)
    rest, user = text, ""
    if "@" in rest:
        user, rest = rest.split("@", 1)
        if not USER_RE.match(user):
            raise ServerError(index, f"{user!r} in {text!r} is not a plain user name",
                              "use letters, digits, '_' or '-' (starting with a letter or '_')")
    host, port = rest, SSH_PORT
    if rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ServerError(index, f"port {port_text!r} in {text!r} is not a port number",
                              "use a port in 1..65535, e.g. host:22")
        port = int(port_text)
    if not (_is_ipv4(host) or (HOST_RE.match(host) and not host.replace(".", "").isdigit())):
        raise ServerError(index, f"{host!r} in {text!r} is not a host name or IPv4 address",
                          f"write {FORM}")
    return Server(text, host=host, user=user, port=port)


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def parse_servers(names: Sequence[object]) -> list[Server]:
    """The spec's list: at least one, ``"local"`` first and only there, each machine once."""
    if not names:
        raise ServerError(0, "the list is empty", f'write servers = ["{LOCAL}"]')
    servers = [parse_server(name, i) for i, name in enumerate(names)]
    if not servers[0].is_local:
        raise ServerError(0, f"{servers[0].name!r} is first, but this machine must be",
                          f'put "{LOCAL}" first: it runs the controller and collects the logs')
    seen: dict[tuple[str, int], int] = {}
    for i, s in enumerate(servers[1:], start=1):
        if s.is_local:
            raise ServerError(i, f'"{LOCAL}" is listed again', "list this machine once, first")
        if (s.host, s.port) in seen:
            raise ServerError(i, f"{s.name!r} is the machine of server {seen[s.host, s.port]} again",
                              "list each machine once")
        seen[s.host, s.port] = i
    return servers
