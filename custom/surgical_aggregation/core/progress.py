"""How often long work speaks up when no progress bar is shown (a log file, a site process)."""

PROGRESS_SECONDS = 15.0  # without a progress bar, a log line at least this often
