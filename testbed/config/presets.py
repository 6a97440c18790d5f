"""Named experiment presets: partial specs merged over the schema defaults.

`default` is what `dblp-testbed run` does with no argument: the choice a
user faces (gloo's ring against the transport's sharded mode, static and
dblp) on the verdict workload, over three seeds; `paper` mirrors the paper's
set-up (3 workers + 1 server on one switch, five bursts at each of 60-90 %,
both control paths); `paper-prototype` is `paper` with the costs of the
authors' prototype put back (fixed chunk order, 8 KB IP-fragmented chunks,
a fixed 1 s probe wait, Nagle on the TCP control connections, the sender's
100 ms token bucket emptied into default-sized socket buffers, and the rule
that re-probes instead of resending for up to ten probe rounds while the
receiver's bitmap is unchanged: the six prototype-mode settings of
``dblp.TransportConfig``; the fabric raises each host's IP reassembly
limits for the fragmented chunks), so the paper's "up to 5.88x"
burst-round speedup can be told apart from what this transport's own
improvements change. The preset sets all six; the README's table of the
ratio adds the last three (`bucket_s`, `no_progress_probes`, 8 KB
`chunk_bytes`) one at a time with `--set`, each step a run reference of its
own (`testbed.references.PROTOTYPE_COSTS`); `ci` is
the short regression run CI compares against
`results/reference/ci.json`; `star` is the paper's star without bursts, for
accuracy across arms (400 rounds, cosine-annealed rate); `smoke` finishes
in well under a minute per arm. `ci`, `star` and `smoke` keep the digits
CNN: its 109-chunk gradient is quick, but a 0.8 % bound drops nothing from
it, so the verdict presets train `byte_lm` (1,260 chunks).

Rates: the default is sized to a 2-core machine with headroom (CPU busy at
most 75 % in every unit, `testbed.invariants` invalidates a unit above
85 %; docs/results/default.md, "CPU budget"). The fabric's one forwarding
thread costs about three quarters of a core whenever traffic flows, at
20 Mbit/s as at 40 (it polls every port on each wake-up), and each transport
process a share that follows its datagrams; so the default runs three
workers at 20 Mbit/s (a 1.78 MB round about a second) and 40 rounds, where
it ran four at 40 Mbit/s and 80 rounds at 86-100 % CPU busy. Its bursts
last 1.8 s, the second of the old preset scaled with its round. The
one-switch star runs at 100 Mbit/s, where two concurrent flows got 92 %.
Every run checks the emulator's invariants per unit (the bottleneck's rate
while busy and its packet spacing, CPU busy and steal, the pacing error).

The phase detector's signal: `default` uses the drop-corrected norm
(``transport.signal = "rescaled"``); `paper`, `ci`, `star` and `smoke` keep
the paper's zero-filled norm, which they mirror (and which the CI reference
was measured with).

Bursts in the verdict presets last a fixed time from the start of their
round (a second; 1.8 s in the default), the same for every arm: about one loss-free round of the slowest arm,
the paper's "a burst hits about one round", and never cut short by a cap
(a round-locked burst under which a round takes longer than its 3 s cap
measures the cap).
"""

# The paper's topology: 3 workers + 1 server on one switch. The paper states no link rate:
# 20 Mbit/s is this machine's, where the shaped link, not the emulator, is the bottleneck.
PAPER_STAR = {"topology": {"kind": "star", "bw_mbps": 20.0, "queue_pkts": 100},
              "placement": {"workers": 3}}
# The default fabric: k=4 fat-tree, server and workers in different pods.
FAT_TREE = {"topology": {"kind": "fattree", "k": 4, "bw_mbps": 20.0, "queue_pkts": 100},
            "placement": {"workers": 4}}
# The star at the verdict workload's rate (module docstring).
PAPER_STAR_100 = {"topology": {**PAPER_STAR["topology"], "bw_mbps": 100.0},
                  "placement": PAPER_STAR["placement"]}
#: How long a verdict preset's burst lasts (module docstring).
BURST_MS = 1000.0
#: The default preset's burst: BURST_MS scaled with its round (20 Mbit/s, 3 workers).
DEFAULT_BURST_MS = 1800.0


def loss_burst(at_round: int, p: float) -> dict:
    """A loss burst on the server's downlink for the round it hits, 3 s at most."""
    return {"at_round": at_round, "rounds": 1, "kind": "loss", "target": "server-downlink",
            "max_ms": 3000.0, "params": {"p": p}}


def timed_burst(at_round: int, p: float, ms: float = BURST_MS) -> dict:
    """A loss burst on the server's downlink from the start of a round, for ``ms`` (every arm alike)."""
    return {"at_round": at_round, "duration_ms": ms, "kind": "loss", "target": "server-downlink",
            "params": {"p": p}}


#: The paper preset's bursts: 60/70/80/90 % in turn, five of each, every
#: third round from round 16, so a one-second burst never spills into the
#: next burst's round.
PAPER_BURSTS = [timed_burst(16 + 3 * i, (0.6, 0.7, 0.8, 0.9)[i % 4]) for i in range(20)]


PAPER = {
    "name": "paper",
    "description": "the paper's set-up: 3 workers + 1 server on one switch (100 Mbit/s), "
                   "byte-level LM, five 1 s bursts at each of 60/70/80/90 %, "
                   "UDP and TCP control",
    "arms": ["static", "dblp", "static-tcp", "dblp-tcp", "gloo"],
    **PAPER_STAR_100,
    "training": {"model": "byte_lm", "rounds": 80, "eval_every": 10},
    "capture": {"enabled": False},
    "transport": {"p_static": 0.008, "p_low": 0.008, "p_high": 0.408},
    "burst_every": {"enabled": False},
    "bursts": PAPER_BURSTS,
    "seeds": 2,
}


#: The paper-regime reference's bursts: the paper's density (2-3 per 1,000 iterations: three
#: in 1,240 rounds) at three of its levels, each lasting about one loss-free round of the
#: slowest arm (the parameter server's, ~0.25 s at 100 Mbit/s), spread over the relaxed phase.
REGIME_BURSTS = [timed_burst(250, 0.7, ms=300.0), timed_burst(500, 0.9, ms=300.0),
                 timed_burst(1000, 0.8, ms=300.0)]


PAPER_REGIME = {
    "name": "paper-regime",
    "description": "the paper's training regime: 3 workers + 1 server on one switch "
                   "(100 Mbit/s), Fashion-MNIST perceptron trained to its plateau over 40 "
                   "epochs (1,240 rounds, cosine rate), the phase checked once per epoch on "
                   "the drop-corrected norm, three bursts at the paper's density; the paper's "
                   "arms (parameter server: static at P_low, DBLP; gloo reliable) and the "
                   "sharded ones; 5 seeds",
    "arms": ["gloo", "static", "dblp", "static-sharded", "dblp-sharded"],
    **PAPER_STAR_100,
    # 40 epochs of 31 rounds (6,000 training images, 3 workers, batches of 64): the
    # detector checks once per epoch (the paper's rule) and can first relax at the end of
    # the second epoch (its first check only records a norm), so DBLP is relaxed for at
    # most 95 % of its rounds. Each return to critical costs one or two epochs: at 22
    # epochs (the paper-regime-rescaled reference) one return left 86 % and the sharded
    # arms averaged 84 %, short of the paper's mostly relaxed training; 40 epochs leave
    # 90 % after two lost epochs. Evaluated once per epoch on all 10,000 test images.
    "training": {"model": "fmnist_mlp", "batch_size": 64, "rounds": 1240, "eval_every": 31,
                 "lr_schedule": "cosine"},
    "capture": {"enabled": False},
    # The drop-corrected norm (``rescaled``), as the default preset: with the paper's
    # zero-filled one a relaxed epoch's own drops halve its norm past the threshold and
    # send DBLP back to critical (4 seeds of 5 in the paper-regime-delivered reference,
    # 75 % of rounds relaxed), so the bound, not the training, would set the phase.
    "transport": {"p_static": 0.008, "p_low": 0.008, "p_high": 0.408,
                  "check_every": "epoch", "rounds_per_epoch": 31, "signal": "rescaled"},
    "burst_every": {"enabled": False},
    "bursts": REGIME_BURSTS,
    "seeds": 5,
}


PRESETS = {
    "default": {
        "name": "default",
        "description": "k=4 fat-tree, 20 Mbit/s, 3 workers in different pods, byte-level LM "
                       "(1,260 chunks); gloo's ring vs the sharded transport, static and dblp; "
                       "1.8 s 80 % loss bursts on rank 0's downlink every 10 rounds; 3 seeds",
        "arms": ["gloo", "static-sharded", "dblp-sharded"],
        # Sized to a 2-core machine with headroom (CPU busy at most 75 % in
        # every unit; the README's CPU budget): the fabric's one forwarding
        # thread and the transports spend CPU per packet, so CPU per second
        # follows the link rate. Three workers (the paper's count) instead of
        # four and 20 Mbit/s instead of 40; 40 rounds instead of 80 keep the
        # run under ten minutes. The burst grows with the round (1.8 s: a
        # round at 20 Mbit/s with three workers lasts 1.78x one at 40 with
        # four), so it hits the same share of a round: the ratios the
        # verdicts rest on are dimensionless.
        "topology": {**FAT_TREE["topology"], "bw_mbps": 20.0},
        "placement": {"workers": 3},
        "training": {"model": "byte_lm", "rounds": 40, "eval_every": 10},
        # ~1,900 datagrams per host and round: captures of three seeds would
        # be gigabytes to parse; `--set capture.enabled=true` keeps them.
        "capture": {"enabled": False},
        # Evenly spaced (rounds 5, 15, 25, 35), not a random draw: a draw
        # can cluster in one training phase, and DBLP's speedup depends on it.
        "burst_every": {"every": 10, "start_round": 5, "duration_ms": DEFAULT_BURST_MS,
                        "kind": "loss", "target": "server-downlink", "p": 0.8},
        # The detector's drop-corrected signal: with the paper's zero-filled
        # norm a relaxed window cuts the norm by itself and flips the phase
        # back (every seed at round 40 of this preset). The detector ablation
        # on the paper's set-up measured the cost of each (docs/results/paper-prototype.md).
        "transport": {"signal": "rescaled"},
        "seeds": 3,
    },
    "paper": PAPER,
    "paper-regime": PAPER_REGIME,
    # The paper's other bound (its ResNet-50 setting): P_low 2.4 %, P_high
    # 42.4 %, everything else as `paper`. The physics moves the expected
    # speedup band to 1.69-4.35x (bandwidth- to pass-bound).
    "paper-2.4": {**PAPER, "name": "paper-2.4",
                  "description": "the paper preset at the paper's ResNet-50 bounds: "
                                 "P_low 2.4 %, P_high 42.4 %",
                  "transport": {"p_static": 0.024, "p_low": 0.024, "p_high": 0.424}},
    # The paper's set-up with the prototype's costs (module docstring). No gloo
    # arm: it does not use the transport, so it would only repeat `paper`'s.
    "paper-prototype": {**PAPER, "name": "paper-prototype",
                        "description": "the paper preset reproducing the costs of the authors' "
                                       "prototype: fixed chunk order, 8 KB IP-fragmented chunks, "
                                       "a fixed 1 s probe wait, TCP control with Nagle on, a "
                                       "100 ms token bucket into default-sized socket buffers, "
                                       "no resend for up to 10 probe rounds without progress",
                        "arms": ["static", "dblp", "static-tcp", "dblp-tcp"],
                        "transport": {**PAPER["transport"], "chunk_bytes": 8192,
                                      "chunk_order": "fixed", "probe_wait": 1.0, "nagle": True,
                                      "bucket_s": 0.1, "no_progress_probes": 10}},
    "ci": {
        "name": "ci",
        "description": "the short regression run: k=4, 60 rounds, five bursts in rounds "
                       "22-38, where DBLP has left its first critical phase",
        "arms": ["gloo", "static", "dblp"],
        **FAT_TREE,
        "training": {"model": "digits_cnn", "rounds": 60, "eval_every": 20},
        "burst_every": {"enabled": False},
        # The guard is DBLP's speedup in the rounds it may relax: the digits
        # CNN is critical for its first 20 rounds and again when it leaves its
        # plateau around round 40 (a real phase change, not noise).
        # One second each, every arm alike: a round-locked burst ran its whole
        # 3 s cap in gloo's rounds, so the guarded dblp-vs-gloo ratio measured
        # the cap rather than the transports.
        "bursts": [timed_burst(r, 0.8) for r in (22, 26, 30, 34, 38)],
    },
    "star": {
        "name": "star",
        "description": "accuracy check: the paper's star (3 workers + 1 server; 20 Mbit/s, this "
                       "machine's rate: the paper states none), "
                       "no bursts, every transport arm, trained to convergence",
        "arms": ["gloo", "reliable", "static", "dblp"],
        **PAPER_STAR,
        # Final accuracy is compared to a point: with a constant rate two
        # arms that differ only in summation order were up to 4 points apart
        # on the 360 test digits, so the rate anneals to zero (docs/results/star.md).
        "training": {"model": "digits_cnn", "rounds": 400, "eval_every": 50,
                     "lr_schedule": "cosine"},
        "burst_every": {"enabled": False},
        "seeds": 2,
    },
    "smoke": {
        "name": "smoke",
        "description": "seconds: star topology, 12 rounds, one burst; both control paths "
                       "and the sharded mode",
        "arms": ["static", "dblp", "dblp-tcp", "dblp-sharded"],
        **PAPER_STAR,
        "training": {"model": "digits_cnn", "rounds": 12, "eval_every": 6},
        "capture": {"enabled": True},
        "burst_every": {"enabled": False},
        "bursts": [loss_burst(6, 0.8)],
    },
}
