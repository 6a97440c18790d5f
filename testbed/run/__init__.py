"""One experiment from a validated spec to its raw logs: run directory, processes, arms."""
