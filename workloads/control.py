"""Client for the controller's control socket: announces round start/end so bursts can follow rounds.

Protocol (COMMON.md): a UNIX stream socket at ``$DBLP_CONTROL_SOCKET``, one
JSON object per line each way. The client is a no-op that costs nothing
while the variable is unset or nothing listens; it retries the connection
at most once per ``retry_s`` so a controller that starts late is picked up.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time

ENV_VAR = "DBLP_CONTROL_SOCKET"


class RoundAnnouncer:
    """Sends ``{"op": "round", ...}`` and waits for the controller's reply.

    The reply arrives once any burst the event triggers is active, which is
    what makes round-triggered bursts hit the announced round. A controller
    that stops answering is dropped (with one warning) rather than stalling
    training.
    """

    def __init__(self, arm: str, path: str | None = None, timeout_s: float = 5.0,
                 retry_s: float = 1.0):
        self.arm = arm
        self.path = os.environ.get(ENV_VAR) if path is None else path
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._sock: socket.socket | None = None
        self._rfile = None
        self._next_try = 0.0
        self.sent = 0
        self.last_reply: dict | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.path)

    def _connect(self) -> bool:
        if self._sock is not None:
            return True
        now = time.monotonic()
        if not self.path or now < self._next_try:
            return False
        self._next_try = now + self.retry_s
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout_s)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            return False
        self._sock, self._rfile = s, s.makefile("rb")
        return True

    def _drop(self, why: str) -> None:
        print(f"control socket {self.path}: {why}; continuing without it", file=sys.stderr)
        try:
            if self._rfile is not None:
                self._rfile.close()
            if self._sock is not None:
                self._sock.close()
        finally:
            self._sock = self._rfile = None
            self._next_try = time.monotonic() + self.retry_s

    def request(self, obj: dict) -> dict | None:
        """Send one request, return the reply (or None when there is no controller)."""
        if not self._connect():
            return None
        try:
            self._sock.sendall(json.dumps(obj).encode() + b"\n")
            line = self._rfile.readline()
        except OSError as exc:  # includes socket.timeout
            self._drop(f"{type(exc).__name__}: {exc}")
            return None
        if not line:
            self._drop("controller closed the connection")
            return None
        self.sent += 1
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            self._drop(f"unparsable reply {line[:80]!r}")
            return None
        if not reply.get("ok", False):
            print(f"control socket: controller refused {obj.get('op')}: {reply.get('error')}",
                  file=sys.stderr)
        self.last_reply = reply
        return reply

    def round(self, event: str, round_: int) -> dict | None:
        if event not in ("start", "end"):
            raise ValueError(f"round event must be 'start' or 'end', got {event!r}")
        if not self.path:
            return None
        return self.request({"op": "round", "event": event, "arm": self.arm,
                             "round": int(round_), "t_ns": time.time_ns()})

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = self._rfile = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
