"""A run directory's analysis: one pipeline (`pipeline.py`) from raw/ to tables, summary,
plots and report, and the regression check.

`load_run(DIR)` (testbed.analysis.load) gives a run's tables as DataFrames
for notebooks; it is imported on first use, so importing this package stays
free of pandas.
"""


def __getattr__(name):
    if name == "load_run":
        from testbed.analysis.load import load_run
        return load_run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
