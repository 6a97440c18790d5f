"""The harness: CLI, specs, fabric lifecycle, runs, analysis, benchmarks."""
import pathlib

#: The checkout the harness runs from: default run directories live under it,
#: and processes it launches import the project from it.
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
