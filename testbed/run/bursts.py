"""The spec's bursts as one explicit, seeded schedule for every arm.

The generator (`[burst_every]`) and the explicit `[[bursts]]` become one
``controllers.bursts.BurstSchedule`` before the first arm starts, so every
arm is hit at the same rounds by the same bursts; the runner writes it into
`raw/burst_schedule.json` and hands the same document to the controller.
"""
from __future__ import annotations

from controllers.bursts import BurstEvery, BurstSchedule, spec_bursts
from testbed.config.spec import Spec


def resolve_bursts(spec: Spec) -> BurstSchedule:
    return BurstSchedule.resolve(spec_bursts(spec.bursts), BurstEvery(**spec["burst_every"]),
                                 spec["training"]["rounds"], spec.seed)
