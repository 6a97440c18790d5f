"""Stand-ins and checks for tests of the workers: a controller that answers round
announcements (`ControlListener`), and the raw-log contract a worker's log must keep
(`check_worker_log`, with the keys each event must carry)."""
import socket
import threading
import time

from controllers.protocol import ErrorReply, ProtocolError, RoundReply, encode, parse_request_line
from workloads.loopback import read_jsonl

ROUND_KEYS = {"event", "arm", "role", "rank", "round", "epoch", "t_start_ns", "t_end_ns",
              "compute_s", "comm_s", "bound", "phase", "loss", "stats"}
START_KEYS = {"event", "arm", "role", "rank", "model", "params", "grad_bytes", "world_size",
              "seed", "t_ns"}
EVAL_KEYS = {"event", "arm", "role", "rank", "round", "epoch", "t_ns", "test_accuracy", "test_loss"}


class ControlListener:
    """A tiny controller stand-in: decodes each line and answers with a declared reply."""

    def __init__(self, path, reply=None):
        self.path, self.reply, self.got = path, reply, []
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(4)
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _serve(self):
        conn, _ = self.srv.accept()
        with conn, conn.makefile("rwb") as f:
            for line in f:
                try:
                    req = parse_request_line(line)
                    self.got.append(req)
                    ans = self.reply(req) if self.reply else RoundReply([])
                except ProtocolError as exc:
                    ans = ErrorReply(str(exc))
                if ans is None:        # simulate a controller that hangs
                    time.sleep(5)
                    return
                f.write(ans if isinstance(ans, bytes) else encode(ans))
                f.flush()

    def close(self):
        self.srv.close()


def check_worker_log(path, arm, rank, rounds):
    recs = read_jsonl(path)
    kinds = [r["event"] for r in recs]
    assert kinds[0] == "start" and kinds[-1] == "end", kinds[:3]
    assert START_KEYS <= set(recs[0]) and recs[0]["grad_bytes"] == 4 * recs[0]["params"]
    rounds_ = [r for r in recs if r["event"] == "round"]
    assert [r["round"] for r in rounds_] == list(range(rounds))
    for r in rounds_:
        assert ROUND_KEYS <= set(r) and r["arm"] == arm and r["rank"] == rank
        assert r["t_start_ns"] <= r["t_end_ns"] and r["compute_s"] >= 0 and r["comm_s"] >= 0
    assert recs[-1]["status"] == "ok" and recs[-1]["train_time_s"] > 0
    return recs
