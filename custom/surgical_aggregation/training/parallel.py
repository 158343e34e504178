"""Several processes training one site's local epochs together (PyTorch DDP), one per GPU.

A site config's ``gpus: N`` (N > 1) makes the site's trainer process rank 0 of a group of N: it starts
N - 1 helper processes (``python -m surgical_aggregation.training.rank_helper``) on the same machine, which load
the site's data from the same config and, for each ``fit``, run the same epochs as rank 0. The site's
GPU count is the site's own setting, like its device: the job does not need to know it, and FLARE talks
to rank 0 alone, whether the trainer runs in FLARE's job process or as an external one.

Every rank reads the same shuffled batch (the loader's order and the augmentation's draws are seeded
alike) and computes the forward and backward pass on its own contiguous rows of it; the loss is scaled
so that DDP's gradient average equals the gradient of the whole batch's masked mean. With BatchNorm
frozen (FedBN+, the papers' backbone) a step is the single-process step; when BatchNorm trains
(FedAvg), CUDA ranks use SyncBatchNorm (the batch statistics of the whole batch), while CPU ranks
(gloo, for tests) normalise with their own rows' statistics and keep rank 0's running statistics.

Rank 0 posts each fit (round, warm-up, the method's site_method, head classes, epochs so far) in the group's
TCP store; helpers poll it and leave when rank 0's process is gone or the group is closed.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..core.errors import SiteConfigError
from ..core.methods import SiteMethod

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"  # the group lives on one machine
HELPER_MODULE = "surgical_aggregation.training.rank_helper"
PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the folder that holds the surgical_aggregation package
PARENT_PID_VARIABLE = "SURGICAL_AGGREGATION_PARENT_PID"  # tells a helper which process is its rank 0
POLL_SECONDS = 0.2
# A collective waits this long for the other ranks (a helper that died shows as this timeout at rank 0).
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
CLOSED = b"closed"


@dataclass(frozen=True)
class RowShard:
    """A rank's rows of every batch when ``world`` processes train on the same batches."""

    rank: int
    world: int

    def rows(self, count: int) -> slice:
        """Contiguous rows, sizes differing by at most one (the first ranks take the extra rows)."""
        base, extra = divmod(count, self.world)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (1 if self.rank < extra else 0))

    def total(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over the ranks (a new tensor)."""
        summed = value.clone()
        dist.all_reduce(summed)
        return summed

    def largest(self, value: torch.Tensor) -> torch.Tensor:
        """``value``'s maximum over the ranks (a new tensor)."""
        largest = value.clone()
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        return largest


@dataclass(frozen=True)
class FitRequest:
    """What a helper needs to run the fit rank 0 is about to run (the weights come by broadcast)."""

    round_number: int
    warmup: bool
    site_method: SiteMethod
    head_classes: list[str]
    epochs_done: int


def check_gpus(gpus: int, device: torch.device, configured: str, where: str = "site config") -> None:
    """``gpus: N`` needs N GPUs from the configured one; on a machine without a GPU it is refused, unless the config
    asks for CPU ranks explicitly (``device: "cpu"``, what tests do)."""
    if gpus <= 1:
        return
    if device.type == "cuda":
        needed = (device.index or 0) + gpus
        if needed > torch.cuda.device_count():
            raise SiteConfigError(
                f"{where}: gpus: {gpus} from device {device} needs {needed} GPUs; this machine has "
                f"{torch.cuda.device_count()}"
            )
    elif configured != "cpu":
        raise SiteConfigError(
            f'{where}: gpus: {gpus}, but this machine has no GPU (device {configured!r} found none): set "gpus": 1, '
            f'or "device": "cpu" to train on {gpus} CPU processes on purpose (tests do)'
        )


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank ``rank``'s device: the GPU ``rank`` places after the configured one; the CPU stays the CPU."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


@dataclass
class RankGroup:
    """This process's place in a site's training group; rank 0 also owns the helpers and the requests."""

    rank: int
    world: int
    store: dist.TCPStore
    device: torch.device
    parent_pid: int | None = None  # a helper's rank 0 process: gone means leave
    helpers: list[subprocess.Popen] = field(default_factory=list)
    folder: Path | None = None  # rank 0: where the helpers' site spec is
    fits: int = 0

    @property
    def shard(self) -> RowShard:
        return RowShard(self.rank, self.world)

    @classmethod
    def start(
        cls, world: int, device: torch.device, helper_spec: dict[str, Any], log: logging.Logger = logger
    ) -> RankGroup:
        """Rank 0: start ``world - 1`` helpers that build the site from ``helper_spec`` (its config as a dict,
        the job's aliases it was loaded with, its name), and join the process group with them."""
        check_gpus(world, device, "cpu" if device.type == "cpu" else str(device))
        store = dist.TCPStore(HOST, 0, world, is_master=True, wait_for_workers=False, timeout=COLLECTIVE_TIMEOUT)
        folder = Path(tempfile.mkdtemp(prefix="surgical-aggregation-ranks-"))
        (folder / "site.json").write_text(json.dumps(helper_spec))
        # the helpers import the very package this process runs (installed, or shipped with the job)
        path = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")]))
        environment = {**os.environ, PARENT_PID_VARIABLE: str(os.getpid()), "PYTHONPATH": path}
        spec = str(folder / "site.json")
        helpers = []
        for rank in range(1, world):
            command = [sys.executable, "-m", HELPER_MODULE, spec, str(rank), str(world), str(store.port)]
            helpers.append(subprocess.Popen(command, env=environment))
        group = cls(0, world, store, rank_device(device, 0), helpers=helpers, folder=folder)
        try:
            group._await_helpers()
        except RuntimeError:
            for helper in helpers:
                helper.kill()
            shutil.rmtree(folder, ignore_errors=True)
            raise
        group._join()
        pids = [helper.pid for helper in helpers]
        log.info("training on %d processes (%s backend): this one and helpers %s", world, backend_for(device), pids)
        return group

    @classmethod
    def connect(cls, rank: int, world: int, port: int, device: torch.device, parent_pid: int) -> RankGroup:
        """A helper: connect to rank 0's store; :meth:`join` once its data are ready."""
        store = dist.TCPStore(HOST, port, world, is_master=False, timeout=COLLECTIVE_TIMEOUT)
        return cls(rank, world, store, rank_device(device, rank), parent_pid=parent_pid)

    def join(self) -> None:
        """A helper, its site's data loaded: tell rank 0 and join the process group."""
        self.store.set(f"ready/{self.rank}", b"1")
        self._join()

    def _await_helpers(self) -> None:
        """Rank 0: wait until every helper has its data ready; one that exits first is an error, not a hang."""
        waiting = {rank: helper for rank, helper in enumerate(self.helpers, start=1)}
        while waiting:
            for rank, helper in list(waiting.items()):
                if self.store.check([f"ready/{rank}"]):
                    del waiting[rank]
                elif helper.poll() is not None:
                    raise RuntimeError(
                        f"training helper rank {rank} (process {helper.pid}) exited with code {helper.returncode} "
                        "before joining; its error is in this site's log"
                    )
            time.sleep(POLL_SECONDS)

    def _join(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend_for(self.device),
            store=self.store,
            rank=self.rank,
            world_size=self.world,
            timeout=COLLECTIVE_TIMEOUT,
        )

    def announce(self, request: FitRequest) -> None:
        """Rank 0: the helpers run this fit too."""
        self.store.set(f"fit/{self.fits}", pickle.dumps(request))
        self.fits += 1

    def next_request(self) -> FitRequest | None:
        """A helper: the next fit, or None once rank 0 closed the group or its process is gone."""
        key = f"fit/{self.fits}"
        while not self.store.check([key]):
            if self.parent_pid is not None and not process_alive(self.parent_pid):
                return None
            time.sleep(POLL_SECONDS)
        value = self.store.get(key)
        self.fits += 1
        return None if value == CLOSED else pickle.loads(value)

    def broadcast_state(self, model: nn.Module) -> None:
        """Every parameter and buffer from rank 0 to the others (the global model rank 0 loaded)."""
        with torch.no_grad():
            for tensor in model.state_dict().values():
                if tensor.is_contiguous():
                    dist.broadcast(tensor, src=0)
                else:  # channels_last weights on a GPU: collectives take contiguous tensors
                    buffer = tensor.contiguous()
                    dist.broadcast(buffer, src=0)
                    tensor.copy_(buffer)

    def parallel(self, model: nn.Module, batchnorm_trained: bool) -> nn.Module:
        """``model`` for this phase's steps: DDP over the group (its trainable parameters as they are now)."""
        if batchnorm_trained and self.device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # shares the parameters and buffers
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, init_sync=False)

    def close(self) -> None:
        """Rank 0: tell the helpers to leave and wait for them."""
        if self.rank != 0:
            return
        self.store.set(f"fit/{self.fits}", CLOSED)
        for helper in self.helpers:
            try:
                helper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                helper.kill()
        dist.destroy_process_group()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return True
