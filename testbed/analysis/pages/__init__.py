"""The pages' measured tables, rendered from the committed references (runs and commands).

The README and every page under docs/ mark each generated table with a
pair of comments::

    <!-- reference:default arms -->
    | arm | ... |
    <!-- /reference -->

naming the reference folder (``results/reference/default``) and the table.
Each table is rendered by one function of this package, which reads its
reference's folder (a run's summary and tables, or the JSON files of a
command reference); the modules register their renderers by name
(`registry.register`), grouped by what they render:

- `verdicts`: a run's summary.json (arms, verdicts, intervals, CPU budget);
- `rounds`: a run's rounds and evaluations (loss levels, phases, seeds);
- `transport`: a `bench transport` (round trips, the loose bound's speedup);
- `line_rate`: `bench transport` at several link rates over runs;
- `bound_ratio`: the tight bound's round trip over the loose one's over runs
  of `bench transport` (the paper's burst levels, line rate), and the
  sentence on where the paper's range comes from;
- `collectives`: a `bench collectives` (nccl-tests' busbw per collective,
  size, transport and loss);
- `fabric`: `net check` and `bench bursts` (fat-trees, goodput, bursts);
- `every`: the tables of every reference at once (wall times, the
  prototype's costs), whose blocks name ``all`` (`testbed.references.EVERY`);
- `analyses`: the tables the design, ablation and regime analyses render;
- `figures`: a run reference's kept figures, as markdown images.

`markers` is the page assembly: a block whose reference has no folder yet
fails with one line naming the `reproduce` command; `update` rewrites every
marked block from the files; `stale` lists the blocks whose text differs
from what the files give, which is what the pages' test asserts to be
empty. No figure in a marked block is typed by hand, and no image: the figures a
run reference keeps are drawn from its files too (`testbed.analysis.reference_figures`).
"""
# The renderer modules register their tables on import, in this order (the
# order a refusal lists the known tables in), so the order is kept by hand.
# isort: off
from testbed.analysis.pages import (verdicts, rounds, transport, line_rate, bound_ratio,
                                    collectives, fabric, every, analyses, figures)
# isort: on
from testbed.analysis.pages.markers import BLOCK_RE, blocks, render, stale, update
from testbed.analysis.pages.registry import TABLES, register

__all__ = ["BLOCK_RE", "TABLES", "analyses", "blocks", "bound_ratio", "collectives", "every",
           "fabric", "figures", "line_rate", "register", "render", "rounds", "stale", "transport",
           "update", "verdicts"]
