"""docs/performance.md's GPU table quotes the benchmark's own JSON files, figure for figure."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import marked_block

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_gpu_table_is_its_json_files():
    text = (DOCS / "performance.md").read_text()
    table = marked_block(text, "gpu-throughput")
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
    table = marked_block(text, "poc-speed")
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


def test_the_poc_readmes_timing_is_the_poc_speed_record():
    """poc/README.md's wall times for the four commands and for the simulator are the record's quiet medians."""
    record = json.loads((DOCS / "performance" / "poc_speed.json").read_text())
    quiet = record["summary"]["quiet"]
    text = " ".join((DOCS.parent / "poc" / "README.md").read_text().split())
    assert (
        f"took {quiet['poc']['seconds_median']:.0f} s on 2 quiet CPU cores for {record['rounds']} rounds of the main "
        f"job from scratch (`write-job --start scratch`), against {quiet['simulator']['seconds_median']:.0f} s for the "
        f"same rounds in the simulator (medians of {len(record['runs']['quiet'])} runs" in text
    )


def test_the_cpu_table_is_its_json_files():
    """The CPU table's two columns are the two records' medians; the sentence under it gives (b)/(a) from them."""
    text = (DOCS / "performance.md").read_text()
    names = ("cpu-64px", "cpu-64px-1-thread")
    runs = [json.loads((DOCS / "performance" / f"{name}.json").read_text()) for name in names]
    assert [run["device"] for run in runs] == ["CPU (2 threads)", "CPU (1 threads)"]
    rows = marked_block(text, "cpu-throughput").strip().splitlines()[2:]
    keys = ("ceiling_images_per_s", "train_images_per_s", "validation_images_per_s")
    assert [[cell.strip() for cell in row.strip("|").split("|")][1:] for row in rows] == [
        [f"{run[key]['median']:.1f}" for run in runs] for key in keys
    ]
    prose = " ".join(text.split())
    assert f"on {runs[0]['machine']}" in prose
    assert f"(b)/(a) is {runs[0]['train_over_ceiling']:.2f} and {runs[1]['train_over_ceiling']:.2f}" in prose
    assert "--batches 10 --out throughput.json   # CPU, < 1 min" in text and runs[0]["seconds"] < 60


def test_the_flare_overhead_table_is_its_json_file():
    """The simulator's and the bare loop's wall times (median and min) and their ratio are the record's."""
    record = json.loads((DOCS / "performance" / "flare_overhead.json").read_text())
    rows = marked_block((DOCS / "performance.md").read_text(), "flare-overhead").strip().splitlines()[2:]
    cells = [[cell.strip() for cell in row.strip("|").split("|")][1:] for row in rows]
    simulator, bare = record["simulator_seconds"], record["bare_loop_seconds"]
    assert cells == [
        [f"{simulator['median']:.1f}", f"{simulator['min']:.1f}"],
        [f"{bare['median']:.1f}", f"{bare['min']:.1f}"],
        [f"{record['ratio']:.2f}", ""],
    ]
    text = " ".join((DOCS / "performance.md").read_text().split())
    assert len(set(record["rounds"])) == 1 and f"wall time, median of {len(record['rounds'])} (s)" in text
    # the job it ran: the main job's recipe from scratch, as the page describes it
    from surgical_aggregation.flare.recipe import nih_chexpert_recipe
    from surgical_aggregation.training.profiles import SCRATCH

    recipe = nih_chexpert_recipe(start=SCRATCH)
    (patients,) = {config["embedded"]["patients"] for config in recipe.site_configs.values()}
    (size,) = {config["embedded"]["image_size"] for config in recipe.site_configs.values()}
    rounds = recipe.controller_args["num_rounds"]
    assert record["rounds"][0] <= rounds
    assert f"with `--start scratch`: up to {rounds} rounds of {patients} patients a site, {size} px)" in text
    assert (
        f"Over {record['rounds'][0]} rounds the job took {record['ratio'] - 1:.0%} longer in the simulator than in one "
        "loop on 2 cores" in text
    )


def test_the_cache_speed_table_is_its_json_file():
    """docs/data.md's images/s for each path (source, building the cache, reading it, with augmentation) are the
    record's, and the page names the machine and the command that wrote it."""
    record = json.loads((DOCS / "data" / "cache_speed.json").read_text())
    text = (DOCS / "data.md").read_text()
    rows = marked_block(text, "cache-speed").strip().splitlines()[2:]
    rates = list(record["images_per_second"].values())
    # three significant figures: reading the cache is timed over a few milliseconds
    assert [row.strip("|").split("|")[1].strip() for row in rows] == [f"{float(f'{rate:.3g}'):,.0f}" for rate in rates]
    prose = " ".join(text.split())
    assert f"{record['command']} --out docs/data/cache_speed.json" in text
    assert f"([its record](data/cache_speed.json): {record['images']} images, {record['machine']})" in prose


def _minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60} s"


def test_the_report_jobs_timing_is_its_record():
    """docs/reproducing-the-papers.md's times for the report-labelling job, without and with ``-t 2``, its
    aggregations and last validation AUROC, and the embedding's cost are the record's."""
    record = json.loads((DOCS / "report-labeling" / "job_time.json").read_text())
    plain, kept = record["runs"]
    assert (plain["exit_code"], kept["exit_code"]) == (0, 0)
    assert kept["command"].endswith("-t 2")
    text = " ".join((DOCS / "reproducing-the-papers.md").read_text().split())
    assert (
        f"runs in {_minutes(plain['seconds'])} on 2 CPU cores ({plain['aggregations']} aggregations; validation mean "
        f"AUROC {plain['last_round_mean_val_auroc']:.3f} at the last round), or {_minutes(kept['seconds'])} with `-t 2`"
        in text
    )
    assert kept["aggregations"] == plain["aggregations"]
    assert f"(this run's AUROC: {kept['last_round_mean_val_auroc']:.3f})" in text
    embedding = record["embedding"]
    seconds = embedding["seconds"]
    assert (
        f"embeds the {embedding['reports']:,} reports once ({embedding['distinct_texts']:,} distinct texts): "
        f"{seconds['embed']:.0f} s"
        in text
        and f"later runs read the cache in {seconds['read from the cache']:.2f} s" in text
    )
