"""What runs on the emulated hosts: worker and server entry points, models, bundled data,
the loss-tolerance sweep.

Entry points: ``python -m workloads.worker``, ``python -m workloads.server``,
``python -m workloads.loopback`` (all arms on 127.0.0.1) and
``python -m workloads.sweep`` (= ``dblp-testbed sweep``).
"""
