"""Specs: presets resolve, overrides apply, and bad specs fail cleanly.

Every bad spec must give exit code 2, exactly one line on stderr that names
the offending field and says how to fix it, and create nothing: no run
directory, no results, no emulation.
"""
import pathlib
import tomllib

import pytest
from click.testing import CliRunner

from testbed.cli import main
from testbed.config.presets import PRESETS
from testbed.config.spec import SpecError, load

BAD_SPECS = [
    ("unknown-top", 'colour = 1', "colour"),
    ("unknown-field", '[topology]\nspeed = 3', "topology.speed"),
    ("unknown-section-type", 'topology = 3', "topology"),
    ("seed-type", 'seed = "x"', "seed"),
    ("k-odd", '[topology]\nk = 5', "topology.k"),
    ("k-too-large", '[topology]\nk = 10', "topology.k"),
    ("k-too-small", '[topology]\nk = 2', "topology.k"),
    ("k-bool", '[topology]\nk = true', "topology.k"),
    ("bw-zero", '[topology]\nbw_mbps = 0', "topology.bw_mbps"),
    ("bw-negative", '[topology]\nbw_mbps = -5', "topology.bw_mbps"),
    ("bw-huge", '[topology]\nbw_mbps = 5000', "topology.bw_mbps"),
    ("queue-tiny", '[topology]\nqueue_pkts = 1', "topology.queue_pkts"),
    ("topology-kind", '[topology]\nkind = "torus"', "topology.kind"),
    ("arm-unknown", 'arms = ["gloo", "tcpx"]', "arms"),
    ("arms-empty", 'arms = []', "arms"),
    ("arm-twice", 'arms = ["dblp", "dblp"]', "arms"),
    ("p-static-high", '[transport]\np_static = 1.5', "transport.p_static"),
    ("p-low-negative", '[transport]\np_low = -0.1', "transport.p_low"),
    ("p-high-below-low", '[transport]\np_low = 0.2\np_high = 0.1', "transport.p_high"),
    ("threshold-zero", '[transport]\nthreshold = 0', "transport.threshold"),
    ("missing-mode", '[transport]\nmissing = "guess"', "transport.missing"),
    ("check-every-word", '[transport]\ncheck_every = "weekly"', "transport.check_every"),
    ("check-every-zero", '[transport]\ncheck_every = 0', "transport.check_every"),
    ("check-every-float", '[transport]\ncheck_every = 2.5', "transport.check_every"),
    ("epoch-without-length", '[transport]\ncheck_every = "epoch"', "transport.rounds_per_epoch"),
    ("rounds-per-epoch-negative", '[transport]\nrounds_per_epoch = -3',
     "transport.rounds_per_epoch"),
    ("norm-unknown", '[transport]\nnorm = "median"', "transport.norm"),
    ("signal-unknown", '[transport]\nsignal = "vibes"', "transport.signal"),
    ("model-unknown", '[training]\nmodel = "gpt5"', "training.model"),
    ("lr-schedule", '[training]\nlr_schedule = "step"', "training.lr_schedule"),
    ("rounds-zero", '[training]\nrounds = 0', "training.rounds"),
    ("target-above-one", '[training]\ntarget_accuracy = 1.5', "training.target_accuracy"),
    ("lr-negative", '[training]\nlr = -0.1', "training.lr"),
    ("too-many-workers", '[topology]\nk = 4\n[placement]\nworkers = 16',
     "placement.workers"),
    ("name-shell", 'name = "a;rm -rf /"', "name"),
    ("name-path", 'name = "../escape"', "name"),
    ("burst-negative-duration",
     '[[bursts]]\nat_round = 3\nduration_ms = -5', "bursts[0].duration_ms"),
    ("burst-kind", '[[bursts]]\nat_round = 3\nrounds = 1\nkind = "meteor"', "bursts[0].kind"),
    ("burst-two-triggers", '[[bursts]]\nat_round = 3\nat_s = 1.0\nrounds = 1', "bursts[0]"),
    ("burst-after-end", '[[bursts]]\nat_round = 100000\nrounds = 1', "bursts[0].at_round"),
    ("burst-p", '[[bursts]]\nat_round = 3\nrounds = 1\nparams = {p = 2}', "bursts[0].params.p"),
    ("burst-no-such-link", '[[bursts]]\nat_round = 3\nrounds = 1\ntarget = "x1:x2"',
     "bursts[0].target"),
    ("burst-target-shell", '[[bursts]]\nat_round = 3\nrounds = 1\ntarget = "server;ls"',
     "bursts[0].target"),
    ("burst-unknown-field", '[[bursts]]\nat_round = 3\nrounds = 1\nwhen = 2', "bursts[0].when"),
    ("burst-params-other-kind", '[[bursts]]\nat_round = 3\nrounds = 1\nparams = {p = 0.5, rate_mbps = 3}',
     "bursts[0].params.rate_mbps"),
    ("burst-police-p", '[[bursts]]\nat_round = 3\nrounds = 1\nkind = "police"\nparams = {p = 0.5}',
     "bursts[0].params.p"),
    ("burst-congest-jumbo", '[[bursts]]\nat_round = 3\nrounds = 1\nkind = "congest"\n'
     'params = {pkt_bytes = 9000}', "bursts[0].params.pkt_bytes"),
    ("burst-no-such-worker", '[[bursts]]\nat_round = 3\nrounds = 1\ntarget = "worker7-downlink"',
     "bursts[0].target"),
    ("burst-no-such-host", '[[bursts]]\nat_round = 3\nrounds = 1\ntarget = "h999-downlink"',
     "bursts[0].target"),
    ("burst-core-on-star", '[topology]\nkind = "star"\n[[bursts]]\nat_round = 3\nrounds = 1\n'
     'target = "core-uplinks"', "bursts[0].target"),
    ("burst-rounds-range", '[[bursts]]\nat_round = 3\nrounds = 5000', "bursts[0].rounds"),
    ("burst-max-ms-no-rounds", '[[bursts]]\nat_round = 3\nduration_ms = 5\nmax_ms = 10',
     "bursts[0].max_ms"),
    ("burst-no-start", '[[bursts]]\nduration_ms = 5', "bursts[0]"),
    ("generator-no-such-worker", '[burst_every]\ntarget = "worker4-uplink"', "burst_every.target"),
    ("generator-kind", '[burst_every]\nkind = "meteor"', "burst_every.kind"),
    ("capture-host", '[capture]\nhosts = ["worker9"]', "capture.hosts[0]"),
    ("generator-p", '[burst_every]\np = 1.5', "burst_every.p"),
    ("not-toml", 'this is = = not toml', "SPEC"),
    # A link so slow that a full queue outlasts the transports' retransmission timers.
    ("bw-below-useful", '[topology]\nbw_mbps = 1.0', "topology.bw_mbps"),
    ("bw-slow-for-queue", '[topology]\nbw_mbps = 10\nqueue_pkts = 1000', "topology.bw_mbps"),
    # 1437 training digits over the default's 3 workers: shards of 479.
    ("batch-above-shard", '[training]\nmodel = "digits_cnn"\nbatch_size = 500', "training.batch_size"),
    ("default-batch-above-shard",
     '[topology]\nkind = "star"\n[placement]\nworkers = 60\n[training]\nmodel = "digits_cnn"',
     "training.batch_size"),
    ("deadline-zero", '[transport]\nround_deadline_s = 0', "transport.round_deadline_s"),
    ("check-every-zero", '[transport]\ncheck_every = 0', "transport.check_every"),
    ("placement-strategy-is-gone", '[placement]\nstrategy = "spread"', "placement.strategy"),
    ("seeds-negative", 'seeds = -1', "seeds"),
    ("seeds-zero", 'seeds = 0', "seeds"),
    ("seeds-not-int", 'seeds = 2.5', "seeds"),
    ("seeds-past-the-last-seed", 'seed = 2147483647\nseeds = 2', "seeds"),
]


@pytest.mark.unit
@pytest.mark.parametrize("text,field", [b[1:] for b in BAD_SPECS], ids=[b[0] for b in BAD_SPECS])
def test_bad_spec_is_one_line_exit_2_and_creates_nothing(tmp_path, text, field):
    spec = tmp_path / "bad.toml"
    spec.write_text(text + "\n")
    out = tmp_path / "run"
    results = pathlib.Path(__file__).resolve().parents[2] / "results"
    before = sorted(results.iterdir()) if results.exists() else []
    res = CliRunner().invoke(main, ["run", str(spec), "--out", str(out)])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"'{field}'" in lines[0], lines[0]
    assert ";" in lines[0]  # problem; fix
    assert not out.exists()
    assert (sorted(results.iterdir()) if results.exists() else []) == before


@pytest.mark.unit
def test_there_are_at_least_25_distinct_bad_specs():
    assert len({b[1] for b in BAD_SPECS}) >= 25


@pytest.mark.unit
@pytest.mark.parametrize("override,field", [
    ("nosuch.field=1", "nosuch.field"),
    ("training.rounds", "training.rounds"),
    ("topology.k=7", "topology.k"),
])
def test_bad_override_is_rejected(override, field):
    res = CliRunner().invoke(main, ["run", "--set", override, "--dry-run"])
    assert res.exit_code == 2
    assert field in res.stderr


@pytest.mark.unit
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_resolves_and_round_trips_through_toml(preset):
    spec = load(None, PRESETS[preset])
    again = tomllib.loads(spec.to_toml())
    assert again["name"] == spec.name
    assert again["training"]["rounds"] == spec["training"]["rounds"]


@pytest.mark.unit
def test_command_line_overrides_win(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[training]\nrounds = 40\n')
    spec = load(str(f), PRESETS["default"], ["training.rounds=50", "arms=static,dblp"])
    assert spec["training"]["rounds"] == 50
    assert spec.arms == ["static", "dblp"]
    res = CliRunner().invoke(main, ["run", str(f), "--rounds", "7", "--dry-run"])
    assert res.exit_code == 0
    assert "rounds = 7" in res.output


@pytest.mark.unit
@pytest.mark.parametrize("argv", [["--seeds", "0"], ["--seeds", "-1"], ["--set", "seeds=-1"]])
def test_bad_seeds_on_the_command_line_is_one_line_exit_2(argv):
    res = CliRunner().invoke(main, ["run", "--dry-run", *argv])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "spec field 'seeds'" in lines[0], lines
    assert "every arm runs once per seed" in lines[0]


@pytest.mark.unit
def test_seeds_are_the_spec_seed_and_those_after_it():
    res = CliRunner().invoke(main, ["run", "--seed", "7", "--seeds", "3", "--dry-run"])
    assert res.exit_code == 0, res.output
    doc = tomllib.loads(res.output)
    assert (doc["seed"], doc["seeds"]) == (7, 3)
    spec = load(None, PRESETS["default"], ["seed=7", "seeds=3"])
    assert spec.seeds == 3 and spec.seed_values == [7, 8, 9]
    assert load(None, PRESETS["ci"]).seed_values == [load(None, PRESETS["ci"]).seed]
    assert load(None, PRESETS["default"]).seed_values == [1, 2, 3]  # the default repeats
    # One burst schedule per run, from the spec's seed: the same for one seed or many.
    from testbed.rundir import resolve_bursts
    one = load(None, PRESETS["default"], ["seed=7"])
    assert resolve_bursts(spec).to_dict() == resolve_bursts(one).to_dict()
    assert len(resolve_bursts(spec)) > 0


@pytest.mark.unit
def test_spec_error_names_field():
    with pytest.raises(SpecError) as info:
        load(None, PRESETS["default"], ["transport.p_low=1.0"])
    assert info.value.field == "transport.p_low"


@pytest.mark.unit
def test_every_detector_setting_reaches_the_transport_config(tmp_path):
    from testbed.config.arms import ARMS
    from testbed.config.spec import transport_config
    f = tmp_path / "s.toml"
    f.write_text('[transport]\nthreshold = 0.3\ncheck_every = "epoch"\nrounds_per_epoch = 11\n'
                 'norm = "last"\nsignal = "rescaled"\n')
    spec = load(str(f), PRESETS["default"])
    cfg = transport_config(spec["transport"], ARMS["dblp"])
    assert (cfg.threshold, cfg.check_every, cfg.rounds_per_epoch, cfg.norm, cfg.signal) == \
        (0.3, "epoch", 11, "last", "rescaled")
    policy = cfg.make_policy()
    assert (policy.interval, policy.norm) == (11, "last")
    default = transport_config(load(None, PRESETS["default"])["transport"], ARMS["dblp"])
    assert (default.check_every, default.rounds_per_epoch, default.signal) == \
        (10, None, "rescaled")
    # The presets that mirror the paper keep its zero-filled norm (the spec's default).
    for name in ("paper", "ci", "star", "smoke"):
        assert load(None, PRESETS[name])["transport"]["signal"] == "delivered", name


@pytest.mark.unit
def test_readme_counts_the_bad_specs_this_file_checks():
    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    assert f"Bad input: {len({b[1] for b in BAD_SPECS})} distinct bad specs" in page


def test_a_per_epoch_check_must_count_the_workloads_own_epoch():
    """paper-regime checks its phase once per epoch of 31 rounds (6,000 images, 3 workers,
    batches of 64): a rounds_per_epoch that is not the workload's is refused, naming it."""
    spec = load(None, PRESETS["paper-regime"], [])
    assert spec["transport"]["check_every"] == "epoch"
    assert spec["transport"]["rounds_per_epoch"] == 31
    with pytest.raises(SpecError, match=r"transport.rounds_per_epoch.*30 is not the workload's "
                                        r"epoch \(6000 examples / 3 workers / batch 64 = 31 "
                                        r"rounds\).*set transport.rounds_per_epoch = 31"):
        load(None, PRESETS["paper-regime"], ["transport.rounds_per_epoch=30"])
