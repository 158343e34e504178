"""What a site received and sent, kept at the site so a hospital can verify what left it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.head import NAMED_HEAD, to_numpy


class ExchangeRecorder:
    """Keeps what a site received and sent each round (head rows with names, or full states).

    Lets a hospital verify what left the site, and lets tests check aggregation end to end.
    """

    def __init__(self, folder: str | Path, what: str = "head") -> None:
        self.folder = Path(folder)
        self.what = what

    def record(self, round_number: int, direction: str, state: Mapping[str, Any], class_names: Sequence[str]) -> None:
        if self.what == "off":
            return
        keys = NAMED_HEAD.keys if self.what == "head" else tuple(state)
        payload = {
            "round": round_number,
            "direction": direction,
            "class_names": list(class_names),
            "state": {key: torch.as_tensor(np.array(to_numpy(state[key]))) for key in keys},
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        torch.save(payload, self.folder / f"round-{round_number:03d}-{direction}.pt")
