"""The harness: CLI, specs, fabric lifecycle, runs, analysis, benchmarks."""
import pathlib

#: The checkout (or installation) the harness runs from: processes it launches import
#: the project from it. Default run directories are the working directory's
#: (`testbed.rundir.results_dir`), not its: installed, it is site-packages' parent.
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
