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


def test_the_poc_table_is_its_json_file():
    text = (DOCS / "performance.md").read_text()
    table = text.split("<!-- poc-speed -->")[1].split("<!-- /poc-speed -->")[0]
    summary = json.loads((DOCS / "performance" / "poc_speed.json").read_text())["summary"]
    rows = table.strip().splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == ["quiet", "loaded"]
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        values = summary[cells[0]]
        assert cells[1:] == [
            f"{values['simulator']['images_per_second_median']:.1f}",
            f"{values['poc']['images_per_second_median']:.1f}",
            f"{values['ratio_min']:.2f}",
            f"{values['ratio_median']:.2f}",
            f"{values['simulator']['seconds_median']:.0f}",
            f"{values['poc']['seconds_median']:.0f}",
        ]
        assert 0.9 <= values["ratio_min"] <= values["ratio_median"] <= 1.1  # "as fast in the POC as in the simulator"


def test_the_pages_prose_quotes_the_same_runs():
    """The sentences under the two tables: the trainer's share of the ceiling and the eager step's, the validation's
    rate, the eager step at 64 px and the graph's gain over it, and the POC's extra wall time (its wall median minus
    the simulator's), each from the JSON files the tables come from."""
    text = " ".join((DOCS / "performance.md").read_text().split())
    large, small = (json.loads((DOCS / "performance" / f"h100-{size}px.json").read_text()) for size in (224, 64))

    def median(run: dict, key: str) -> float:
        return run[key]["median"]

    eager_share = median(large, "train_eager_images_per_s") / median(large, "ceiling_images_per_s")
    assert (
        f"At 224 px the trainer's epoch reaches {large['train_over_ceiling']:.0%} of the graph ceiling" in text
        and f"against {eager_share:.0%} for the same trainer stepping eagerly "
        f"({median(large, 'train_eager_images_per_s'):.1f}), and validation runs at "
        f"{median(large, 'validation_images_per_s'):,.0f} images/s"
        in text
    )
    gain = median(small, "train_images_per_s") / median(small, "train_eager_images_per_s")
    assert (
        f"launch-bound several times over ({median(small, 'train_eager_images_per_s'):.0f} images/s) and the graph "
        f"gives {gain:.1f} times that" in text
    )
    summary = json.loads((DOCS / "performance" / "poc_speed.json").read_text())["summary"]
    extra = {load: run["poc"]["seconds_median"] - run["simulator"]["seconds_median"] for load, run in summary.items()}
    assert f"(about {round(extra['quiet'], -1):.0f} s quiet, {round(extra['loaded'], -1):.0f} s loaded)" in text
