"""Surgical aggregation for federated, class-heterogeneous chest X-ray classification.

The modules here are plain Python/NumPy/PyTorch/MONAI (no FLARE): labels, data, model,
aggregation, training and metrics. The FLARE layer (``surgical_aggregation.flare``) only
translates between FLARE and these modules.
"""

__version__ = "0.1.0"
