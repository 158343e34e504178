"""Experiment tracking through FLARE's receivers: TensorBoard (the default) or MLflow.

The sites stream their curves with FLARE's ``SummaryWriter``; a receiver on the server writes them.
FLARE's MLflow receiver keeps, unless given a tracking server's URI, an SQLite store ``mlflow.db`` in
the job's run folder on the server (beside ``app_server/``; downloaded with the job in POC and
production).
"""

from __future__ import annotations

TRACKERS = ("tensorboard", "mlflow")
MLFLOW_STORE = "mlflow.db"  # FLARE's MLflowReceiver default, in the server's run folder of the job
