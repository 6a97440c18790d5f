"""A torch.distributed backend registered outside the project, in this one file: ``extgloo``.

What a researcher's own c10d backend module does, at its smallest: import
it and ``init_process_group("extgloo")`` works. Its process group is gloo's
(the point is the registration and the spec's ``[ddp.NAME]`` plumbing, not
a new collective), so DDP over it averages exactly as ``ddp-gloo`` does.
Imported by the workers of a ``[ddp.NAME]`` arm with ``module =
"ext_c10d_backend"`` (tests/unit/test_ddp_backends.py puts this folder on
their ``PYTHONPATH``).
"""
from __future__ import annotations

import torch.distributed as dist

BACKEND = "extgloo"


def _create(store, rank: int, size: int, timeout):
    """c10d's creator (the plain API): a gloo process group over the job's store."""
    return dist.ProcessGroupGloo(store, rank, size, timeout)


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
