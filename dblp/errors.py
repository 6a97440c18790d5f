"""Transport exceptions: what a caller sees instead of a hang."""


class TransportError(RuntimeError):
    """The transport could not complete an operation."""


class PeerTimeout(TransportError):
    """A peer made no progress before the round deadline (dead or unreachable)."""


class PeerClosed(TransportError):
    """A peer closed its TCP control connection mid-round."""
