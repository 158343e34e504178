"""docs/performance.md's GPU table quotes the benchmark's own JSON files, figure for figure."""

from __future__ import annotations

import json
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_gpu_table_is_its_json_files():
    text = (DOCS / "performance.md").read_text()
    table = text.split("<!-- gpu-throughput -->")[1].split("<!-- /gpu-throughput -->")[0]
    rows = [line for line in table.strip().splitlines()[2:]]
    assert len(rows) == 2
    for row in rows:
        name = re.search(r"\((performance/[\w.-]+\.json)", row).group(1)
        run = json.loads((DOCS / name).read_text())
        assert run["device"] == "NVIDIA H100 80GB HBM3"
        cells = [cell.strip() for cell in row.strip("|").split("|")][1:]
        expected = [
            f"{run['ceiling_images_per_s']['median']:.1f}",
            f"{run['train_images_per_s']['median']:.1f}",
            f"{run['train_over_ceiling']:.2f}",
            f"{run['train_eager_images_per_s']['median']:.1f}",
            f"{run['validation_images_per_s']['median']:.1f}",
        ]
        assert cells == expected, name
