"""Builders for tests: inputs whose every answer is known, as click's ``testing`` module is.

`rundirs`: a run directory (raw logs, spec, manifest) with chosen timings;
`captures`: packet captures of it with known counts; `frames`: rounds and
evaluations tables drawn from known truths. The project's tests use them, and
so can a plug-in's (a new arm's analysis, a new figure) without copying them.
"""
