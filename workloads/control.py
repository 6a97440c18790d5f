"""Round announcements to the controller, so bursts can follow rounds.

The socket is ``$DBLP_CONTROL_SOCKET`` and the messages are declared in
``controllers.protocol``; this module adds only the workload's policy: it is a
no-op that costs nothing while the variable is unset or nothing listens, it
retries the connection at most once per ``retry_s`` so a controller that
starts late is picked up, and it drops a controller that stops answering.
"""
from __future__ import annotations

import os
import sys
import time

from controllers.protocol import ControlClient, ProtocolError, Reply, RoundRequest

ENV_VAR = "DBLP_CONTROL_SOCKET"


class RoundAnnouncer:
    """Sends a ``RoundRequest`` per round start/end and waits for the controller's reply.

    The reply arrives once any burst the event triggers is active, which is
    what makes round-triggered bursts hit the announced round. A controller
    that stops answering is dropped (with one warning) rather than stalling
    training.
    """

    def __init__(self, arm: str, path: str | None = None, timeout_s: float = 5.0,
                 retry_s: float = 1.0, seed: int | None = None):
        self.arm, self.seed = arm, seed   # the unit: the controller bursts each seed afresh
        self.path = os.environ.get(ENV_VAR) if path is None else path
        self.retry_s = retry_s
        self._client = ControlClient(self.path, timeout_s) if self.path else None
        self._connected = False
        self._next_try = 0.0
        self.sent = 0
        self.last_reply: Reply | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.path)

    def _connect(self) -> bool:
        if self._connected:
            return True
        now = time.monotonic()
        if self._client is None or now < self._next_try:
            return False
        self._next_try = now + self.retry_s
        try:
            self._client.connect()
        except OSError:
            return False
        self._connected = True
        return True

    def _drop(self, why: str) -> None:
        print(f"control socket {self.path}: {why}; continuing without it", file=sys.stderr)
        if self._client is not None:
            self._client.close()
        self._connected = False
        self._next_try = time.monotonic() + self.retry_s

    def round(self, event: str, round_: int) -> Reply | None:
        """Announce a round event; the reply, or None when there is no controller."""
        request = RoundRequest(event=event, arm=self.arm, round=int(round_), t_ns=time.time_ns(),
                               seed=self.seed)
        if not self._connect():
            return None
        assert self._client is not None
        try:
            reply = self._client.send(request)
        except (OSError, ProtocolError) as exc:  # OSError includes socket.timeout
            self._drop(f"{type(exc).__name__}: {exc}")
            return None
        self.sent += 1
        if not reply.ok:
            print(f"control socket: controller refused round {event}: {getattr(reply, 'error', '')}",
                  file=sys.stderr)
        self.last_reply = reply
        return reply

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._connected = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
