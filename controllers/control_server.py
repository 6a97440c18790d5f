"""The control socket's server side: requests decoded by ``controllers.protocol``, never a crash.

Why its own module: the apps only register a handler per request class
(``{RoundRequest: self.round_request}``); how lines are framed, decoded and
refused is the protocol's business, and tests drive it on a real socket
without os-ken. A malformed line, an unknown version or op, and any error a
handler raises become an ``ErrorReply``; the connection and the controller
stay up.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from controllers.protocol import (
    MAX_LINE,
    ErrorReply,
    ProtocolError,
    Reply,
    Request,
    encode,
    parse_request_line,
)


class ControlServer:
    """A UNIX stream socket born 0600 (only root, the harness, talks to it)."""

    def __init__(self, path: str, handlers: dict[type[Request], Callable[[Request], Reply]],
                 lock: threading.RLock, spawn: Callable = None, logger: logging.Logger | None = None):
        self.path, self.handlers, self.lock = path, handlers, lock
        self.spawn = spawn or (lambda f, *a: threading.Thread(target=f, args=a, daemon=True).start())
        self.logger = logger or logging.getLogger(__name__)
        self.sock: socket.socket | None = None

    def bind(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            srv.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        srv.listen(64)
        self.sock = srv
        self.logger.info("control socket listening at %s", self.path)

    def serve_forever(self) -> None:
        if self.sock is None:
            self.bind()
        assert self.sock is not None
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.spawn(self._client, conn)

    def _client(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        conn.sendall(encode(self.answer(line)))
                if len(buf) > MAX_LINE:
                    conn.sendall(encode(ErrorReply(f"request line longer than {MAX_LINE} bytes")))
                    return
        except OSError:
            return
        finally:
            conn.close()

    def answer(self, line: bytes) -> Reply:
        """The reply to one request line; never raises."""
        try:
            request = parse_request_line(line)
        except ProtocolError as exc:
            return ErrorReply(str(exc))
        handler = self.handlers.get(type(request))
        if handler is None:
            return ErrorReply(f"op {request.op!r} is not served by this controller")
        try:
            with self.lock:
                return handler(request)
        except (ValueError, TypeError, KeyError) as exc:  # bad burst, unknown target, ...
            return ErrorReply(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # the controller must survive anything a client sends
            self.logger.exception("request %r failed", request)
            return ErrorReply(f"internal error: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
