"""A unit's training settings travel as one declared file, ``training.json``, never as argv.

The spec's ``[training]`` section and the unit's seed are written once per
unit by the built-in launcher (`testbed.run.builtinlauncher`) and read by the
real server and workers, here started on loopback by the launcher itself;
a file that is wrong stops a process with one line naming the file and the key.
"""
import dataclasses
import json
import subprocess
import sys

import pytest

from dblp.testing import free_port
from testbed.config.presets import PRESETS
from testbed.config.spec import load
from testbed.testing.workers import check_worker_log
from workloads.loopback import read_jsonl
from workloads.training import SCHEMA, TRAINING_FILE, TrainingSettings

pytestmark = pytest.mark.unit

#: Settings unlike every default, so a setting that fell back to one shows.
SPEC_TRAINING = ["training.rounds=6", "training.lr=0.02", "training.lr_schedule=cosine",
                 "training.batch_size=8", "training.eval_every=4"]
SEED = 5


class LoopbackHosts:
    """What a unit asks of a fabric, every host on this machine (no controller listens)."""

    controller = None

    def __init__(self, tmp):
        self.control_socket = str(tmp / "nobody.sock")

    def ip(self, host):
        return "127.0.0.1"

    def intf(self, host):
        return "lo"

    def popen(self, host, argv, **kw):
        return subprocess.Popen(argv, **kw)


def test_the_file_holds_every_setting_and_reads_back_equal(tmp_path):
    s = TrainingSettings(model="byte_lm", rounds=40, seed=3, lr=1, lr_schedule="cosine",
                         batch_size=None, eval_every=10)
    path = tmp_path / TRAINING_FILE
    s.write(path)
    doc = json.loads(path.read_text())
    assert doc == {"schema": SCHEMA, "model": "byte_lm", "rounds": 40, "seed": 3, "lr": 1.0,
                   "lr_schedule": "cosine", "batch_size": None, "eval_every": 10}
    assert TrainingSettings.read(path) == s
    assert "lr=1.0" in s.describe() and "batch_size=(the model's)" in s.describe()


@pytest.mark.parametrize("edit,key,problem", [
    (lambda d: d.update(roundz=3), "roundz", "unknown"),
    (lambda d: d.pop("eval_every"), "eval_every", "missing"),
    (lambda d: d.update(rounds=0), "rounds", "must be an integer >= 1, got 0"),
    (lambda d: d.update(batch_size=True), "batch_size", "must be an integer >= 1, got True"),
    (lambda d: d.update(lr=-1), "lr", "must be a positive number"),
    (lambda d: d.update(lr_schedule="step"), "lr_schedule", "must be one of constant, cosine"),
    (lambda d: d.update(schema=2), "schema", "2 is not supported"),
])
def test_a_wrong_key_is_one_line_naming_the_file_and_the_key(tmp_path, edit, key, problem):
    doc = json.loads(TrainingSettings().to_json())
    edit(doc)
    path = tmp_path / TRAINING_FILE
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as err:
        TrainingSettings.read(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: key {key!r}: ") and problem in msg and "\n" not in msg


@pytest.mark.parametrize("module", ["workloads.worker", "workloads.server"])
def test_a_process_given_a_bad_file_stops_with_that_one_line(tmp_path, module):
    doc = json.loads(TrainingSettings().to_json())
    doc["roundz"] = doc.pop("rounds")
    path = tmp_path / TRAINING_FILE
    path.write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, "-m", module, "--arm", "local" if "worker" in module
                        else "static", "--world-size", "2", "--training-config", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"--training-config {path}: key 'roundz': unknown (the keys are "
                                "schema, model, rounds, seed, lr, lr_schedule, batch_size, "
                                "eval_every)")


def test_the_file_or_the_flags_never_both_and_flags_are_checked_alike(tmp_path):
    from workloads import worker

    path = tmp_path / TRAINING_FILE
    TrainingSettings(rounds=7).write(path)
    parse = worker.build_parser().parse_args
    with pytest.raises(SystemExit, match=r"^--rounds: the training settings come from "
                                         rf"--training-config {path}; give the file or"):
        worker.resolve(parse(["--arm", "local", "--training-config", str(path), "--rounds", "3"]))
    with pytest.raises(SystemExit, match=r"^--eval-every: must be an integer >= 0, got -1$"):
        worker.resolve(parse(["--arm", "local", "--eval-every", "-1"]))
    TrainingSettings(model="no_such_model").write(path)
    with pytest.raises(SystemExit, match=rf"^--training-config {path}: key 'model': "
                                         r"'no_such_model' is not one of "):
        worker.resolve(parse(["--arm", "local", "--training-config", str(path)]))
    # By hand, the flags build the same settings over the defaults.
    args = worker.resolve(parse(["--arm", "local", "--rounds", "3", "--lr", "0.5"]))
    assert args.training == dataclasses.replace(TrainingSettings(), rounds=3, lr=0.5)


def test_a_spec_s_training_settings_reach_the_server_and_workers_through_the_file(tmp_path):
    """The real launcher, server and workers on loopback: the settings the spec names are
    what every process trained or served with, and none of them crossed as argv."""
    from testbed.run.runner import ArmRun

    spec = load(None, PRESETS["default"], SPEC_TRAINING + ["transport.rate_mbps=200"])
    run = ArmRun(spec, "static", LoopbackHosts(tmp_path), tmp_path / "run", "srv", ["w1", "w2"],
                 seed=SEED)
    run.unit.port = free_port()
    names = ["server", "worker0", "worker1"]
    try:
        run.launcher.start()
        assert run.unit.procs.wait(names, 180)
    finally:
        run.unit.procs.stop()
        run.launcher.close()
    raw = run.unit.raw
    outs = {n: (raw / f"{n}.out").read_text() for n in names}
    assert [run.unit.procs.returncode(n) for n in names] == [0, 0, 0], outs
    path = raw / TRAINING_FILE
    assert TrainingSettings.read(path) == TrainingSettings(
        model=spec["training"]["model"], rounds=6, seed=SEED, lr=0.02, lr_schedule="cosine",
        batch_size=8, eval_every=4)
    for m in run.unit.procs.members:
        argv = list(m.proc.args)
        assert argv[argv.index("--training-config") + 1] == str(path)
        assert not {"--rounds", "--lr", "--lr-schedule", "--batch-size", "--seed", "--model",
                    "--eval-every"} & set(argv)
        assert f"training settings from {path}: model=" in outs[m.name]   # echoed as read
    for rank in (0, 1):
        recs = check_worker_log(raw / f"worker{rank}.jsonl", "static", rank, 6)
        start = recs[0]
        assert (start["seed"], start["rounds"], start["batch_size"], start["lr_schedule"]) == \
            (SEED, 6, 8, "cosine")
        assert start["lr"] == pytest.approx(0.02)
        evals = [r["round"] for r in recs if r["event"] == "eval"]
        assert evals == ([3, 5] if rank == 0 else [])        # eval_every 4, and the last round
    srv = read_jsonl(raw / "server.jsonl")
    assert (srv[0]["seed"], srv[0]["rounds"]) == (SEED, 6) and srv[-1]["status"] == "ok"
    assert [r["round"] for r in srv if r["event"] == "round"] == list(range(6))
