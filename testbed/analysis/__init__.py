"""Raw logs to tables, summary, plots, report and the regression check."""
