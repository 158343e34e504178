"""Training images/s of ``SiteTrainer.fit`` on embedded NIH data, through the API every version of the bundle has.

Not a test. Compare two checkouts on one machine by running it with each on ``PYTHONPATH``, alternating:

    PYTHONPATH=/path/to/other/checkout/custom python benchmarks/trainer_epoch.py other
    python benchmarks/trainer_epoch.py this

64 px, batch 32, 10 batches per epoch, ``workers: 0``; one warm-up epoch, then the median, min and max of 5.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import torch

from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.profiles import DEMO
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import SiteTrainer


def main(label: str) -> None:
    with tempfile.TemporaryDirectory() as cache:
        values = DEMO.site_config(
            {"kind": "nih"},
            embedded={"patients": 150, "image_size": 64},
            image_size=64,
            batch_size=32,
            max_batches_per_epoch=10,
            workers=0,
            cache_dir=cache,
        )
        values["data"]["split_fractions"] = [0.7, 0.3, 0.0]
        config = site_config_from_dict(values)
        trainer = SiteTrainer(config, prepare_site_data(config), "benchmark")
        trainer.fit(0, warmup=False)
        rates = []
        for _ in range(5):
            started = time.perf_counter()
            report = trainer.fit(0, warmup=False)
            rates.append(report.samples / (time.perf_counter() - started))
    print(
        f"{label}: torch threads {torch.get_num_threads()}: median {statistics.median(rates):.1f}, "
        f"min {min(rates):.1f}, max {max(rates):.1f} images/s"
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "this checkout")
