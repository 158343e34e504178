"""A helper process of a site's training group (``gpus`` > 1): one of ranks 1..N-1 that rank 0 started.

``python -m surgical_aggregation.training.rank_helper <site spec JSON> <rank> <world size> <store port>``: joins
rank 0's process group, builds the site's data from the same config and vocabulary as rank 0 (the
preprocessing cache rank 0 built is reused), and runs each fit rank 0 announces (``parallel``). It
leaves when rank 0 closes the group or rank 0's process is gone.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import torch.distributed as dist

from ..core.devices import resolve_device
from ..core.errors import UserError
from .config import site_config_from_dict
from .parallel import PARENT_PID_VARIABLE, RankGroup
from .site_data import prepare_site_data
from .trainer import SiteTrainer


def main(argv: list[str] | None = None) -> int:
    spec_file, rank, world, port = (argv if argv is not None else sys.argv[1:])[:4]
    spec = json.loads(Path(spec_file).read_text())
    site, rank = spec["site"], int(rank)
    logging.basicConfig(format=f"%(asctime)s %(levelname)s {site} rank {rank}: %(message)s", stream=sys.stdout)
    log = logging.getLogger(f"surgical_aggregation.{site}.rank{rank}")
    log.setLevel(logging.WARNING)  # rank 0 reports the epochs, for the whole batches
    parent = int(os.environ[PARENT_PID_VARIABLE])
    try:  # the job's aliases as rank 0 loaded them: the helper reads the site's labels as rank 0 does
        config = site_config_from_dict(
            spec["config"], where=f"{site}'s config (rank {rank})", job_aliases=spec["job_aliases"]
        )
        group = RankGroup.connect(rank, int(world), int(port), resolve_device(config.device), parent)
        data = prepare_site_data(config, log)
    except UserError as error:  # rank 0 reports that this helper exited; the reason is this line
        log.error("cannot start: %s", error)
        return 1
    trainer = SiteTrainer(config, data, site, log, group=group)
    group.join()
    while (request := group.next_request()) is not None:
        trainer.apply(request)
        trainer.fit(request.round_number, request.warmup)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
