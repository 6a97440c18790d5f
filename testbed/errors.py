"""The harness's one exception family, and the exit code each member means.

Every error a user can cause or meet is a `TestbedError`: its message is one
actionable line (what is wrong and how to fix it), and `testbed.cli` is the
only place that turns it into that line on stderr and an exit code. Code
below the CLI raises; it never prints an error or calls `sys.exit`.
"""
from __future__ import annotations


class TestbedError(Exception):
    """Base of the family. `exit_code` is what the CLI exits with."""

    exit_code = 2


class InputError(TestbedError):
    """Bad input: a spec, an option, a file or a format version the harness
    cannot use. Nothing was created (exit 2)."""

    exit_code = 2


class MachineError(TestbedError):
    """This machine cannot do what was asked (missing emulator piece, no
    root): exit 2, with the command that fixes it."""

    exit_code = 2


class ExperimentFailed(TestbedError):
    """The experiment ran and failed (an arm did not finish, a regression
    was found): exit 1. Logs and partial results stay on disk."""

    exit_code = 1


class InvalidUnits(ExperimentFailed):
    """The experiment ran to the end, but some unit broke an emulator invariant
    (`testbed.invariants`): its figures are kept, marked, and decide nothing,
    so the run's verdicts may be "not judged" (exit 3, distinct from a failed
    arm's 1). Logs and results stay on disk."""

    exit_code = 3
