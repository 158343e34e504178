"""Evaluating models: the metrics (AUROC, BCE), scoring and evaluating model files (``predict``, ``evaluate``), the
summary of a run, and its figures."""
