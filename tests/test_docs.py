"""The documentation's runnable snippet: the main job through its recipe in FLARE's SimEnv, tracked with MLflow,
run as written (with tiny sites), and the MLflow store read back."""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from monai.networks.nets import DenseNet

from surgical_aggregation.core import judging, robust
from surgical_aggregation.core.checks.model import changes_against_the_bar, judged_loss, recalibrated_changes
from surgical_aggregation.core.labels import CHEXPERT_LABELS, NIH_LABELS
from surgical_aggregation.evaluation.run_summary import union_table_lines
from surgical_aggregation.flare.state import START_TIE
from surgical_aggregation.images.names import NETWORK_ARGUMENTS, SMOKE_DENSENET
from surgical_aggregation.training.checkpoint import load_checkpoint

from helpers import REPOSITORY, SNIPPET_RUN, build_snippet_run, built_once, load_benchmark, marked_block

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def snippet_run(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, SNIPPET_RUN, build_snippet_run)


def test_the_recipe_snippet_runs_the_main_job_in_simenv_and_mlflow_reads_it_back(snippet_run):
    app = snippet_run / "nih_chexpert" / "server" / "simulate_job" / "app_server"
    model = load_checkpoint(app / "FL_global_model.pt")
    assert set(model.class_names) == set(NIH_LABELS) | set(CHEXPERT_LABELS)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{app.parent / 'mlflow.db'}")  # FLARE's receiver's default store
    experiment = client.get_experiment_by_name("nih_chexpert")
    runs = client.search_runs([experiment.experiment_id])
    by_site = {run.info.run_name: run for run in runs}
    assert len(runs) == 2 and all(any(site in name for site in ("site-nih", "site-chexpert")) for name in by_site)
    for run in runs:
        for metric in ("global_model/val_loss", "local_model/val_loss", "train/loss"):
            history = client.get_metric_history(run.info.run_id, metric)
            assert sorted(point.step for point in history) == [0, 1], (run.info.run_name, metric)
            assert all(math.isfinite(point.value) for point in history)
        assert client.get_metric_history(run.info.run_id, "train/epoch_loss")  # per epoch, warm-up included


def _marked_block(page: Path, marker: str) -> str:
    return marked_block(page.read_text(), marker)


def _readme() -> str:
    return " ".join((REPOSITORY / "README.md").read_text().split())


def test_the_paired_seed_table_is_the_one_its_runs_give():
    """docs/server-checks.md's label flip under two versions of the rules, seed by seed, as ``benchmarks/attack_suite.py
    --paired docs/attack-suite/paired-seeds.json --write-doc`` writes it, and the sentence that reads it."""
    suite = load_benchmark("attack_suite")
    paired = json.loads((REPOSITORY / "docs" / "attack-suite" / "paired-seeds.json").read_text())
    lines = suite.paired_table(paired["with_rule"], paired["without_rule"], paired["attack"])
    assert _marked_block(REPOSITORY / "docs" / "server-checks.md", suite.PAIRED_MARKER) == "\n".join(lines)
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:-1]]
    gains = sorted(float(row[2]) - float(row[3]) for row in rows)
    assert len(rows) == 6 and sum(gain > 0 for gain in gains) == 5
    assert f"{gains[1]:.3f} to {gains[-1]:.3f} less, one {-gains[0]:.3f} more" in " ".join(
        (REPOSITORY / "docs" / "server-checks.md").read_text().split()
    )


def _suite_rows(suite, runs: dict) -> list[list[str]]:
    """The cells of each row of the suite's table of ``runs``."""
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in suite.table(runs)[2:]]


def _four_sites(rows: list[list[str]]) -> dict[str, list[str]]:
    """The rows of four sites of the suite's default size (references and attacks), by attack."""
    return {row[0]: row for row in rows if row[1].split(" ")[0] == "4" and ";" not in row[1]}


def _replaced_rows(suite, records: tuple[str, ...], references: bool) -> dict[str, dict]:
    """The suite's rows kept in ``records`` (docs/attack-suite) when a stop ran them again; only the references (the
    clean run, the honest sites alone, the placebo) with ``references``."""
    runs = {}
    for record in records:
        runs.update(json.loads((REPOSITORY / "docs" / "attack-suite" / record).read_text()))
    wanted = (*suite.REFERENCES, suite.PLACEBO)
    return {name: run for name, run in runs.items() if not references or run["attack"] in wanted}


def _before_stop_95(suite, references: bool = False) -> dict[str, dict]:
    """The table's three-site runs from scratch (seed 1) as they were before stop 95 ran them again: its references
    only with ``references``."""
    return _replaced_rows(suite, ("three-sites-before-stop95.json",), references)


def _before_stop_97(suite, references: bool = False) -> dict[str, dict]:
    """The table's four- and seven-site runs from scratch (seed 1, 100 patients) as they were before stop 97 ran them
    again under the rules of its day: what the page's earlier accounts of four and seven sites describe; their
    references only with ``references``."""
    runs = _replaced_rows(suite, ("four-sites-before-stop97.json", "seven-sites-before-stop97.json"), references)
    assert all(
        run["sites"] in (4, 7) and run["seed"] == 1 and run.get("start", "scratch") == "scratch"
        for run in runs.values()
    )
    return runs


def _before_stop_98(suite, references: bool = False) -> dict[str, dict]:
    """The table's three-site runs from scratch (seed 1, 100 patients) as stop 95 ran them, before stop 98 ran them
    again on this task's machine and the recalibrated harm test; their references only with ``references``."""
    runs = _replaced_rows(suite, ("three-sites-before-stop98.json",), references)
    assert all(run["sites"] == 3 and run["seed"] == 1 and run["commit"].startswith("42af296") for run in runs.values())
    return runs


def _before_stop_101() -> tuple[dict[str, dict], dict[str, dict]]:
    """docs/attack-suite/results.json's runs with every run stop 101 made (the direction check in the first round
    only) left out and the runs it replaced put back, and stop 102's and stop 103's left out: what the page's accounts
    before stop 101 describe; and stop 101's runs."""
    folder = REPOSITORY / "docs" / "attack-suite"
    runs = json.loads((folder / "results.json").read_text())
    made = {
        name: run
        for name, run in runs.items()
        if run.get("direction_check") == "first_round" and run.get("commit", "").startswith(FIRST_ROUND_COMMIT)
    }
    before = json.loads((folder / "stand-in-before-stop101.json").read_text())
    assert set(before) <= set(made) and all("direction_check" not in run for run in before.values())
    later = {name for name, run in runs.items()
             if run.get("commit", "").startswith((*STOP_102, *AT_STOP_103, STOP_113))}  # fmt: skip
    kept = {name: run for name, run in runs.items() if name not in made and name not in later}
    return {**kept, **before}, made


def _with_two_sites_before_stop_96() -> dict[str, dict]:
    """docs/attack-suite/results.json with its two-site runs (seed 1, both starts) as they were before stop 96 ran them
    again under the first-round direction rule: what the page's accounts of stops 93 to 95 describe."""
    folder = REPOSITORY / "docs" / "attack-suite"
    runs = json.loads((folder / "results.json").read_text())
    before = json.loads((folder / "two-sites-before-stop96.json").read_text())
    assert set(before) == {name for name, run in runs.items() if run["sites"] == 2 and run["seed"] == 1}
    return {**runs, **before}


def test_the_withdrawn_shared_rows_rule_table_is_the_one_its_runs_give():
    """docs/server-checks.md's label flips under the withdrawn shared-rows rule: each row's figures as the suite's table
    computes them from docs/attack-suite/shared-rows-rule.json against this page's references, beside the table's
    label flips before the warm-up rule (docs/attack-suite/before-warmup-rule.json); the seven-site run with two
    flippers lost a site and is no row of it."""
    suite = load_benchmark("attack_suite")
    table_runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    rule_runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "shared-rows-rule.json").read_text())
    references = {name: run for name, run in table_runs.items() if run["attack"] in (*suite.REFERENCES, suite.PLACEBO)}
    # its three-site runs are measured against the references they ran beside, before stop 95 ran that setting again
    references.update(_before_stop_95(suite, references=True))
    references.update(_before_stop_97(suite, references=True))  # and its four-site ones, before stop 97 ran that again
    assert rule_runs["label_flip-7sites-2attackers-seed1"]["absent"] == ["site-nih-1"]
    complete = {name: run for name, run in rule_runs.items() if not run["absent"]}

    def label_flips(runs: dict) -> dict[str, list[str]]:
        return {row[1]: row for row in _suite_rows(suite, runs) if row[0] == "label_flip"}

    before = json.loads((REPOSITORY / "docs" / "attack-suite" / "before-warmup-rule.json").read_text())
    with_rule, without = label_flips({**references, **complete}), label_flips({**references, **before})
    page = (REPOSITORY / "docs" / "server-checks.md").read_text()
    for sites, row in with_rule.items():
        assert row[7] == row[7].split(",")[0] and row[7].startswith("site-nih")  # one site rejected: the flipper
        lowest = row[2].split(",")[0]
        earlier = f"{without[sites][3]}, {without[sites][4]}"
        line = f"| {sites} | the flipper, every round | {lowest} | {row[3]} | {row[4]} | {earlier} |"
        assert line in page, line
    assert sorted(with_rule) == ["3 (1)", "4 (1)", "7 (1)"]


def test_the_centered_clipping_table_and_figures_are_the_ones_its_runs_give():
    """docs/server-checks.md's four-site suite under centered clipping: the table as ``attack_suite.py --table-only
    --write-doc --marker centered-clipping`` writes it from docs/attack-suite/centered-clipping.json, and each figure
    of the sentences that compare it with the geometric median's four-site rows of the suite's table."""
    suite = load_benchmark("attack_suite")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "centered-clipping.json").read_text())
    assert {run["controller"]["robust_aggregation"] for run in runs.values()} == {"centered_clipping"}
    assert _marked_block(REPOSITORY / "docs" / "server-checks.md", "centered-clipping") == "\n".join(suite.table(runs))
    clipped = _four_sites(_suite_rows(suite, runs))
    median_runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    median_runs.update(_before_stop_97(suite))  # the four-site runs these were compared with, before stop 97's
    median = _four_sites(_suite_rows(suite, median_runs))
    attacks = sorted(name for name in clipped if name not in (*suite.REFERENCES, suite.PLACEBO, "clean"))
    assert attacks == ["backdoor", "label_flip", "label_flip_late", "mimic_noised"]  # those that had run at four sites

    def lowest(rows: dict[str, list[str]], name: str) -> str:
        return rows[name][2].split(",")[0]

    def best(name: str, site: str, source: dict) -> str:
        attackers = 0 if name == "clean" else 1
        return f"{source[f'{name}-4sites-{attackers}attackers-seed1']['best_auroc'][site]:.3f}"

    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    copy, median_copy = clipped["mimic_noised"], median["mimic_noised"]
    assert (
        f"`mimic_noised` holds: {lowest(clipped, 'mimic_noised')}, {copy[3]} against its clean run and {copy[4]} "
        f"against the honest sites alone, where the geometric median's run broke through at {median_copy[3]} and "
        f"{median_copy[4]}"
    ) in page
    assert (
        f"end at {lowest(clipped, 'honest_alone')} under centered clipping, {lowest(median, 'honest_alone')} under the "
        f"geometric median, and it is the lone NIH-layout site that loses: {best('honest_alone', 'site-nih-1', runs)} "
        f"against {best('clean', 'site-nih-1', runs)} in its clean run "
        f"({best('honest_alone', 'site-nih-1', median_runs)} against {best('clean', 'site-nih-1', median_runs)} "
        f"under the median; the CheXpert-layout sites "
        f"{best('honest_alone', 'site-chexpert-1', runs)} against {best('clean', 'site-chexpert-1', runs)})"
    ) in page
    assert (
        f"breaks through against the clean run ({clipped['label_flip'][3]}; {median['label_flip'][3]} under the "
        f"geometric median), and `label_flip_late` falls further ({clipped['label_flip_late'][3]}; "
        f"{median['label_flip_late'][3]})"
    ) in page
    rules = (("cc", clipped), ("gm", median))
    holding = {rule: [name for name in attacks if rows[name][10] == "holds"] for rule, rows in rules}
    assert holding == {"cc": ["backdoor", "mimic_noised"], "gm": ["backdoor", "label_flip"]}
    assert "two hold against the clean run under either rule" in page


# the files of the federations under each rule, as docs/server-checks.md's ``--rules`` command names them (a later
# file's run replaces an earlier one's of the same case: the three-site runs of both rules were made on one commit)
RULE_FILES = {
    "geometric_median": [
        "results.json",
        "four-sites-before-stop97.json",
        "four-sites-seed2-geometric-median.json",
        "three-sites-seed1-geometric-median.json",
        "seven-sites-seed1-geometric-median.json",
    ],
    "centered_clipping": [
        "centered-clipping.json",
        "four-sites-seed2-centered-clipping.json",
        "three-sites-seed1-centered-clipping.json",
        "seven-sites-seed1-centered-clipping.json",
    ],
}


def _runs_by_rule() -> dict[str, dict[str, dict]]:
    folder = REPOSITORY / "docs" / "attack-suite"
    return {rule: {k: v for name in names for k, v in json.loads((folder / name).read_text()).items()}
            for rule, names in RULE_FILES.items()}  # fmt: skip


def test_the_rules_table_is_the_one_its_runs_give():
    """docs/server-checks.md's two rules at three and seven sites (seed 1) and four (seeds 1 and 2), as
    ``attack_suite.py --rules ... --write-doc`` writes it, with the command naming the files, and the sentences that
    read and count it."""
    suite = load_benchmark("attack_suite")
    runs = _runs_by_rule()
    for rule, rule_runs in runs.items():
        assert {run["controller"].get("robust_aggregation", "geometric_median") for run in rule_runs.values()
                if (run["sites"], run["seed"]) in ((4, 2), (3, 1), (7, 1))} == {rule}  # fmt: skip
    lines = suite.rules_table(runs, suite.RULES_SITES, list(suite.RULES_ATTACKS))
    assert _marked_block(REPOSITORY / "docs" / "server-checks.md", suite.RULES_MARKER) == "\n".join(lines)
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    command = " ".join(f"{rule}=docs/attack-suite/{name}" for rule, names in RULE_FILES.items() for name in names)
    assert f"--rules {command}" in page
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    by_setting = {(row[0], row[1], row[2]): dict(zip(suite.RULES_ATTACKS, row[5:], strict=True)) for row in rows}
    alone = {(row[0], row[1], row[2]): row[4] for row in rows}
    holding = {rule: sum(cell.endswith("(holds)") for (r, *_), cells in by_setting.items() if r == rule
                         for cell in cells.values()) for rule in runs}  # fmt: skip
    cells = {rule: sum(cell != "—" for (r, *_), cells in by_setting.items() if r == rule for cell in cells.values())
             for rule in runs}  # fmt: skip
    median, clipping = "geometric_median", "centered_clipping"
    assert (
        f"(the honest sites alone {alone[(clipping, '4', '2')]} under centered clipping, {alone[(median, '4', '2')]} "
        f"under the median) and the near-copy broke through the median again "
        f"({by_setting[(median, '4', '2')]['mimic_noised'].split(',')[0]}) but not centered clipping "
        f"({by_setting[(clipping, '4', '2')]['mimic_noised'].split(',')[0]})"
    ) in page
    three = {rule: by_setting[(rule, "3", "1")] for rule in runs}
    assert all(cell.endswith("(breaks through)") for cells in three.values() for cell in cells.values())
    clean = {rule: {attack: cell.split(",")[0] for attack, cell in cells.items()} for rule, cells in three.items()}
    alone3 = {rule: {attack: cell.split(", ")[1].split()[0] for attack, cell in cells.items()}
              for rule, cells in three.items()}  # fmt: skip
    assert (
        f"The near-copy costs an honest site {clean[median]['mimic_noised']} against the clean run under the median "
        f"and {clean[clipping]['mimic_noised']} under centered clipping"
    ) in page
    assert alone[(median, "3", "1")] == alone[(clipping, "3", "1")]
    assert (
        f"still breaks through ({clean[median]['label_flip']} and {clean[clipping]['label_flip']}): the two honest "
        f"sites alone end at {alone[(median, '3', '1')]} under either rule"
    ) in page
    assert alone3[clipping]["label_flip"] == alone3[median]["label_flip"]
    assert (
        f"the label flip holds ({alone3[median]['label_flip']}) and the near-copy does not "
        f"({alone3[median]['mimic_noised']} and {alone3[clipping]['mimic_noised']})"
    ) in page
    seven = {rule: {attack: cell.split(",")[0] for attack, cell in by_setting[(rule, "7", "1")].items()}
             for rule in runs}  # fmt: skip
    assert all(by_setting[(rule, "7", "1")][attack].endswith("(holds)") for rule in runs for attack in seven[rule])
    assert (
        f"The near-copy costs an honest site {seven[median]['mimic_noised']} against the clean run under the median "
        f"and {seven[clipping]['mimic_noised']} under centered clipping, the late label flip "
        f"{seven[median]['label_flip_late']} and {seven[clipping]['label_flip_late']}; the label flip is rejected and "
        f"left out under both ({seven[median]['label_flip']} and {seven[clipping]['label_flip']})"
    ) in page
    assert (
        f"the geometric median holds {holding[median]} of its {cells[median]} cells, "
        f"centered clipping {holding[clipping]} of {cells[clipping]}"
    ) in page


def test_the_four_site_catalogue_figures_are_the_suite_tables():
    """docs/server-checks.md's bullet on the whole catalogue at four sites of 100 patients: each figure as the suite's
    table gives it from docs/attack-suite/results.json, the clean run's rerun from its own file, and the count."""
    suite = load_benchmark("attack_suite")
    results = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    results.update(_before_stop_97(suite))  # the bullet's runs, before stop 97 ran them again
    rows = _four_sites(_suite_rows(suite, results))
    attacks = {name: row for name, row in rows.items() if name not in (*suite.REFERENCES, suite.PLACEBO, "clean")}
    assert sorted(attacks) == sorted(suite.ATTACKS)
    refused = ["sign_flip", "ipm", "opt_ipm", "opt_alie", "inf", "gaussian", "label_flip_quiet"]
    assert len({(rows[name][2], rows[name][3], rows[name][4]) for name in refused}) == 1
    assert all(rows[name][7] == "site-nih-2" for name in refused)
    rerun = json.loads((REPOSITORY / "docs" / "attack-suite" / "clean-4sites-rerun.json").read_text())
    rerun_lowest = min(rerun["clean-4sites-0attackers-seed1"]["best_auroc"].values())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    sign_flip = rows["sign_flip"]
    assert (
        f"each ends at {sign_flip[2].split(',')[0]}, {sign_flip[3]} against the clean run and {sign_flip[4]} against "
        f"the honest sites alone"
    ) in page
    assert f"0.626 against the table's {rows['clean'][2].split(',')[0]}" in page and f"{rerun_lowest:.3f}" == "0.626"
    boosted = rows["backdoor_boosted"]
    assert (
        f"`alie` {rows['alie'][3]}, `mimic` {rows['mimic'][3]} (the copy counted once), `bn_inflate` "
        f"{rows['bn_inflate'][3]}, `backdoor_boosted` {boosted[3]} (success "
        f"{float(boosted[5].split(',')[0]):.1%} against the clean model's {float(rows['clean'][5].split(',')[0]):.1%})"
    ).replace("%", " %") in page
    breaking = {name: row[3] for name, row in attacks.items() if row[10] == "breaks through"}
    holding = sum(row[10] == "holds" for row in attacks.values())
    assert breaking == {"label_flip_late": "-0.055", "mimic_noised": "-0.107"}
    assert f"{holding} of {len(attacks)} hold against the clean run" in page


def test_the_shared_rows_figures_are_the_clean_sweeps():
    """docs/server-checks.md's reading of the clean sweep's ``shared_rows`` records before the warm-up rule (sites with
    five or more shared rows): the first round's range and count, the lowest later value, and the run under the
    withdrawn rule."""
    results = json.loads((REPOSITORY / "docs" / "clean-sweep" / "results.json").read_text())
    first, later = [], []
    for name, result in results.items():
        for round_number, sites in result.get("shared_rows", {}).items():
            for site, record in sites.items():
                if record["rows"] >= 5 and "mean_cosine" not in record:  # recorded before the warm-up rule
                    (first if round_number == "0" else later).append((record["cosine"], name, site, round_number))
    lowest = min(later)
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert (
        f"honest sites with five or more shared rows read {min(first)[0]:.2f} to {max(first)[0]:.2f} "
        f"({len(first)} site-rounds)" in page
    )
    assert f"honest sites down to {lowest[0]:.2f}, seed {lowest[1][-3:]}'s NIH site in round {lowest[3]}" in page
    assert "nih" in lowest[2]
    nih = [results["sweep-165"]["shared_rows"][str(number)]["site-3-nih"]["cosine"] for number in range(5)]
    assert f"seed 165's NIH site {', '.join(f'{value:.2f}' for value in nih)} by round" in page
    with_rule = json.loads((REPOSITORY / "docs" / "clean-sweep" / "shared-rows-rule-seed165.json").read_text())
    refused = with_rule["sweep-165"]["rejections"]
    cosines = [refused[str(number)]["site-3-nih"].split("cosine ")[1].split(" ")[0] for number in (2, 3, 4)]
    assert not refused["0"] and not refused["1"]
    assert f"in rounds 2-4 (cosine {', '.join(cosines)} over 14 rows;" in page


def test_the_attack_suite_table_is_the_one_its_results_give():
    """docs/server-checks.md's attack table, as ``benchmarks/attack_suite.py --table-only --write-doc`` writes it from
    docs/attack-suite/results.json, and the README's counts of its verdicts: against the clean federation of the same
    size and seed, and against its honest sites training alone."""
    suite = load_benchmark("attack_suite")
    results = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    block = _marked_block(REPOSITORY / "docs" / "server-checks.md", suite.MARKER)
    assert block == "\n".join(suite.table(results))
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in block.splitlines()[2:]]
    references = [row for row in rows if row[0] in suite.REFERENCES]
    placebos = [row for row in rows if row[0] == suite.PLACEBO]
    attacks = [row for row in rows if row[0] not in (*suite.REFERENCES, suite.PLACEBO)]
    assert references and all(row[-2] == "runs" for row in references)  # no reference run raised an alarm
    assert all(row[-2] != "no reference run" for row in attacks)
    against_clean = [row[-2] for row in attacks]
    against_alone = [row[-1] for row in attacks if row[-1] != "—"]  # three or more sites
    two_sites = [row for row in attacks if row[1].startswith("2 (")]
    assert all(row[-1] == "—" for row in two_sites) and all(row[-1] != "—" for row in attacks if row not in two_sites)
    two_broken = [row for row in two_sites if row[-2] == "breaks through"]

    def at_two_sites(start: str) -> str:  # each start's two-site runs: those breaking through, those failing closed
        rows = [row for row in two_sites if ("from the stand-in" in row[1]) == (start == "from the stand-in")]
        broken = [row[0] for row in rows if row[-2] == "breaks through"]
        closed = [row[0] for row in rows if row[-2] == "fails closed"]
        listed = f" ({', '.join(broken)})" if broken else ""
        return (
            f"{start} {len(broken)} of {len(rows)} break through{listed}, {len(closed)} "
            f"fail{'s' if len(closed) == 1 else ''} closed"
        )

    assert (f"At two sites (open): {at_two_sites('from scratch')}; {at_two_sites('from the stand-in')}.") in _readme()
    attacked = [run for run in results.values() if run["attack"] not in (*suite.REFERENCES, suite.PLACEBO)]
    assert len(attacked) == len(attacks)

    def spelled(values: set) -> str:  # 3, 4 and 7
        words = [str(value) for value in sorted(values)]
        return ", ".join(words[:-1]) + (" and " if len(words) > 1 else "") + words[-1]

    starts = {suite._size(run)[2] for run in attacked}
    assert starts == {"scratch", "stand-in"}
    assert (
        f"Of [the attack suite's](docs/server-checks.md#attackers-who-know-the-rules) {len(attacks)} attack runs "
        f"({len({row[0] for row in attacks})} attacks; {spelled({run['sites'] for run in attacked})} sites) "
        f"by sites that know these rules, against the clean federation of the same "
        f"size: holds {against_clean.count('holds')}, fails closed {against_clean.count('fails closed')}, breaks "
        f"through {against_clean.count('breaks through')}, did not take {against_clean.count('did not take')}; "
        f"against the honest sites training alone (three or more sites): holds {against_alone.count('holds')}, "
        f"breaks through "
        f"{against_alone.count('breaks through')}, did not take {against_alone.count('did not take')}; its "
        f"{len(references)} reference runs raised no alarm; a placebo (an honest site with another seed) moved the "
        f"honest sites by {', '.join(row[3] for row in placebos)} (the noise floor)" in _readme()
    )
    assert len(against_clean) == sum(against_clean.count(word) for word in ("holds", "fails closed", "breaks through",
                                                                           "did not take"))  # fmt: skip
    by_setting = {(run["attack"], suite.setting_of(run)): run for run in attacked}

    def broke(row: list[str]) -> str:  # a backdoor by its success above the honest sites alone's, else by AUROC
        run = by_setting[(row[0], row[1])]
        if row[0].startswith("backdoor"):
            return f"{suite.backdoor_above(run, suite.alone_of(results, run)):+.3f}"
        return row[4]

    breaking: dict[str, list[str]] = {}  # attack -> its runs' figures, in the table's order (the settings: the page)
    for row in attacks:
        if row[-1] == "breaks through":
            breaking.setdefault(row[0], []).append(broke(row))
    listed = "; ".join(
        f"{attack} {', '.join(figures)}{' (success)' if attack.startswith('backdoor') else ''}"
        for attack, figures in breaking.items()
    )
    assert f"Breaking through against the honest sites alone (open): {listed}." in _readme()
    # the bold summary above names as many runs and each kind of them (a kind not named here fails: name it there)
    kinds = {  # a backdoor with any trigger is a backdoor
        "backdoor": ("a backdoor", "backdoors"),
        "backdoor_glyph": ("a backdoor", "backdoors"),
        "label_flip_late": ("a late label flipper", "late label flippers"),
        "mimic_noised": ("a near-copy", "near-copies"),
    }
    broken = [row[0] for row in attacks if row[-1] == "breaks through"]
    family = [kinds[kind][0] for kind in broken]
    named = [kinds[kind][family.count(kinds[kind][0]) > 1] for kind in dict.fromkeys(broken)]
    named = list(dict.fromkeys(named))
    summary = (
        f"except in the {len(broken)} attack runs of three or more sites named below ({', '.join(named)}) and "
        f"{len(two_broken)} of two sites.**"
    )
    assert summary in _readme()
    assert (REPOSITORY / "docs" / "attack-suite" / "margins.png").is_file()


def test_the_clean_sweep_table_is_the_one_its_results_give():
    """docs/server-checks.md's clean-sweep table, as ``benchmarks/clean_sweep.py --table-only --write-doc`` writes it
    from docs/clean-sweep/results.json, and the README's count of its false alarms with their exact bound."""
    sweep = load_benchmark("clean_sweep")
    results = json.loads((REPOSITORY / "docs" / "clean-sweep" / "results.json").read_text())
    assert _marked_block(REPOSITORY / "docs" / "server-checks.md", sweep.MARKER) == "\n".join(sweep.table(results))
    stops = sum(result["exit_code"] != 0 for result in results.values())
    excluded = sum(any(result["excluded"].values()) for result in results.values())
    assert sweep.CONSORTIUM in results  # the README's consortium command among them
    fresh = {name: result for name, result in results.items() if sweep.out_of_sample(name, result)}
    fresh_stops = sum(result["exit_code"] != 0 for result in fresh.values())
    fresh_excluded = sum(any(result["excluded"].values()) for result in fresh.values())
    fresh_rejected = sum(bool(result["rejected"]) for result in fresh.values())
    assert (
        f"of {len(results)} honest ones drawn at random (the consortium job among them), "
        f"{stops} stopped and {excluded} left a site out; of the {len(fresh)} on which no rule was set, "
        f"{fresh_stops} stopped and {fresh_excluded} left a site out (at most "
        f"{_bound_up(sweep.upper_bound(fresh_stops, len(fresh)))} and "
        f"{_bound_up(sweep.upper_bound(fresh_excluded, len(fresh)))}, "
        f"95 % exact bounds), and in {fresh_rejected} the update checks refused an honest site's results" in _readme()
    )


def test_the_clean_sweeps_reading_is_its_results():
    """docs/server-checks.md's reading of the sweep: how many federations set no rule, which of them are seven public
    sites, their exact bound; and that the initial model's bar for the first best, which came after most runs, would
    have changed none of them (each run has a trained round whose judged loss clears it, by the page's margin)."""
    sweep = load_benchmark("clean_sweep")
    results = json.loads((REPOSITORY / "docs" / "clean-sweep" / "results.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    fresh = {name: result for name, result in results.items() if sweep.out_of_sample(name, result)}
    alarms = [name for name, result in fresh.items() if result["exit_code"] or any(result["excluded"].values())]
    assert not alarms and not any(result["rejected"] for result in fresh.values())
    public_seven = [
        str(result["federation"]["seed"])
        for name, result in sorted(fresh.items())
        if name != sweep.CONSORTIUM
        and result["federation"]["scheme"] == "public"
        and len(result["federation"]["sites"]) == 7
    ]
    assert (
        f"Of the {len(fresh)} federations that set no rule (seven-site public ones among them: the consortium job and "
        f"seeds {', '.join(public_seven[:-1])} and {public_seven[-1]}), none stopped, none left an honest site out and "
        f"none had an honest site's result refused: at most {_bound_up(sweep.upper_bound(0, len(fresh)))} each" in page
    )
    min_delta = json.loads((REPOSITORY / "jobs" / "cxr_consortium" / "app_server" / "config" / "config_fed_server.json")
                           .read_text())["workflows"][0]["args"]["min_delta"]  # fmt: skip
    margins = {}
    for name, result in results.items():
        losses = {
            round_number: judged_loss({site: metrics.get("val_loss") for site, metrics in sites.items()})[0]
            for round_number, sites in result["validations"].items()
        }
        initial = losses.pop("-1")
        margins[name] = initial - min(losses.values())
    closest = min(margins, key=margins.get)
    assert all(margin > min_delta for margin in margins.values())
    assert f"(closest: {closest}, {margins[closest]:.3f} below it)" in page


def _warmup_rule_figures() -> dict[str, str]:
    """The figures docs/server-checks.md gives for the warm-up rows rule, from the stored suite and sweep runs."""
    suite = load_benchmark("attack_suite")
    sweep = load_benchmark("clean_sweep")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    runs.update(_before_stop_95(suite))  # the section's three-site runs are those before stop 95 ran them again
    runs.update(_before_stop_97(suite))  # and its four-site ones, before stop 97's
    # the section's runs: the suite's default size (the three-site runs at 400 patients have their own section)
    flips = {
        name: run
        for name, run in runs.items()
        if run["attack"].startswith("label_flip") and suite._size(run) == (suite.PATIENTS, suite.ROUNDS, suite.SCRATCH)
    }

    def margins(attack: str, sites: int, attackers: int) -> str:
        run = runs[f"{attack}-{sites}sites-{attackers}attackers-seed1"]
        clean = suite.lowest_margin(run, suite.clean_of(runs, run))
        alone = suite.lowest_margin(run, suite.alone_of(runs, run))
        return f"{clean:+.3f} against the clean run, {alone:+.3f} against the honest sites alone"

    def spread(values: list[float]) -> str:
        return f"{min(values):.2f} to {max(values):.2f}"

    def warmup(run: dict, hostile: bool) -> list[float]:
        return [
            record["mean_cosine"]
            for site, record in run["shared_rows"]["0"].items()
            if (site in run["attacking_sites"]) == hostile
        ]

    early = [run for run in flips.values() if run["attack"] != "label_flip_late"]
    late_seven = runs["label_flip_late-7sites-1attackers-seed1"]
    late = [run for run in flips.values() if run["attack"] == "label_flip_late"]
    later_rounds = [(run, sites) for run in late for number, sites in run["shared_rows"].items() if number != "0"]
    hostile = [
        record for run, sites in later_rounds for site, record in sites.items() if site in run["attacking_sites"]
    ]
    honest = [
        record for run, sites in later_rounds for site, record in sites.items() if site not in run["attacking_sites"]
    ]
    sweep_runs = json.loads((REPOSITORY / "docs" / "clean-sweep" / "results.json").read_text())
    warmup_runs = json.loads((REPOSITORY / "docs" / "clean-sweep" / "warmup-rounds.json").read_text())
    sweep_runs = {name: run for name, run in sweep_runs.items() if sweep.out_of_sample(name, run)}
    judged = [
        record["mean_cosine"]
        for run in [*sweep_runs.values(), *warmup_runs.values()]
        for record in run.get("shared_rows", {}).get("0", {}).values()
        if "mean_cosine" in record and record["rows"] >= 5  # the runs under the rule, the sites it judged
    ]
    rejected = sum(value <= 0 for value in judged)  # the rule's decision on each
    both = [  # honest sites' round 0 under the rule, at 0.89 or more concatenated: how far the mean lies from it
        abs(record["mean_cosine"] - record["cosine"])
        for run in [*early, *late, *sweep_runs.values(), *warmup_runs.values()]
        for site, record in run.get("shared_rows", {}).get("0", {}).items()
        if "mean_cosine" in record and record["rows"] >= 5 and record["cosine"] >= 0.89
        and site not in run.get("attacking_sites", [])
    ]  # fmt: skip
    return {
        "WARMUPS": str(len(warmup_runs)),
        "AGREE": f"{max(both):.2f}",
        "AGREECOUNT": str(len(both)),
        "JUDGED": str(len(judged)),
        "SPREAD": spread(judged),
        "BOUND": f"{_bound_up(sweep.upper_bound(rejected, len(judged)))}",
        "FLIPPERS": spread([value for run in early for value in warmup(run, True)]),
        "HONEST": spread([value for run in early for value in warmup(run, False)]),
        "FOUR": margins("label_flip", 4, 1),
        "SEVENTWO": margins("label_flip", 7, 2),
        "SEVENONE": margins("label_flip", 7, 1),
        "THREE": margins("label_flip", 3, 1),
        "LATETHREE": margins("label_flip_late", 3, 1),
        "LATEFOUR": margins("label_flip_late", 4, 1),
        "LATESEVEN": margins("label_flip_late", 7, 1),
        "LATESEVENVERDICT": suite.verdict(late_seven, suite.clean_of(runs, late_seven)),
        "LATEROWS": spread([record["mean_cosine"] for record in hostile]),
        "LATESCALE": spread([record["scale"] for record in hostile]),
        "HONESTSCALE": spread([record["scale"] for record in honest]),
    }


def _judged_row_turns(run: dict) -> dict[str, dict[str, dict]]:
    """round -> site -> record, for a run's site-rounds past the site's first round (its warm-up) whose rows turned back
    were counted (``below_zero``, recorded since stop 70)."""
    judged: dict[str, dict[str, dict]] = {}
    seen: set[str] = set()
    for number in sorted(run.get("row_turns", {}), key=int):
        for site, record in sorted(run["row_turns"][number].items()):
            if site in seen and "below_zero" in record:
                judged.setdefault(number, {})[site] = record
            seen.add(site)
    return judged


def _withdrawn_rule_names(sites: dict[str, dict], rounds: int) -> list[str]:
    """What the withdrawn turned-back rows rule named in one round: each site's count of rows back tested against
    Binomial(rows, 1/2), one-sided, Holm at the round's share of the job's rate; none when half or more would be."""
    from surgical_aggregation.core.judging import holm, round_level

    p_values = {
        site: sum(math.comb(record["rows"], count) for count in range(record["below_zero"], record["rows"] + 1))
        / 2 ** record["rows"]
        for site, record in sites.items()
    }
    named = holm(p_values, round_level(rounds))
    return [] if 2 * len(named) >= len(p_values) else named


def test_the_withdrawn_turned_back_rules_figures_are_the_runs():
    """docs/server-checks.md's section on the withdrawn turned-back rows rule, figure by figure: its suite runs
    (docs/attack-suite/turned-back-rule.json, against the table's references) and the clean sweep's records."""
    suite = load_benchmark("attack_suite")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    runs.update(_before_stop_95(suite, references=True))  # the references its three-site run ran beside
    runs.update(_before_stop_97(suite, references=True))  # and its four-site one
    rule_runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "turned-back-rule.json").read_text())
    sweep_runs = json.loads((REPOSITORY / "docs" / "clean-sweep" / "results.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())

    def margins(run: dict) -> str:
        clean = suite.lowest_margin(run, suite.clean_of(runs, run))
        alone = suite.lowest_margin(run, suite.alone_of(runs, run))
        return f"{clean:+.3f} against the clean run, {alone:+.3f} against the honest sites alone"

    late = {sites: rule_runs[f"label_flip_late-{sites}sites-1attackers-seed1"] for sites in (3, 4, 7)}
    records = [(run, site, record) for run in late.values() for rounds in _judged_row_turns(run).values()
               for site, record in rounds.items()]  # fmt: skip
    hostile = {f"{r['below_zero']} of {r['rows']}" for run, site, r in records if site in run["attacking_sites"]}
    along = ", -".join(
        f"{-r['mean_cosine']:.2f} at {sites}"
        for sites, run in zip(("three sites", "four", "seven"), late.values(), strict=True)
        for rounds in _judged_row_turns(run).values()
        for site, r in rounds.items()
        if site in run["attacking_sites"]
    )
    assert f"the suite's flipper, in round 1: mean cosine -{along})" in page
    honest = [r["below_zero"] / r["rows"] for run, site, r in records if site not in run["attacking_sites"]]
    assert all(run["excluded"] == run["attacking_sites"] for run in late.values())
    assert (
        f"the flipper's rows turned back {', '.join(sorted(hostile))} in round 1, the honest sites' "
        f"{min(honest):.0%} to {max(honest):.0%}, and it was left out from round 1: at three sites "
        f"({margins(late[3])}), at four ({margins(late[4])}) and at seven ({margins(late[7])})"
    ) in page
    recorded = {  # the seeds that section read (stop 92's two-site draws, 300 on, came after it)
        name: run for name, run in sweep_runs.items() if _judged_row_turns(run) and run["federation"]["seed"] < 300
    }
    seeds = sorted(run["federation"]["seed"] for run in recorded.values())
    assert seeds[0] == 174 and f"On the clean sweep's seeds {seeds[0]}-{seeds[-1]}" in page
    assert not any(
        _withdrawn_rule_names(sites, run["federation"]["rounds"])
        for run in recorded.values()
        for sites in _judged_row_turns(run).values()
    )  # it named no site
    seed_181 = _judged_row_turns(sweep_runs["sweep-181"])["4"]
    counts = [(seed_181[site]["below_zero"], seed_181[site]["rows"]) for site in sorted(seed_181)]
    assert counts == [(2, 10), (4, 10), (5, 9), (4, 9)]  # site-3-nih: half or more of five or more rows
    assert "seed 181, site-3-nih, 5 of 9 rows back in round 4, the other sites 2 of 10, 4 of 10 and 4 of 9" in page
    one_row = [
        [
            record["below_zero"]
            for rounds in _judged_row_turns(run).values()
            for s, record in rounds.items()
            if s == site
        ]
        for run in recorded.values()
        for site in {s for rounds in _judged_row_turns(run).values() for s, r in rounds.items() if r["rows"] == 1}
    ]
    every, never = sum(all(turns) for turns in one_row), sum(not any(turns) for turns in one_row)
    assert (len(one_row), every, never) == (8, 6, 2)
    assert (
        "of the sweep's eight one-row sites (seeds 177, 182, 185, 188 and 189), six turned back in every round judged "
        "and two (seed 188's) in none" in page
    )


def test_the_warm_up_rules_figures_are_the_runs():
    """docs/server-checks.md's section on the warm-up rows rule, figure by figure, from the suite's label-flip runs
    and the clean sweep's federations run under the rule (docs/attack-suite/results.json, docs/clean-sweep/...)."""
    figures = _warmup_rule_figures()
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    for sentence in (
        "and the first round of {WARMUPS} more",
        "the runs under the rule read a mean within {AGREE} of the concatenated figure at every honest site of 0.89 or "
        "more ({AGREECOUNT} site-rounds)",
        "{JUDGED} honest site-rounds judged (five or more shared rows), mean cosine {SPREAD}, none at 0 or below: at "
        "most {BOUND} per judged honest site",
        "its round-0 mean cosine {FLIPPERS} against the honest sites' {HONEST}",
        "`label_flip` holds at four sites ({FOUR}), with two flippers of seven ({SEVENTWO}) and with one of seven "
        "({SEVENONE})",
        "the honest sites end no lower than the honest sites alone ({THREE})",
        "it breaks through at three sites ({LATETHREE}) and at four against the clean run ({LATEFOUR}); at seven sites "
        "it {LATESEVENVERDICT} ({LATESEVEN})",
        "Its later rounds' mean cosine ({LATEROWS})",
        "(`scale`, {LATESCALE}) does not separate it from the honest sites of the same runs ({HONESTSCALE})",
    ):
        assert sentence.format(**figures) in page, sentence.format(**figures)


def test_the_three_site_runs_at_400_patients_are_the_pages_figures():
    """docs/server-checks.md's section on three sites of 400 patients and 5 rounds, figure by figure, from
    docs/attack-suite/results.json and the run of ``mimic`` before its copy was counted once in the direction check's
    consensus (docs/attack-suite/mimic-copy-in-consensus.json)."""
    suite = load_benchmark("attack_suite")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    before = json.loads((REPOSITORY / "docs" / "attack-suite" / "mimic-copy-in-consensus.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    run = {attack: runs[f"{attack}-3sites-{0 if attack == 'clean' else 1}attackers-seed1-400p5r"]
           for attack in ("clean", "honest_alone", "placebo", "sign_flip", "label_flip", "alie", "mimic_noised",
                          "label_flip_late", "backdoor")}  # fmt: skip

    def against_clean(attack: str) -> str:
        return f"{suite.lowest_margin(run[attack], run['clean']):+.3f}"

    assert f"leaving one of three sites out costs {-float(against_clean('honest_alone')):.3f}" in page
    assert f"the placebo moved the honest sites by {against_clean('placebo')}" in page
    refused = [runs[f"{attack}-3sites-1attackers-seed1-400p5r"] for attack in ("sign_flip", "ipm", "inf")]
    assert {f"{suite.lowest_margin(other, run['clean']):+.3f}" for other in refused} == {against_clean("honest_alone")}
    assert all(other["rejected"] == ["site-nih-2"] for other in refused)
    assert against_clean("label_flip") == against_clean("honest_alone")
    assert run["label_flip"]["excluded"] == ["site-nih-2"]
    assert f"at the honest sites alone ({against_clean('sign_flip')}), `alie` ({against_clean('alie')})" in page
    assert f"`mimic_noised` ({against_clean('mimic_noised')}: " in page
    assert run["mimic_noised"]["excluded"] == ["site-chexpert-1"]
    assert f"`label_flip_late` ({against_clean('label_flip_late')}: " in page
    backdoor, clean = run["backdoor"]["best_backdoor_success"], run["clean"]["best_backdoor_success"]
    assert (
        f"{backdoor:.1%} of the honest sites' triggered test negatives score above the model's 95th percentile, "
        f"against {clean:.1%} for the clean model, with the clean images' AUROC unchanged ({against_clean('backdoor')})"
    ).replace("%", " %") in page
    mimic = before["mimic-3sites-1attackers-seed1-400p5r"]
    assert mimic["rejected"] == ["site-nih-1"] and mimic["exit_code"] == 2 and not mimic["published"]
    assert mimic["stopped"].startswith("the global model after round 4 harms a site: for site-nih-2")
    assert f"the job stopped (exit {mimic['exit_code']}, nothing published" in page
    after = runs["mimic-3sites-1attackers-seed1-400p5r"]
    assert after["exit_code"] == 0 and after["rejected"] == after["excluded"] == []
    margin = suite.lowest_margin(after, run["clean"])
    assert f"nothing rejected or left out, {margin:+.3f} against the clean run" in page
    names = ("opt_ipm", "opt_alie", "gaussian", "label_flip_quiet", "backdoor_boosted", "bn_inflate")
    six = {attack: runs[f"{attack}-3sites-1attackers-seed1-400p5r"] for attack in names}
    for attack in ("opt_ipm", "opt_alie", "gaussian", "label_flip_quiet"):
        assert f"{suite.lowest_margin(six[attack], run['clean']):+.3f}" == against_clean("honest_alone"), attack
        assert six[attack]["rejected"] == ["site-nih-2"] and suite.verdict(six[attack], run["clean"]) == "holds"
    assert six["label_flip_quiet"]["excluded"] == ["site-nih-2"]
    assert f"`bn_inflate` holds ({suite.lowest_margin(six['bn_inflate'], run['clean']):+.3f}: " in page
    boosted = six["backdoor_boosted"]
    success = [boosted["best_backdoor_success"], run["clean"]["best_backdoor_success"]]
    assert (
        suite.verdict(boosted, run["clean"]) == "breaks through"
        and suite.verdict(boosted, run["honest_alone"]) == "holds"
    )
    assert (
        f"its success is {success[0]:.1%} against the clean model's {success[1]:.1%} "
        f"({100 * (success[0] - success[1]):.1f} points; against the honest sites alone, "
        f"{run['honest_alone']['best_backdoor_success']:.1%}, it holds), AUROC "
        f"{suite.lowest_margin(boosted, run['clean']):+.3f}"
    ).replace("%", " %") in page


def test_the_backdoor_defences_tried_at_400_patients_are_the_pages_figures():
    """The noise on the aggregate (docs/attack-suite/update-noise.json: the clean run and the backdoor with
    ``update_noise`` 0.001) against the runs without it, and the pruning look's table (docs/attack-suite/pruning.json),
    as docs/server-checks.md gives them."""
    suite, pruning = load_benchmark("attack_suite"), load_benchmark("backdoor_pruning")
    plain = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    noised = json.loads((REPOSITORY / "docs" / "attack-suite" / "update-noise.json").read_text())
    clean, backdoor = "clean-3sites-0attackers-seed1-400p5r", "backdoor-3sites-1attackers-seed1-400p5r"
    assert set(noised) == {clean, backdoor}
    assert {run["controller"]["update_noise"] for run in noised.values()} == {0.001}
    page = (REPOSITORY / "docs" / "server-checks.md").read_text()
    text = " ".join(page.split())
    assert f"the clean run lost at most {-suite.lowest_margin(noised[clean], plain[clean]):.3f} against" in text
    success = noised[backdoor]["best_backdoor_success"], noised[clean]["best_backdoor_success"]
    assert f"success was {success[0]:.1%} against the noised clean model's {success[1]:.1%}".replace("%", " %") in text
    assert suite.verdict(noised[backdoor], noised[clean]) == "breaks through"
    assert f"(clean AUROC {suite.lowest_margin(noised[backdoor], noised[clean]):+.3f})" in text
    results = json.loads((REPOSITORY / "docs" / "attack-suite" / "pruning.json").read_text())
    block = marked_block(page, pruning.MARKER)
    assert block == "\n".join(pruning.table(results))
    attacked, baseline = results.values()
    half = next(index for index, row in enumerate(attacked) if row["rate"] == 0.5)
    assert attacked[half]["backdoor_success"] <= attacked[0]["backdoor_success"] / 2 + 0.02  # "halves"
    assert attacked[half]["mean_auroc"] >= attacked[0]["mean_auroc"] - 0.005  # "at no AUROC cost"
    above = [hit["backdoor_success"] - base["backdoor_success"] for hit, base in zip(attacked, baseline, strict=True)]
    assert min(above) > 0.05  # "no rate brings it within 5 points"


def test_the_coordinate_median_and_the_robust_learning_rate_against_the_backdoor_are_the_pages_figures():
    """docs/server-checks.md on the backdoor at three sites of 400 patients under the coordinate-wise median
    (docs/attack-suite/coordinate-median.json) and the robust learning rate (robust-learning-rate.json): each run's
    setting, the clean runs' cost, the backdoor's success against its clean run, the excluded honest site."""
    suite = load_benchmark("attack_suite")
    folder = REPOSITORY / "docs" / "attack-suite"
    plain = json.loads((folder / "results.json").read_text())
    median = json.loads((folder / "coordinate-median.json").read_text())
    voted = json.loads((folder / "robust-learning-rate.json").read_text())
    clean, backdoor = "clean-3sites-0attackers-seed1-400p5r", "backdoor-3sites-1attackers-seed1-400p5r"
    assert set(median) == set(voted) == {clean, backdoor}
    assert all(run["controller"] == {"robust_aggregation": "median"} for run in median.values())
    assert all(run["controller"] == {"robust_learning_rate": 2} for run in voted.values())
    text = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())

    def success(runs: dict) -> str:
        found = runs[backdoor]["best_backdoor_success"], runs[clean]["best_backdoor_success"]
        return f"{found[0]:.1%} against".replace("%", " %"), f"{found[1]:.1%}".replace("%", " %")

    cost = -suite.lowest_margin(median[clean], plain[clean])
    assert f"the clean run lost at most {cost:.3f} against the clean run under the geometric median" in text
    attacked, reference = success(median)
    assert f"the backdoor's success was {attacked} that clean model's {reference} (clean AUROC " in text
    assert f"AUROC {suite.lowest_margin(median[backdoor], median[clean]):+.3f}): it breaks through, by less" in text
    assert suite.verdict(median[backdoor], median[clean]) == "breaks through"
    pruned = json.loads((folder / "pruning-median.json").read_text())
    assert [run["rate"] for run in pruned[backdoor]] == [run["rate"] for run in pruned[clean]] == [0.0, 0.5, 0.9]
    assert pruned[backdoor][0]["backdoor_success"] == median[backdoor]["best_backdoor_success"]  # the same model
    rates = dict(zip([0.0, 0.5, 0.9], zip(pruned[backdoor], pruned[clean], strict=True), strict=True))
    (half, half_clean), (most, most_clean) = rates[0.5], rates[0.9]
    found = [f"{run['backdoor_success']:.1%}".replace("%", " %") for run in (half, most, half_clean, most_clean)]
    assert f"leaves {found[0]} at half the channels and {found[1]} at 90 %, against the clean model's {found[2]}" in (
        text
    )
    assert f"and {found[3]} at the same rates: layered, the two do not come within 5 points" in text
    assert min(hit["backdoor_success"] - base["backdoor_success"] for hit, base in rates.values()) > 0.05
    assert f"lost {-suite.lowest_margin(voted[clean], plain[clean]):.3f} against the clean run without it" in text
    assert voted[clean]["excluded"] == [] and voted[backdoor]["excluded"] == ["site-chexpert-1"]
    attacked, reference = success(voted)
    assert f"the backdoor's success was {attacked} the clean model's {reference} (exit 0; clean AUROC " in text
    assert voted[backdoor]["exit_code"] == 0
    assert f"clean AUROC {suite.lowest_margin(voted[backdoor], voted[clean]):+.3f})" in text
    two = json.loads((folder / "robust-learning-rate-two-voters.json").read_text())
    assert set(two) == {clean, backdoor}
    assert all(run["controller"] == {"robust_learning_rate": 2} for run in two.values())
    assert two[clean]["excluded"] == two[backdoor]["excluded"] == ["site-chexpert-1"]
    assert f"against the clean run without the vote: {-suite.lowest_margin(two[clean], plain[clean]):.3f})" in text
    attacked, reference = success(two)
    assert f"with a success of {attacked} that clean model's {reference} (clean AUROC " in text
    assert f"AUROC {suite.lowest_margin(two[backdoor], two[clean]):+.3f}). Both forms break through" in text
    assert suite.verdict(two[backdoor], two[clean]) == "breaks through"


def test_the_backdoor_at_four_and_seven_sites_of_400_patients_is_the_pages_figures():
    """docs/server-checks.md on the backdoor at four and seven sites of 400 patients: its success against the clean
    run's and the honest sites alone's, its clean AUROC, nothing rejected or left out, and the three sizes' successes
    (docs/attack-suite/results.json)."""
    suite = load_benchmark("attack_suite")
    results = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    clean, alone, backdoor = (
        results[f"{kind}-4sites-{count}attackers-seed1-400p5r"]
        for kind, count in (("clean", 0), ("honest_alone", 1), ("backdoor", 1))
    )
    shares = [f"{run['best_backdoor_success']:.1%}".replace("%", " %") for run in (backdoor, clean, alone)]
    text = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert (
        f"{shares[0]} of the triggered negatives against {shares[1]} for the clean model and {shares[2]} for the "
        f"honest sites alone, with the clean AUROC unchanged ({suite.lowest_margin(backdoor, clean):+.3f})" in text
    )
    assert backdoor["rejected"] == backdoor["excluded"] == [] and backdoor["exit_code"] == 0
    assert suite.verdict(backdoor, clean) == "breaks through"
    clean, alone, backdoor = (
        results[f"{kind}-7sites-{count}attackers-seed1-400p5r"]
        for kind, count in (("clean", 0), ("honest_alone", 1), ("backdoor", 1))
    )
    shares = [f"{run['best_backdoor_success']:.1%}".replace("%", " %") for run in (backdoor, clean, alone)]
    assert (
        f"the best model {shares[0]} against {shares[1]} for the clean model's and {shares[2]} for the honest sites "
        f"alone's, clean AUROC {suite.lowest_margin(backdoor, clean):+.3f}, nothing rejected or left out; but the "
        f"final model (round {backdoor['rounds'] - 1}'s) {backdoor['final_backdoor_success']:.1%} against the clean "
        f"run's final {clean['final_backdoor_success']:.1%}, "
        f"{100 * (backdoor['final_backdoor_success'] - clean['final_backdoor_success']):.1f} points above"
    ).replace("%", " %").replace("  %", " %") in text
    assert backdoor["rejected"] == backdoor["excluded"] == [] and backdoor["exit_code"] == 0
    assert suite.verdict(backdoor, clean) == suite.verdict(backdoor, alone) == "breaks through"  # its final model
    assert backdoor["best_backdoor_success"] - clean["best_backdoor_success"] <= suite.BACKDOOR_TOLERANCE
    by_size = [results[f"backdoor-{sites}sites-1attackers-seed1-400p5r"] for sites in (3, 4, 7)]
    found = ", ".join(f"{run['best_backdoor_success']:.1%}".replace("%", " %") for run in by_size)
    assert f"seven sites with the same data each (best models): {found}" in text


def test_the_head_rows_refitted_each_round_and_once_at_a_site_are_the_records():
    """docs/server-checks.md, refitting the head rows at a site: the withdrawn per-round refit's figures are its runs'
    (docs/attack-suite/refit-per-round.json), and the tables of evaluate --refit-rows-out's fit are the refit look's
    records (refit-both-*.json), each fitted again on training and validation images."""
    refit = load_benchmark("backdoor_refit")
    suite = load_benchmark("attack_suite")
    page = (REPOSITORY / "docs" / "server-checks.md").read_text()
    text = " ".join(page.split())
    record = json.loads((REPOSITORY / "docs" / "attack-suite" / "refit-per-round.json").read_text())
    three, seven, default = record["three_sites"], record["seven_sites"], record["default_three_sites"]

    def pair(runs: dict, attack: str, sites: int, tail: str) -> tuple[dict, dict]:
        return (
            runs[f"{attack}-{sites}sites-1attackers-seed1-{tail}"],
            runs[f"clean-{sites}sites-0attackers-seed1-{tail}"],
        )

    def shares(attacked: dict, clean: dict) -> list[str]:
        cases = ((attacked, "best"), (attacked, "final"), (clean, "best"), (clean, "final"))
        return [_percent(suite.success_of(run, "backdoor_glyph", label)) for run, label in cases]

    found = shares(*pair(default, "backdoor_glyph", 3, "400p5r-stand-in"))
    assert f"to the printed digit, {found[0]} and {found[1]}, against its clean run's {found[2]}" in text
    attacked, clean = pair(three, "backdoor_glyph", 3, "400p5r-stand-in")
    found = shares(attacked, clean)
    assert (
        f"the backdoor's success was {found[0]} by the best model and {found[1]} by the final one against that clean "
        f"run's {found[2]} and {found[3]}: it breaks through" in text
    )
    for run in (attacked, clean):
        assert run["honest_sites"] == {"refit_head_rows": True} and run["exit_code"] == 0
        assert set(run["rejected"]) == {"site-chexpert-1"}  # honest: no attacker is a CheXpert site here
    refused = {kind: sorted(int(number) for number, sites in run["rejections"].items() if "site-chexpert-1" in sites)
               for kind, run in (("clean", clean), ("backdoor", attacked))}  # fmt: skip
    assert refused == {"clean": [2, 3, 4], "backdoor": [3, 4]}
    moved = [float(reason.split(" is ")[1].split(" times")[0]) for run in (attacked, clean)
             for reason in (sites["site-chexpert-1"] for sites in run["rejections"].values() if sites)]  # fmt: skip
    assert f"its refitted Pleural Effusion row moved {min(moved):.2f} to {max(moved):.2f} times its size" in text
    uncapped = record["uncapped"]["clean-3sites-0attackers-seed1-400p5r-stand-in"]
    assert all("site-chexpert-1" in uncapped["rejections"][str(number)] for number in range(5))
    lowest = uncapped["best_auroc"]["site-chexpert-1"]
    default_clean = default["clean-3sites-0attackers-seed1-400p5r-stand-in"]["best_auroc"]["site-chexpert-1"]
    assert f"(its best model's test AUROC {lowest:.3f} against {default_clean:.3f})" in text
    attacked, clean = pair(seven, "backdoor_glyph", 7, "stand-in")
    found = shares(attacked, clean)
    assert f"the success was {found[0]} and {found[1]} against its clean run's {found[2]}" in text
    for run in (attacked, clean):
        assert run["rejected"] == ["site-chexpert-2"] and list(run["rejections"]["2"]) == ["site-chexpert-2"]
    found = shares(*pair(record["default_seven_sites"], "backdoor_glyph", 7, "stand-in"))
    assert f"(under the default {found[0]} against {found[2]}, as above, repeated on this machine" in text
    both = {}
    for size in ("three", "seven"):
        found = json.loads((REPOSITORY / "docs" / "attack-suite" / f"refit-both-{size}-sites.json").read_text())
        marker = "backdoor-refit-both" + ("" if size == "three" else "-seven-sites")
        assert marked_block(page, marker) == "\n".join(refit.table(found))
        both[size] = _refit_against_the_clean_run(f"refit-both-{size}-sites.json")

    def held(figures: tuple[float, float, float]) -> bool:
        return figures[0] >= -suite.TOLERANCE and figures[1] <= 100 * suite.BACKDOOR_TOLERANCE

    three_both, seven_both = both["three"], both["seven"]
    assert all(held(figures) for figures in three_both.values())
    assert (
        f"the trigger within {max(f[1] for f in three_both.values()):.1f} points of the clean global model's 1.9 % "
        f"(within {max(abs(f[2]) for f in three_both.values()):.1f} of the clean run's own refits)" in text
    )
    chexpert = sorted(f[0] for (_, site), f in three_both.items() if site == "site-chexpert-1")
    nih = {round(-f[0], 3) for (_, site), f in three_both.items() if site == "site-nih-1"}
    assert f"findings ranked {chexpert[0]:.3f} to {chexpert[-1]:.3f} better than by the clean global model" in text
    assert nih == {0.025} and "the NIH site's 0.025 worse" in text
    finals = {site: figures for (label, site), figures in seven_both.items() if label == "final"}
    assert finals == {site: figures for (label, site), figures in seven_both.items() if label == "best"}  # one model
    holding = [site for site, figures in finals.items() if held(figures)]
    assert f"At seven sites of 100 patients {len(holding)} of the {len(finals)} hold" in text
    nearest = max(abs(f[2]) for f in finals.values())
    assert f"within {nearest:.1f} points of the clean run's own refits at every site" in text
    (failing,) = set(finals) - set(holding)
    edge = finals["site-chexpert-1"][1]
    assert 100 * suite.BACKDOOR_TOLERANCE - 100 / 426 < edge <= 100 * suite.BACKDOOR_TOLERANCE  # inside by < 1 image
    assert (
        f"at {len(holding)} of them (site-chexpert-1 by less than one test image, 10.3 %; {failing}'s 10.8 %)" in text
    )
    costs = sorted(-f[0] for f in finals.values())
    assert f"each site's findings ranked {costs[0]:.3f} to {costs[-1]:.3f} below the clean global model's" in text
    tuned = json.loads((REPOSITORY / "docs" / "attack-suite" / "glyph-tuned.json").read_text())
    attacked, clean = pair(tuned, "backdoor_glyph_tuned", 3, "400p5r-stand-in")
    assert attacked["rejected"] == attacked["attacking_sites"] == ["site-nih-2"]
    assert [number for number, sites in attacked["rejections"].items() if sites] == ["2", "3", "4"]
    own = _percent(attacked["attackers_own_backdoor_success"]["site-nih-2"])
    best, final = (_percent(suite.success_of(attacked, "backdoor_glyph_tuned", label)) for label in ("best", "final"))
    reference = _percent(suite.success_of(clean, "backdoor_glyph_tuned"))
    assert f"taught its own model the trigger to {own}" in text
    assert f"scores the trigger at {best} against the clean model's {reference} (the final one {final})" in text
    assert suite.verdict(attacked, clean) == "breaks through"
    looked = json.loads((REPOSITORY / "docs" / "attack-suite" / "refit-both-tuned-three-sites.json").read_text())
    shares_after = [runs[looked["runs"][0]]["refit"]["success"] for label in refit.MODELS
                    for runs in looked[label]["refit"].values()]  # fmt: skip
    put_back = _percent(looked["best"]["located"]["backdoored model, clean target row"]["success"])
    assert (
        f"With the clean model's Pneumothorax row put back the best model scores it at {put_back}, and each honest "
        f"site's refitted rows at {_percent(min(shares_after))} to {_percent(max(shares_after))}" in text
    )


def _refit_against_the_clean_run(record: str) -> dict[tuple[str, str], tuple[float, float, float]]:
    """A refit look's record: (model, site) -> the refitted model's mean AUROC against the clean global model's, its
    trigger success above the clean global model's and above the clean run's own refit (points)."""
    refit = load_benchmark("backdoor_refit")
    found = json.loads((REPOSITORY / "docs" / "attack-suite" / record).read_text())
    assert found["refit_on_both"] is True
    attacked, clean = found["runs"]
    return {
        (label, site): (
            runs[attacked]["refit"]["mean_auroc"] - runs[clean]["global"]["mean_auroc"],
            100 * (runs[attacked]["refit"]["success"] - runs[clean]["global"]["success"]),
            100 * (runs[attacked]["refit"]["success"] - runs[clean]["refit"]["success"]),
        )
        for label in refit.MODELS
        for site, runs in found[label]["refit"].items()
    }


def test_a_second_seed_of_the_glyph_backdoor_and_each_sites_refit_are_the_records():
    """docs/server-checks.md's second seed of the glyph backdoor (docs/attack-suite/glyph-seed2.json) and the refit
    look on it (refit-both-*-seed2.json): the global model's figures, the tables, every site held, the figures the
    prose quotes; and docs/using-the-model.md's summary of both seeds."""
    refit = load_benchmark("backdoor_refit")
    suite = load_benchmark("attack_suite")
    page = (REPOSITORY / "docs" / "server-checks.md").read_text()
    text = " ".join(page.split())
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "glyph-seed2.json").read_text())
    pairs = {
        sites: (
            runs[f"backdoor_glyph-{sites}sites-1attackers-seed2-{tail}"],
            runs[f"clean-{sites}sites-0attackers-seed2-{tail}"],
        )
        for sites, tail in ((3, "400p5r-stand-in"), (7, "stand-in"))
    }
    for attacked, clean in pairs.values():
        assert (
            attacked["seed"] == 2 and attacked["commit"].startswith("f01d55d") and clean["commit"] == attacked["commit"]
        )
        assert attacked["exit_code"] == 0 and attacked["rejected"] == attacked["excluded"] == []
        assert suite.verdict(attacked, clean) == "breaks through"
        assert suite.success_of(attacked, "backdoor_glyph") == suite.success_of(attacked, "backdoor_glyph", "final")
    seconds = [run["seconds"] for run in runs.values()]
    assert "420 to 830 s a run" in text and (round(min(seconds)), round(max(seconds))) == (420, 830)
    (three, three_clean), (seven, seven_clean) = pairs.values()
    named = {"three": three, "three_clean": three_clean, "seven": seven, "seven_clean": seven_clean}
    share = {name: _percent(suite.success_of(run, "backdoor_glyph")) for name, run in named.items()}
    own = [_percent(next(iter(run["attackers_own_backdoor_success"].values()))) for run in (three, seven)]
    assert (
        f"{share['three']} by the best model (the final one) against its clean run's {share['three_clean']}, the "
        f"attacker's own model {own[0]}; at seven sites of 100 patients {share['seven']} against "
        f"{share['seven_clean']} "
        f"(the attacker's own {own[1]}); clean AUROC {suite.lowest_margin(three, three_clean):+.3f} and "
        f"{suite.lowest_margin(seven, seven_clean):+.3f}, nothing refused or left out, exit 0" in text
    )
    folder = REPOSITORY / "docs" / "attack-suite"
    looks = {
        size: json.loads((folder / f"refit-both-{size}-sites-seed2.json").read_text()) for size in ("three", "seven")
    }
    put_back = [
        _percent(look["best"]["located"]["backdoored model, clean target row"]["success"]) for look in looks.values()
    ]
    assert f"Pneumothorax row put back the backdoored model scores it at {put_back[0]} and {put_back[1]}" in text
    for (size, marker), sites in zip(
        (("three", "backdoor-refit-both-seed2"), ("seven", "backdoor-refit-both-seven-sites-seed2")), pairs, strict=True
    ):
        assert looks[size]["runs"] == [name for name in runs if f"-{sites}sites-" in name][::-1]  # backdoor, clean
        assert marked_block(page, marker) == "\n".join(refit.table(looks[size]))

    def held(figures: tuple[float, float, float]) -> bool:
        return figures[0] >= -suite.TOLERANCE and figures[1] <= 100 * suite.BACKDOOR_TOLERANCE

    three_sites = _refit_against_the_clean_run("refit-both-three-sites-seed2.json")
    seven_sites = _refit_against_the_clean_run("refit-both-seven-sites-seed2.json")
    assert all(held(figures) for figures in (*three_sites.values(), *seven_sites.values()))
    own = [max(abs(f[2]) for f in found.values()) for found in (three_sites, seven_sites)]
    assert f"the trigger lies within {own[0]:.1f} points at three sites and within {own[1]:.1f} at seven" in text
    assert (
        f"at three sites within {max(f[1] for f in three_sites.values()):.1f} points of its {share['three_clean']}, "
        in text
    )
    chexpert = {round(f[0], 3) for (_, site), f in three_sites.items() if site == "site-chexpert-1"}
    nih = {round(-f[0], 3) for (_, site), f in three_sites.items() if site == "site-nih-1"}
    assert chexpert == {0.010} and nih == {0.023}
    assert "the refitted rows ranking the CheXpert site's findings 0.010 better and the NIH site's 0.023 worse" in text
    edge = max(f[1] for f in seven_sites.values())
    at_edge = sorted({site for (_, site), f in seven_sites.items() if f[1] == edge})
    assert at_edge == ["site-chexpert-1", "site-nih-3"]
    assert 100 * suite.BACKDOOR_TOLERANCE - 100 / 426 / 3 < edge <= 100 * suite.BACKDOOR_TOLERANCE  # a third of one
    assert f"at seven sites within {edge:.1f} points of its {share['seven_clean']}, each" in text
    costs = sorted(-f[0] for f in seven_sites.values())
    assert f"each site's findings ranked {costs[0]:.3f} to {costs[-1]:.3f} below it" in text
    seven_look = looks["seven"]["best"]["refit"]
    attacked_name, clean_name = looks["seven"]["runs"]
    refitted = {site: _percent(seven_look[site][attacked_name]["refit"]["success"]) for site in at_edge}
    clean_refits = [_percent(seven_look[site][clean_name]["refit"]["success"]) for site in at_edge]
    assert set(refitted.values()) == {"10.3 %"}
    assert "(site-chexpert-1 and site-nih-3, 10.3 %) sit a third of one test image inside the tolerance" in text
    assert f"the clean run's own refits give those sites {clean_refits[0]} and {clean_refits[1]}:" in text
    # both seeds, as docs/using-the-model.md sums them up: a site holds where its best and its final model do
    every = {
        record: _refit_against_the_clean_run(record)
        for record in ("refit-both-three-sites.json", "refit-both-seven-sites.json",
                       "refit-both-three-sites-seed2.json", "refit-both-seven-sites-seed2.json")
    }  # fmt: skip
    sites = {(record, site): all(held(f) for (_, other), f in found.items() if other == site)
             for record, found in every.items() for _, site in found}  # fmt: skip
    held_sites = sum(sites.values())
    assert (
        f"Over the two seeds {held_sites} of the {len(sites)} honest sites hold, best and final model (seed 1's "
        "site-nih-3 at seven sites did not: 10.8 % against 5.4 %)" in text
    )
    assert [key for key, holds in sites.items() if not holds] == [("refit-both-seven-sites.json", "site-nih-3")]
    seed_one = json.loads((REPOSITORY / "docs" / "attack-suite" / "refit-both-seven-sites.json").read_text())
    failed = seed_one["final"]["refit"]["site-nih-3"]
    attacked_name, clean_name = seed_one["runs"]
    found = (_percent(failed[attacked_name]["refit"]["success"]), _percent(failed[clean_name]["global"]["success"]))
    assert found == ("10.8 %", "5.4 %")
    models = [(record, site, figures) for record, found in every.items() for (_, site), figures in found.items()]
    chexpert = sorted(f[0] for record, site, f in models if "three" in record and site == "site-chexpert-1")
    nih = sorted(-f[0] for record, site, f in models if "three" in record and site == "site-nih-1")
    hundred = sorted(-f[0] for record, _, f in models if "seven" in record)
    usage = " ".join((REPOSITORY / "docs" / "using-the-model.md").read_text().split())
    assert (
        f"ranked the findings of the CheXpert site of 400 patients {chexpert[0]:.3f} to {chexpert[-1]:.3f} better and "
        f"the NIH site's {nih[0]:.3f} to {nih[-1]:.3f} worse than the clean federation's model, of sites of 100 "
        f"patients {hundred[0]:.3f} to {hundred[-1]:.3f} worse, and took the glyph backdoor to within 5 points of the "
        f"clean model's share in {held_sites} of the {len(sites)} sites" in usage
    )


def test_the_rows_kept_to_the_clean_features_directions_are_the_records():
    """docs/server-checks.md's look at each head row projected on the clean features' leading directions: its two
    tables are the records' (docs/attack-suite/projection*.json, the glyph runs of seeds 1 and 2), and the sentence
    after them says where the trigger comes within 5 points, at what cost, and how far above it stays elsewhere."""
    projection = load_benchmark("backdoor_projection")
    suite = load_benchmark("attack_suite")
    page = (REPOSITORY / "docs" / "server-checks.md").read_text()
    text = " ".join(page.split())
    above, costs, scored, above_as_it_is = {}, {}, {}, {}
    for record, marker, seed in (("projection.json", "backdoor-projection", 1),
                                 ("projection-seed2.json", "backdoor-projection-seed2", 2)):  # fmt: skip
        found = json.loads((REPOSITORY / "docs" / "attack-suite" / record).read_text())
        assert found["trigger"] == "glyph" and all(f"-seed{seed}-400p5r-stand-in" in run for run in found["runs"])
        assert marked_block(page, marker) == "\n".join(projection.table(found))
        attacked, clean = found["runs"]
        as_it_is = found["final"][attacked]["0"]["success"] - found["final"][clean]["0"]["success"]
        above_as_it_is[seed] = round(100 * as_it_is, 1)
        for label in ("best", "final"):
            scored[seed, label] = [(hit, found[label][clean][count]) for count, hit in found[label][attacked].items()
                                   if count != "0"]  # fmt: skip
            for count, hit in found[label][attacked].items():
                if count != "0":
                    points = round(100 * (hit["success"] - found[label][clean][count]["success"]), 1)
                    above[seed, label, int(count)] = points
                    costs[seed, label, int(count)] = found[label][attacked]["0"]["mean_auroc"] - hit["mean_auroc"]
    inside = sorted(count for (seed, label, count), points in above.items()
                    if points <= 100 * suite.BACKDOOR_TOLERANCE)  # fmt: skip
    assert {(seed, label) for seed, label, count in above if above[seed, label, count] <= 5} == {(1, "best")}
    paid = sorted(costs[1, "best", count] for count in inside)
    final_one = min(100 * (hit["success"] - base["success"]) for hit, base in scored[1, "final"])
    seed_two = min(v for (seed, _, _), v in above.items() if seed == 2)
    assert scored[2, "best"] == scored[2, "final"]  # seed 2's best model is its final one
    assert (
        f"On seed 1 the best model comes within 5 points of the clean model projected alike with "
        f"{', '.join(map(str, inside[:-1]))} and {inside[-1]} directions kept, its mean AUROC then {paid[0]:.3f} to "
        f"{paid[-1]:.3f} below the backdoored model's as it is, but the final model stays {final_one:.2f} points or "
        f"more above at every k; on seed 2, whose best model is its final one, it stays {seed_two:.1f} points or "
        "more above" in text
    )
    assert (
        f"(seed 2: {above_as_it_is[2]:+.1f} to {above[2, 'final', 8]:+.1f} points) and keeping more brings it back "
        f"({above[2, 'final', 256]:+.1f} at 256)" in text
    )


def test_where_the_glyph_backdoor_lives_and_what_a_sites_refit_removes_are_the_records():
    """docs/server-checks.md on the glyph backdoor from the stand-in: the refit tables are the records' (three and seven
    sites), the sentences' figures are theirs, and the head rows' median ran as the page says
    (docs/attack-suite/head-rows-median.json)."""
    refit = load_benchmark("backdoor_refit")
    suite = load_benchmark("attack_suite")
    page = (REPOSITORY / "docs" / "server-checks.md").read_text()
    text = " ".join(page.split())
    three, seven = (
        json.loads((REPOSITORY / "docs" / "attack-suite" / f"refit-{size}-sites.json").read_text())
        for size in ("three", "seven")
    )
    assert marked_block(page, "backdoor-refit") == "\n".join(refit.table(three))
    assert marked_block(page, "backdoor-refit-seven-sites") == "\n".join(refit.table(seven))
    located = {
        label: {name: _percent(found["success"]) for name, found in three[label]["located"].items()}
        for label in refit.MODELS
    }
    final, best = located["final"], located["best"]
    assert (
        f"with the clean model's Pneumothorax row put back the backdoored model scores the trigger at "
        f"{final['backdoored model, clean target row']} ({final['backdoored backbone, backdoored head']} as it is, the "
        f"clean model {final['clean backbone, clean head']}), and the backdoored row alone in the clean model at "
        f"{final['clean model, backdoored target row']}" in text
    )
    assert (
        f"On the best models the row carries nearly all ({best['clean model, backdoored target row']} of "
        f"{best['backdoored backbone, backdoored head']}; {best['backdoored model, clean target row']} with the clean "
        "row put back)" in text
    )
    seven_found = {name: _percent(found["success"]) for name, found in seven["final"]["located"].items()}
    assert (
        f"{seven_found['backdoored model, clean target row']} with the clean row put back, against "
        f"{seven_found['backdoored backbone, backdoored head']} and the clean model's "
        f"{seven_found['clean backbone, clean head']}; the backdoored row alone in the clean model "
        f"{seven_found['clean model, backdoored target row']}" in text
    )
    halves = [three["final"]["located"][name]["success"] for name in
              ("clean model, backdoored target row", "backdoored backbone, backdoored head")]  # fmt: skip
    assert 0.4 < halves[0] / halves[1] < 0.6  # "by itself carries half of the final model's success"

    def gaps(found: dict, against: str) -> list[float]:
        attacked, clean = found["runs"]
        return [
            100 * (runs[attacked]["refit"]["success"] - runs[clean][against]["success"])
            for label in refit.MODELS
            for runs in found[label]["refit"].values()
        ]

    assert f"within {max(gaps(three, 'refit')):.1f} points of what the clean run's refitted rows give" in text
    assert f"within {max(gaps(three, 'global')):.1f} points of the clean global model's" in text
    assert max(gaps(three, "global")) <= 100 * suite.BACKDOOR_TOLERANCE
    assert f"the backdoored run's lie within {max(gaps(seven, 'refit')):.1f} points at every site" in text
    within = sum(gap <= 100 * suite.BACKDOOR_TOLERANCE for gap in gaps(seven, "global")[: len(seven["honest_sites"])])
    assert f"within 5 points at {within} of the {len(seven['honest_sites'])} sites" in text
    attacked = seven["runs"][0]
    costs = [
        runs[attacked]["global"]["mean_auroc"] - runs[attacked]["refit"]["mean_auroc"]
        for runs in seven["final"]["refit"].values()
    ]
    assert f"the refitted rows cost each site {min(costs):.3f} to {max(costs):.3f} of its mean AUROC" in text
    clean_run = seven["runs"][1]
    verdicts = {
        site: (
            runs[attacked]["refit"]["mean_auroc"] - runs[clean_run]["global"]["mean_auroc"] >= -suite.TOLERANCE
            and runs[attacked]["refit"]["success"] - runs[clean_run]["global"]["success"] <= suite.BACKDOOR_TOLERANCE
        )
        for site, runs in seven["final"]["refit"].items()
    }
    failing = sum(not held for held in verdicts.values())
    assert f"by the suite's measures {failing} of the {len(verdicts)} fail" in text
    lowest = min(runs[attacked]["refit"]["mean_auroc"] - runs[clean_run]["global"]["mean_auroc"]
                 for runs in seven["final"]["refit"].values())  # fmt: skip
    assert f"site-nih-1's refitted model ranks {-lowest:.3f} below the clean global model" in text
    attacked3, clean3 = three["runs"]
    nih = three["best"]["refit"]["site-nih-1"]
    below = nih[clean3]["global"]["mean_auroc"] - nih[attacked3]["refit"]["mean_auroc"]
    cost = nih[clean3]["global"]["mean_auroc"] - nih[clean3]["refit"]["mean_auroc"]
    assert (
        f"{below:.3f} below the clean run's global model; its refit costs as much in the clean run ({cost:.3f})" in text
    )
    for runs in (run for label in refit.MODELS for run in three[label]["refit"].values()):
        assert runs[attacked3]["refit"]["mean_auroc"] - runs[clean3]["global"]["mean_auroc"] >= -suite.TOLERANCE
    rules = json.loads((REPOSITORY / "docs" / "attack-suite" / "head-rows-median.json").read_text())
    median = rules["head_rows_median"]
    for run in median.values():
        assert run["controller"] == {"robust_aggregation": {"backbone": "geometric_median", "head_rows": "median"}}
        assert run["exit_code"] == 0 and run["rejected"] == run["excluded"] == []
        assert run["start"] == "stand-in"
    attacked, clean = (median[f"{kind}-3sites-{count}attackers-seed1-400p5r-stand-in"] for kind, count in
                       (("backdoor_glyph", 1), ("clean", 0)))  # fmt: skip
    found = [_percent(suite.success_of(run, "backdoor_glyph", label)) for run, label in
             ((attacked, "best"), (attacked, "final"), (clean, "best"))]  # fmt: skip
    assert (
        f"the backdoor's success is {found[0]} by the best model and {found[1]} by the final one against that clean "
        f"run's {found[2]}" in text
    )
    default = rules["default"]["clean-3sites-0attackers-seed1-400p5r-stand-in"]
    gaps = [abs(default["best_auroc"][site] - clean["best_auroc"][site]) for site in clean["best_auroc"]]
    assert "the clean run's honest sites score within 0.001 of the default's" in text and round(max(gaps), 3) <= 0.001
    assert suite.verdict(attacked, clean) == "breaks through"
    attacked, clean = (median[f"{kind}-7sites-{count}attackers-seed1-stand-in"] for kind, count in
                       (("backdoor_glyph", 1), ("clean", 0)))  # fmt: skip
    default = {kind: rules["default"][f"{kind}-7sites-{count}attackers-seed1-stand-in"]
               for kind, count in (("backdoor_glyph", 1), ("clean", 0))}  # fmt: skip
    gaps = [abs(default["clean"]["best_auroc"][site] - clean["best_auroc"][site]) for site in clean["best_auroc"]]
    assert "clean run's honest sites score within 0.002 of the default's" in text and round(max(gaps), 3) <= 0.002
    runs = (attacked, clean, default["backdoor_glyph"])
    shares = [suite.success_of(run, "backdoor_glyph") for run in runs]
    negatives = 426  # the test set's Pneumothorax negatives: every share is a whole number of them
    assert "426 test negatives, so one image is 0.23 points" in text and all(
        abs(share * negatives - round(share * negatives)) < 1e-6 for share in shares
    )
    images = round((shares[2] - shares[0]) * negatives)
    found = [_percent(share) for share in shares]
    assert (
        f"the success is {found[0]} against its clean run's {found[1]} ({found[2]} under the geometric median, "
        f"{images} test images more)" in text
    )
    above = suite.backdoor_above(attacked, clean)
    margin = suite.BACKDOOR_TOLERANCE - above
    assert f"inside the 5 points by {100 * margin:.1f}, less than one test image" in text and margin * negatives < 1
    own = [
        _percent(run["attackers_own_backdoor_success"]["site-nih-4"]) for run in (attacked, default["backdoor_glyph"])
    ]
    assert f"the attacker's own model learning the trigger less ({own[0]} against {own[1]})" in text


def test_flipping_and_pruning_stopped_on_held_out_images_are_the_pages_figures():
    """docs/server-checks.md on FLAIN's flipping and on pruning stopped by its rule, offline on the backdoor at three
    sites of 400 patients (docs/attack-suite/flipping.json): the table is the file's, the rule stops where its
    auxiliary AUROC says, and the sentences' figures are the table's."""
    flipping = load_benchmark("backdoor_flipping")
    results = json.loads((REPOSITORY / "docs" / "attack-suite" / "flipping.json").read_text())
    page = (REPOSITORY / "docs" / "server-checks.md").read_text()
    assert "\n".join(flipping.table(results)) in page
    backdoor, clean = results.values()
    for found in (backdoor, clean):
        for treatment, rows in found["rows"].items():
            stop = found["stops"][treatment]
            assert stop == flipping.stopping_rate(rows, flipping.TOLERANCE)
            before = [row for row in rows if row["rate"] <= stop]
            assert all(rows[0]["auxiliary_auroc"] - row["auxiliary_auroc"] <= flipping.TOLERANCE for row in before)
    at_stop = {
        treatment: [next(row for row in found["rows"][treatment] if row["rate"] == found["stops"][treatment])
                    for found in (backdoor, clean)]
        for treatment in ("prune", "flip")
    }  # fmt: skip
    untouched, flipped = backdoor["rows"]["flip"][0], at_stop["flip"][0]
    text = " ".join(page.split())
    found = [f"{row['backdoor_success']:.1%}".replace("%", " %") for row in (untouched, flipped)]
    assert f"Flipping raises the backdoor's success from {found[0]} to {found[1]} where the rule stops" in text
    assert flipped["backdoor_success"] > untouched["backdoor_success"]
    pruned, pruned_clean = at_stop["prune"]
    above = 100 * (pruned["backdoor_success"] - pruned_clean["backdoor_success"])
    assert f"leaves the backdoor {above:.1f} points above the clean model at its own stop" in text
    assert above > 5


def test_the_noise_that_wrecks_the_model_and_the_bar_it_led_to_are_the_pages_figures():
    """docs/server-checks.md on ``update_noise`` 0.01: the clean run's false alarm, the backdoor run's wrecked model
    published with exit 0 (docs/attack-suite/update-noise-0.01.json), and its rerun under the initial model's bar,
    failing closed (update-noise-0.01-bar.json)."""
    suite = load_benchmark("attack_suite")
    folder = REPOSITORY / "docs" / "attack-suite"
    runs = json.loads((folder / "update-noise-0.01.json").read_text())
    rerun = json.loads((folder / "update-noise-0.01-bar.json").read_text())
    clean, backdoor = "clean-3sites-0attackers-seed1-400p5r", "backdoor-3sites-1attackers-seed1-400p5r"
    assert {run["controller"]["update_noise"] for run in [*runs.values(), *rerun.values()]} == {0.01}
    text = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert runs[clean]["exit_code"] == 2 and not runs[clean]["published"]
    assert runs[clean]["stopped"].startswith("the global model after round 3 harms a site")
    wrecked = runs[backdoor]
    assert wrecked["exit_code"] == 0 and wrecked["published"]
    aurocs = sorted(wrecked["best_auroc"].values(), reverse=True)
    assert (
        f"fell to {aurocs[0]:.3f} and {aurocs[1]:.3f} (success {wrecked['best_backdoor_success']:.1%}".replace(
            "%", " %"
        )
        in text
    )
    after = rerun[backdoor]
    assert after["exit_code"] == 2 and not after["published"]
    assert suite.verdict(after, runs[clean]) == "fails closed"
    assert after["stopped"].startswith("no trained global model was judged better than the initial model")
    bar = after["stopped"].split("(the initial model's: ", 1)[1].split(")", 1)[0]
    assert f"(its judged loss {bar}; in" in text


def test_the_honest_sites_closest_updates_the_page_quotes_are_the_records():
    """docs/server-checks.md's bound on how far a duplicate rule could go: the clean sweep's range of the honest sites'
    closest pair of backbone updates, and the least of the CPU grid's runs (vanilla FL at psi 12/14), from the
    records."""
    sweep_runs = json.loads((REPOSITORY / "docs" / "clean-sweep" / "results.json").read_text()).values()
    sweep = [value for run in sweep_runs for value in (run.get("closest_updates") or {}).values() if value is not None]
    grid: dict[str, list[float]] = {}  # method -> its runs' figures, one a round
    for path in (REPOSITORY / "docs" / "benchmark" / "full-psi-cpu" / "runs").glob("*/*/*/round_history.json"):
        rounds = json.loads(path.read_text())
        figures = [entry.get("aggregation", {}).get("closest_updates") for entry in rounds]
        grid.setdefault(path.parts[-3], []).extend(value for value in figures if value is not None)
    least = min(value for values in grid.values() for value in values)
    assert len(sweep) >= 125 and sum(map(len, grid.values())) >= 440
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert f"lay {min(sweep):.3f} to {max(sweep):.3f} apart in the clean sweep's rounds" in page
    assert least == min(grid["vanilla"]) and f"but {least:.3f} apart in the CPU grid's vanilla FL runs" in page
    assert f"({least:.3f} at the least: below)" in page


def test_the_backdoor_under_centered_clipping_at_three_sites_of_400_patients_is_its_runs():
    """docs/server-checks.md's backdoor at three sites of 400 patients under centered clipping, against the geometric
    median's run of the suite's table: each success rate and the clean AUROC change from the runs' records."""
    suite = load_benchmark("attack_suite")
    name = "3sites-{}attackers-seed1-400p5r"
    clipped = json.loads((REPOSITORY / "docs" / "attack-suite" / "three-sites-400p-centered-clipping.json").read_text())
    median = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    assert {run["controller"].get("robust_aggregation") for run in clipped.values()} == {"centered_clipping"}
    clean_change = suite.lowest_margin(clipped[f"backdoor-{name.format(1)}"], clipped[f"clean-{name.format(0)}"])
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())

    def share(runs: dict, attack: str, attackers: int) -> str:
        return f"{100 * runs[f'{attack}-{name.format(attackers)}']['best_backdoor_success']:.1f} %"

    assert (
        f"{share(clipped, 'backdoor', 1)} of the honest sites' triggered test negatives score above the model's 95th "
        f"percentile, against {share(clipped, 'clean', 0)} for its clean model, with the clean images' AUROC "
        f"{clean_change:+.3f}; under the geometric median {share(median, 'backdoor', 1)} against "
        f"{share(median, 'clean', 0)}"
    ) in page
    assert {run["exit_code"] for run in clipped.values()} == {0}


def test_the_readmes_other_figures_are_their_records():
    """The README's figures outside the marked tables: the consortium job's minutes (its run in the clean sweep), the
    GPU trainer's share of its ceiling, the rules' design false-alarm rate, the smoke network's size, the pins."""
    readme = _readme()
    consortium = json.loads((REPOSITORY / "docs" / "clean-sweep" / ONE_FINDING_RECORD).read_text())["cxr_consortium"]
    assert f"199-class union head in about {round(consortium['seconds'] / 60)} minutes on 2 CPU cores" in readme
    assert consortium["exit_code"] == 0 and consortium["published"]
    h100 = json.loads((REPOSITORY / "docs" / "performance" / "h100-224px.json").read_text())
    assert f"an epoch runs at {h100['train_over_ceiling']:.0%} of its CUDA-graph step's ceiling" in readme
    assert f"(rules designed for {judging.FALSE_ALARM_RATE * 100:g} % false alarms per job: each test near" in readme
    smoke = DenseNet(2, 1, 20, **NETWORK_ARGUMENTS[SMOKE_DENSENET])
    backbone = sum(w.numel() for key, w in smoke.named_parameters() if not key.startswith("class_layers"))
    assert f"FLARE tests: MONAI's DenseNet, {round(backbone / 1000)} k backbone weights." in readme
    lines = (REPOSITORY / "requirements.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))
    assert all(f"`{name}=={pins[name]}`" in readme for name in ("nvflare", "torch", "monai"))


def test_the_consortium_from_the_stand_in_is_its_record():
    """docs/cxr-consortium.md: the job from the stand-in, its run in the clean sweep from the stand-in: the sites' mean
    validation AUROC before training and of the best model, the honest sites the direction check refused and their
    cosines against the earlier rounds' lowest, the round thrown away; the sweep's table of those runs."""
    sweep = load_benchmark("clean_sweep")
    runs = json.loads((REPOSITORY / "docs" / "clean-sweep" / "stand-in.json").read_text())
    assert {run["federation"]["start"] for run in runs.values()} == {"stand-in"}
    record = runs[sweep.CONSORTIUM]
    text = " ".join((REPOSITORY / "docs" / "cxr-consortium.md").read_text().split())

    def mean_auroc(round_number: str) -> float:
        return float(np.mean([site["val_mean_auroc"] for site in record["validations"][round_number].values()]))

    trained = {
        number: judged_loss({site: metrics["val_loss"] for site, metrics in sites.items()})[0]
        for number, sites in record["validations"].items()
        if number != "-1"
    }
    best = min(trained, key=trained.get)
    (refused_round,) = [number for number, sites in record["rejections"].items() if sites]
    refused = sorted(record["rejections"][refused_round])
    assert refused == ["site-padchest", "site-vindr"] and refused_round not in record["validations"]  # thrown away
    cosines = " and ".join(f"{record['directions'][refused_round][site]:.2f}" for site in refused)
    earlier = [sites for number, sites in record["directions"].items() if int(number) < int(refused_round)]
    assert all(cosine > 0 for sites in earlier for cosine in sites.values())
    padchest = [sites["site-padchest"] for sites in earlier]
    assert f"{record['seconds']:.0f} s, its run in the [clean sweep from the stand-in]" in text
    assert (
        f"validation AUROC is {mean_auroc('-1'):.3f} before training and {mean_auroc(best):.3f} for the model judged "
        f"best (round {best})"
    ) in text
    assert (
        f"the robust aggregate {cosines}, where rounds 0 and 1 gave every site a positive one, PadChest's falling from "
        f"{padchest[0]:.3f} to {padchest[1]:.4f})"
    ) in text
    kept = max(record["validations"], key=int)  # the last round whose model the sites validated
    assert f"kept round {kept}'s model (exit {record['exit_code']}, published)" in text
    assert record["published"] and record["exit_code"] == 0
    table = _marked_block(REPOSITORY / "docs" / "server-checks.md", f"{sweep.MARKER}-stand-in")
    assert table == "\n".join(sweep.table(runs))
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    drawn = [run for name, run in runs.items() if name != sweep.CONSORTIUM]
    judged = [run for run in drawn if any(run["directions"].values())]  # two sites: no direction is judged
    lowest = [min(min(sites.values()) for sites in run["directions"].values() if sites) for run in judged]
    refusing = sum(bool(run["rejected"]) for run in runs.values())
    refused = {run["federation"]["seed"]: run for run in drawn if run["rejected"]}
    assert sorted(refused) == [575, 578] and all(run["commit"].startswith(NEXT_WIDE_COMMIT) for run in refused.values())
    assert f"honest PadChest and VinDr sites (cosines {cosines} with the robust aggregate)" in page
    from_scratch = [
        cosine
        for run in json.loads((REPOSITORY / "docs" / "clean-sweep" / "results.json").read_text()).values()
        for sites in (run.get("directions") or {}).values()
        for cosine in sites.values()
    ]

    def refusals(seed: int) -> str:  # its refused site's size, first round refused and cosines then
        run = refused[seed]
        rounds = {number: sites for number, sites in run["rejections"].items() if sites}
        (site,) = {name for sites in rounds.values() for name in sites}
        values = [run["directions"][number][site] for number in rounds]
        return (f"{run['federation']['sites'][site]['patients']} patients from round {min(rounds, key=int)}, cosines "
                f"{max(values):.2f} to {min(values):.2f}")  # fmt: skip

    others = [cosine for run in judged for number, sites in run["directions"].items() for site, cosine in sites.items()
              if site not in run["rejections"].get(number, {})]  # fmt: skip
    seven = [run for run in runs.values() if len(run["federation"]["sites"]) == 7]
    assert (
        f"none of the clean sweep's {len(from_scratch)} recorded honest site-round cosines was at or below 0 (the "
        f"lowest {min(from_scratch):.3f}); of the {len(drawn)} drawn federations from the stand-in, {len(refused)} "
        f"refused an honest site's results, both of seven sites run at stop 100 under stop 99's rules (seed 575: its "
        f"PadChest site of "
        f"{refusals(575)}; seed 578: its VinDr site of {refusals(578)}), the two kinds the consortium job refused; the "
        f"lowest cosines of the {len(judged)} with three or more sites ran from {min(lowest):.2f} to {max(lowest):.2f} "
        f"({sum(cosine < min(from_scratch) for cosine in lowest)} of them below every cosine from scratch" in page
    )
    assert f"no other honest site-round came at or below 0 (the lowest {min(others):.2f})" in page and min(others) > 0
    assert (
        f"Three federations of {len(runs)} with an honest site refused (at most "
        f"{_bound_up(sweep.upper_bound(refusing, len(runs)))}, exact one-sided 95 % bound; of the {len(drawn)} drawn, "
        f"{len(refused)}, at most {_bound_up(sweep.upper_bound(len(refused), len(drawn)))})" in page
    )
    assert refusing == 3 and all(len(run["federation"]["sites"]) == 7 for run in [*refused.values(), record])
    refusing_seven = sum(bool(run["rejected"]) for run in seven)
    assert (
        f"({refusing_seven} of the {len(seven)} seven-site federations from the stand-in, the consortium among" in page
    )
    kinds = [{site["kind"] for site in run["federation"]["sites"].values()} for run in seven]
    such = sum(bool(kind & {"padchest", "vindr"}) for kind in kinds)
    assert f"the consortium among them; {refusing_seven} of the {such} with such a site)" in page
    assert (
        "The rule is left as it is at this stop: the stand-in's attack rows of three or more sites rely on it" in page
    )
    # stop 89's runs: every seed of 205-235 but those the page names, and their seconds on the machine it names
    ran = {run["federation"]["seed"] for run in drawn}
    missing = " and ".join(str(seed) for seed in sorted(set(range(205, 236)) - ran))
    assert f"Seeds not run: {missing} (no time was left for a rerun; 226 is one of the largest draws" in page
    stop89 = [  # stop 92's two-site draws (seeds 300 on) ran on the same machine
        run["seconds"]
        for run in drawn
        if run["machine"] == "AMD EPYC, family 25 model 1, AVX2 (2 cores)" and run["federation"]["seed"] < 300
    ]
    stop92 = [run["seconds"] for run in drawn if 300 <= run["federation"]["seed"] <= 331]
    stopped = json.loads((REPOSITORY / "docs" / "clean-sweep" / "two-site-rules-withdrawn.json").read_text())
    every = [*stop92, *(run["seconds"] for run in stopped.values())]
    assert f"commit 3fd4eb6, {min(every):.0f} to {max(every):.0f} s a federation" in page
    assert f"for a while three, {min(stop89):,.0f} to {max(stop89):,.0f} seconds a federation)" in page
    stopped = sum(run["exit_code"] != 0 for run in runs.values())
    excluding = sum(any(run["excluded"].values()) for run in runs.values())
    readme = " ".join(_readme().split())
    assert (
        f"all from scratch; from the stand-in, of [{len(runs)}](docs/server-checks.md"
        f"#clean-federations-from-the-stand-in) {stopped} stopped, {excluding} left a site out, {refusing} refused an "
        f"honest site's results (run again with a site judged by direction once, 0 of those {refusing}, in-sample)."
        in readme
    )


def test_the_consortium_page_is_its_runs_records():
    """docs/cxr-consortium.md: the job as the README runs it (from the stand-in since stop 105): its time, the sites'
    mean validation AUROC by round, the best round, the one-finding sites' losses as they are and recalibrated, each
    from its run in the clean sweep (whose round history the page keeps); from scratch: its time, the sites' mean
    validation AUROC by round and why it falls below chance (``benchmarks/consortium_scores.py``'s record of the job's
    two models); and its union table (the run's ``union_classes.csv``, kept), each as the records give them."""
    folder = REPOSITORY / "docs" / "cxr-consortium"
    text = " ".join((REPOSITORY / "docs" / "cxr-consortium.md").read_text().split())
    default = json.loads((REPOSITORY / "docs" / "clean-sweep" / ONE_FINDING_RECORD).read_text())["cxr_consortium"]
    assert default["federation"]["start"] == "stand-in" and default["direction_check"] == "first_round"
    assert default["machine"].startswith("Intel(R) Xeon(R)")
    assert (
        f"It takes about {round(default['seconds'] / 60)} minutes on 2 CPU cores ({default['seconds']:.0f} s in its "
        "run in the [clean sweep from the stand-in](server-checks.md#the-consortium-job-from-the-stand-in) on a 2-core "
        "Intel Xeon:"
    ) in text
    history = json.loads((folder / "round_history.json").read_text())
    validated = {str(entry["round"]): entry["validation"]["sites"] for entry in history if "validation" in entry}
    assert validated == default["validations"]  # the page's round history is that run's
    means = {
        number: np.mean([site["val_mean_auroc"] for site in sites.values()]) for number, sites in validated.items()
    }
    judged = {entry["round"]: entry["validation"]["judged_val_loss"] for entry in history if entry["round"] >= 0}
    best = min(judged, key=judged.get)
    assert best == max(judged) and default["exit_code"] == 0 and default["published"]
    assert not default["rejected"] and not any(default["excluded"].values())
    assert (
        f"the sites' mean validation AUROC is {means['-1']:.3f} before training and {means['0']:.3f}, "
        f"{means['1']:.3f} and {means['2']:.3f} after rounds 0, 1 and 2; the model judged best by validation loss is "
        f"the last (round {best}), published to every site (exit 0), no result refused and no site left out"
    ) in text
    one_finding = {
        site: [validated[number][site] for number in ("-1", "0", "2")] for site in ("site-siim", "site-rsna")
    }
    (siim_start, _, siim_end), (rsna_start, _, rsna_end) = one_finding.values()
    assert (
        f"Their validation loss rose from {siim_start['val_loss']:.2f} before training to {siim_end['val_loss']:.2f} "
        f"(SIIM) and from {rsna_start['val_loss']:.2f} to {rsna_end['val_loss']:.2f} (RSNA) for the published model "
        f"while their AUROC rose from {siim_start['val_mean_auroc']:.2f} to {siim_end['val_mean_auroc']:.2f} and from "
        f"{rsna_start['val_mean_auroc']:.2f} to {rsna_end['val_mean_auroc']:.2f}"
    ) in text
    # the initial model's recalibrated loss: round 0 trained from it, so its own less round 0's paired change
    initial = [round_0["val_recalibrated_loss"] - round_0["val_recalibrated_loss_minus_start"]
               for _, round_0, _ in one_finding.values()]  # fmt: skip
    assert (
        f"the published model's loss is {siim_end['val_recalibrated_loss']:.2f} and "
        f"{rsna_end['val_recalibrated_loss']:.2f}, below the initial model's {initial[0]:.2f} and {initial[1]:.2f}"
    ) in text
    assert siim_end["val_recalibrated_loss"] < initial[0] and rsna_end["val_recalibrated_loss"] < initial[1]
    own = [start["local_val_mean_auroc"] for start, _, _ in one_finding.values()]  # each site's first-round model
    assert siim_end["val_mean_auroc"] < own[0] and rsna_end["val_mean_auroc"] < own[1]
    assert (
        f"the published model ranks their images at {siim_end['val_mean_auroc']:.2f} and "
        f"{rsna_end['val_mean_auroc']:.2f}, their own first-round models at {own[0]:.2f} and {own[1]:.2f}"
    ) in text
    # evaluate --recalibrate-out on each one-finding site's published model: its per-class table
    refitted = {
        site: pd.read_csv(folder / "recalibrated" / f"{site}.csv").iloc[0] for site in ("site-siim", "site-rsna")
    }
    siim, rsna = refitted.values()
    assert (siim.class_name, rsna.class_name) == ("Pneumothorax", "Pneumonia")
    assert siim.positives + siim.negatives == rsna.positives + rsna.negatives == 20
    assert siim.val_labelled == rsna.val_labelled == 20 and siim.val_cases == rsna.val_cases == 13
    assert "fitted on 20 validation images (13 cases at each)" in text
    assert (
        f"SIIM's Pneumothorax shift {siim.intercept_shift:+.2f} took its test loss from {siim.loss:.2f} to "
        f"{siim.recalibrated_loss:.2f} and RSNA's Pneumonia {rsna.intercept_shift:+.2f} from {rsna.loss:.2f} to "
        f"{rsna.recalibrated_loss:.2f}, at the same test AUROC ({siim.auroc:.2f} and {rsna.auroc:.2f}, 20 images each)"
    ) in text
    using = " ".join((REPOSITORY / "docs" / "using-the-model.md").read_text().split())
    assert f"it took the SIIM site's test loss from {siim.loss:.2f} to {siim.recalibrated_loss:.2f}" in using
    consortium = json.loads((REPOSITORY / "docs" / "clean-sweep" / "results.json").read_text())["cxr_consortium"]
    assert (
        f"and there it learns below chance ({consortium['seconds']:.0f} s in the clean sweep's run of it on a 2-core "
        f"{consortium['machine'].split(' (')[0]})"
    ) in text
    folder = folder / "scratch"
    record = json.loads((folder / "scores.json").read_text())
    rounds, sites = record["rounds"], record["sites"]
    for model, round_number in (("best", "0"), ("final", "2")):  # the script scored the models the sites validated
        assert np.mean([site[model]["mean_auroc"] for site in sites.values()]) == pytest.approx(rounds[round_number])
    assert (
        f"AUROC is {rounds['-1']:.3f} before training, {rounds['0']:.3f} for the model judged best by validation loss "
        f"(round 0) and {rounds['2']:.3f} for the final one, below the untrained start"
    ) in text
    assert rounds["0"] < rounds["2"] < rounds["-1"] < 0.5

    def spread(model: str, figure: str, digits: int = 2) -> tuple[float, float]:
        values = [site[model][figure] for site in sites.values()]
        return round(min(values), digits), round(max(values), digits)

    low, high = spread("best", "features_vs_glyphs")
    assert f"(their sum correlates {low:.2f} to {high:.2f} with the glyph count, by site)" in text and low > 0
    weights = {site["best"]["head_weight_mean"] for site in sites.values()}  # one model: one figure
    (shift,) = weights
    (spread_sd,) = {round(site["best"]["head_weight_sd"], 3) for site in sites.values()}
    assert f"moved by {shift:.4f} on average (their spread {spread_sd:.3f} unchanged)" in text
    # drawn uniform in +-1/sqrt(inputs), the initial rows' spread is that bound over sqrt(3)
    assert spread_sd == round(1 / math.sqrt(1024) / math.sqrt(3), 3)
    best, final = spread("best", "mean_logit_vs_features"), spread("final", "mean_logit_vs_features")
    assert (
        f"at every site the mean logit correlates {best[1]:.2f} to {best[0]:.2f} with the summed features (the final "
        f"model: {final[1]:.2f} to {final[0]:.2f})"
    ) in text
    assert best[1] < -0.5 and final[1] < -0.5
    alone, prior = record["alone"], record["prior_prevalence"]
    initial = json.loads((folder / "round_history.json").read_text())[0]["validation"]["sites"]
    for site, runs in alone.items():  # each site alone starts where the federation did
        assert runs["as_started"][0] == runs["prior"][0] == pytest.approx(initial[site]["val_mean_auroc"], abs=1e-9)
        # and its warm-up is the federation's round 0 at that site (its local model's AUROC: other thread counts)
        assert runs["as_started"][1] == pytest.approx(initial[site]["local_val_mean_auroc"], abs=0.005)
    quoted = []
    for epoch in (1, 3):
        started, remedied = ([runs[kind][epoch] for runs in alone.values()] for kind in ("as_started", "prior"))
        higher = sum(after > before for before, after in zip(started, remedied, strict=True))
        lower = sum(after < before for before, after in zip(started, remedied, strict=True))
        quoted.append((np.mean(started), np.mean(remedied), higher, lower))
    (warm, warm_to, warm_higher, _), (later, later_to, later_higher, later_lower) = quoted
    assert (
        f"Tried on each site alone at {prior * 100:g} % (the same script, its record's `alone`: each site's config "
        f"from the job's random start, the warm-up then two epochs, one seed), it raises the sites' mean validation "
        f"AUROC after the warm-up from {warm:.3f} to {warm_to:.3f} (higher at {warm_higher} sites of {len(alone)}) and "
        f"after two more epochs from {later:.3f} to {later_to:.3f} (higher at {later_higher}, lower at {later_lower})."
    ) in text
    union = pd.read_csv(folder.parent / "union_classes.csv")
    rows = [
        {"class": name, "sites": held.split(";"), "labelled_by": count, "shared": shared == "yes"}
        for name, held, count, shared in union.itertuples(index=False)
    ]
    page = (REPOSITORY / "docs" / "cxr-consortium.md").read_text()
    lines = union_table_lines(rows, limit=10)
    assert f"U{lines[0][1:]}:\n\n" + "\n".join(lines[1:13]) in page
    assert f"and {len(rows) - 10} more (the CSV has them all)" in text


# the settings of the direction-first-round table: sites, the runs' name suffix (their start), the table's label
DIRECTION_SETTINGS = ((3, "", "3 (1)"), (7, "", "7 (1)"), (3, "-stand-in", "3 (1; from the stand-in)"))


def _direction_table(runs: dict) -> list[str]:
    """The table of the attack suite's update attacks with the direction check in the first round only: each honest
    site's best test AUROC by layout (CheXpert's, NIH's) against the clean run and the honest sites alone."""

    def by_layout(run: dict, honest: list[str]) -> list[float]:
        values = []
        for layout in ("chexpert", "nih"):
            (value,) = {round(run["best_auroc"][site], 3) for site in honest if site.startswith(f"site-{layout}")}
            values.append(value)
        return values

    def listed(values: list[float]) -> str:
        return ", ".join(f"{value:.3f}" for value in values)

    def minus(ours: list[float], theirs: list[float]) -> str:
        return ", ".join(f"{one - other:+.3f}" for one, other in zip(ours, theirs, strict=True))

    lines = [
        '| attack | sites (attackers) | clean run | the honest sites alone | `"first_round"` | minus the honest sites '
        "alone | minus the clean run |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    first = runs["first_round"]
    for sites, start, setting in DIRECTION_SETTINGS:
        for attack in ("sign_flip", "ipm"):
            run = first[f"{attack}-{sites}sites-1attackers-seed1{start}"]
            honest = [site for site in run["best_auroc"] if site not in run["attacking_sites"]]
            clean = by_layout(first[f"clean-{sites}sites-0attackers-seed1{start}"], honest)
            alone = by_layout(first[f"honest_alone-{sites}sites-1attackers-seed1{start}"], honest)
            got = by_layout(run, honest)
            lines.append(
                f"| {attack} | {setting} | {listed(clean)} | {listed(alone)} | {listed(got)} | {minus(got, alone)} "
                f"| {minus(got, clean)} |"
            )
    return lines


def test_the_direction_check_in_the_first_round_only_is_its_record():
    """docs/server-checks.md: the consortium from the stand-in with the direction check off (round 2 cleared by the
    sites' validation and the best model), and the price of judging direction in the first round only."""
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    off = json.loads((REPOSITORY / "docs" / "clean-sweep" / "stand-in-direction-off.json").read_text())[
        "cxr_consortium"
    ]
    assert off["controller"] == {"reject_opposed_updates": False} and off["federation"]["start"] == "stand-in"
    assert not off["rejected"] and off["exit_code"] == 0 and off["published"]
    round_two = off["directions"]["2"]
    assert f"(round 2: PadChest {round_two['site-padchest']:.4f}, VinDr {round_two['site-vindr']:.4f})" in page
    verdicts = [
        judge
        for left_out in ("without site-padchest", "without site-vindr")
        for judge in off["screening"][-1]["left_out"][left_out].values()
    ]
    assert {judge["verdict"] for judge in verdicts} == {"neither"} and off["screening"][-1]["excluded"] == []
    siim = off["screening"][-1]["left_out"]["without site-padchest"]["site-siim"]["loss"]["better_by"]
    assert siim == max(judge["loss"]["better_by"] for judge in verdicts)
    share = siim / off["validations"]["2"]["site-siim"]["val_loss"]
    assert f"SIIM's loss {siim:.3f} lower without PadChest's result, {share:.1%} of it" in page.replace(" %", "%")
    models = off["models"]
    assert [number for number, model in models.items() if model["best"]][-1] == "2"
    gain_loss = models["1"]["judged_val_loss"] - models["2"]["judged_val_loss"]
    gain_auroc = models["2"]["mean_val_auroc"] - models["1"]["mean_val_auroc"]
    assert (
        f"judged loss {models['2']['judged_val_loss']:.3f} against round 1's {models['1']['judged_val_loss']:.3f}; the "
        f"sites' mean validation AUROC {models['2']['mean_val_auroc']:.3f} against {models['1']['mean_val_auroc']:.3f}"
    ) in page
    assert (
        f"lowered its judged loss by {gain_loss:.3f} (unrounded) and left its mean AUROC where it was "
        f"(+{gain_auroc:.4f})" in page
    )
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "direction-first-round.json").read_text())
    assert _marked_block(REPOSITORY / "docs" / "server-checks.md", "direction-first-round") == "\n".join(
        _direction_table(runs)
    )
    first = runs["first_round"]
    scratch = {name: run for name, run in first.items() if not name.endswith("-stand-in")}
    assert all(run["best_auroc"] == run["final_auroc"] for run in scratch.values())
    for name, run in first.items():
        if name.endswith("-stand-in") and run["attack"] in ("clean", "honest_alone"):
            # run under the default, which refused nothing: under "first_round" the same run
            assert run["controller"] == {} and not run["rejected"] and run["rejected_rounds"] == {}
        else:
            assert run["controller"] == {"reject_opposed_updates": "first_round"}
    for name, run in runs["every_round"].items():  # the default: refused every round, the honest sites alone exactly
        assert name.startswith(("sign_flip-3sites", "ipm-3sites")) and run["controller"] == {}
        alone = first[f"honest_alone-3sites-1attackers-seed1{'-stand-in' if name.endswith('-stand-in') else ''}"]
        assert run["best_auroc"] == alone["best_auroc"] and run["final_auroc"] == alone["final_auroc"]
        assert run["rejected_rounds"] == {site: [0, 1, 2] for site in run["attacking_sites"]}
    assert {name for name in runs["every_round"] if name.endswith("-stand-in")} == {
        "sign_flip-3sites-1attackers-seed1-stand-in",
        "ipm-3sites-1attackers-seed1-stand-in",
    }
    costs = {sites: [] for sites in (3, 7)}
    for sites in costs:
        for attack in ("sign_flip", "ipm"):
            run = first[f"{attack}-{sites}sites-1attackers-seed1"]
            reference = first[f"honest_alone-{sites}sites-1attackers-seed1"]["best_auroc"]
            costs[sites] += [round(reference[site], 3) - round(score, 3) for site, score in run["best_auroc"].items()]
            assert not run["excluded"] and run["rejected_rounds"] == {site: [0] for site in run["attacking_sites"]}
    assert (
        f"cost the honest sites {min(costs[3]):.3f} to {max(costs[3]):.3f} more at three sites and {min(costs[7]):.3f} "
        f"to {max(costs[7]):.3f} at seven"
    ) in page
    pretrained = []
    for attack in ("sign_flip", "ipm"):
        run = first[f"{attack}-3sites-1attackers-seed1-stand-in"]
        reference = first["honest_alone-3sites-1attackers-seed1-stand-in"]
        assert not run["excluded"] and run["rejected_rounds"] == {site: [0] for site in run["attacking_sites"]}
        for label in ("best", "final"):
            pretrained += [
                round(score, 3) - round(reference[f"{label}_auroc"][site], 3)
                for site, score in run[f"{label}_auroc"].items()
            ]
    assert f"the honest sites' best and final AUROCs moved {min(pretrained):+.3f} to {max(pretrained):+.3f}" in page
    leaving = []
    for start in ("-stand-in", ""):
        clean = round(first[f"clean-3sites-0attackers-seed1{start}"]["best_auroc"]["site-nih-1"], 3)
        alone = round(first[f"honest_alone-3sites-1attackers-seed1{start}"]["best_auroc"]["site-nih-1"], 3)
        leaving.append(f"costs {clean - alone:.3f} (site-nih-1: {alone:.3f} against {clean:.3f})")
    assert f"leaving the third site out {leaving[0]}, where from scratch it {leaving[1]}" in page


def test_the_attack_suite_from_the_stand_in_is_its_record():
    """docs/server-checks.md and the README: the suite's runs from the stand-in (the main job's start) at three and
    four sites, each attack's verdict, the cost of leaving a site out, and the figures the prose quotes."""
    suite = load_benchmark("attack_suite")
    current = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    runs, _ = _before_stop_101()  # the section's runs, before stop 101 ran some again (its own test)
    runs.update(_before_stop_97(suite))  # the four-site runs from scratch the section compares with, before stop 97's
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    stand_in = {name: run for name, run in runs.items() if run.get("start") == "stand-in"}
    for records, readme in ((current, True), (runs, False)):  # the README counts today's table
        attacks = {  # three or more sites (two sites: the suite's table test)
            name: run
            for name, run in records.items()
            if run.get("start") == "stand-in"
            and run["attack"] not in (*suite.REFERENCES, suite.PLACEBO)
            and suite.judged_against_alone(run["sites"])
        }
        assert {run["sites"] for run in attacks.values()} == {3, 4, 7}
        verdicts = {name: suite.verdict(run, suite.clean_of(records, run)) for name, run in attacks.items()}
        assert set(verdicts.values()) == {"holds", "did not take", "breaks through"}
        untaken = [name for name, found in verdicts.items() if found == "did not take"]
        assert all(records[name]["attack"].startswith("backdoor") for name in untaken)
        broken = [name for name, found in verdicts.items() if found == "breaks through"]
        assert {records[name]["attack"] for name in broken} == {"backdoor_glyph"}
        assert all(suite.verdict(records[name], suite.alone_of(records, records[name])) == "breaks through"
                   for name in broken)  # fmt: skip
        own = [value for name in untaken for value in records[name]["attackers_own_backdoor_success"].values()]
        below = max(-suite.lowest_margin(run, suite.alone_of(records, run))
                    for run in attacks.values() if run["attack"] == "mimic_noised")  # fmt: skip
        assert below < suite.TOLERANCE  # the near-copy, the closest of the rest
        if readme:
            assert (
                f"From the stand-in (one seed; three or more sites) {len(attacks) - len(untaken) - len(broken)} of "
                f"{len(attacks)} runs hold, {len(untaken)} backdoors did not take ({min(own):.1%} to {max(own):.1%} "
                f"at the attacker), {len(broken)} with a glyph trigger {'breaks' if len(broken) == 1 else 'break'} "
                "through."
            ).replace("%", " %").replace(" % to", " to") in " ".join(_readme().split())
    # the runs before stop 101 (the loop's last pass): the whole catalogue at three sites
    catalogue = {run["attack"] for run in attacks.values() if run["sites"] == 3 and suite._size(run)[0] == 100}
    assert catalogue == set(suite.ATTACKS)  # the whole catalogue
    for sites, quoted in ((3, "on commit 14564e8, {} to {} s a run"), (4, "on the same commit, {} to {} s a run")):
        seconds = [run["seconds"] for run in stand_in.values() if run["sites"] == sites and suite._size(run)[0] == 100]
        assert quoted.format(round(min(seconds)), round(max(seconds))) in page, sites
    tuned = runs["backdoor_tuned-3sites-1attackers-seed1-400p5r-stand-in"]
    assert verdicts["backdoor_tuned-3sites-1attackers-seed1-400p5r-stand-in"] == "holds"
    assert tuned["rejected"] == tuned["attacking_sites"] == ["site-nih-2"]

    def cost(name: str) -> str:
        alone = runs[name]
        return f"{-suite.lowest_margin(alone, suite.clean_of(runs, alone)):.3f}"

    def margin(name: str, reference=None) -> str:
        run = runs[name]
        return f"{suite.lowest_margin(run, (reference or suite.clean_of)(runs, run)):+.3f}"

    def success(name: str) -> str:
        return f"{runs[name]['best_backdoor_success']:.1%}".replace("%", " %")

    three, four = "3sites-1attackers-seed1", "4sites-1attackers-seed1"
    assert (
        f"Leaving the third site out costs {cost(f'honest_alone-{three}-stand-in')} here (the honest sites alone "
        f"against the clean run), where from scratch it costs {cost(f'honest_alone-{three}')}"
    ) in page
    assert (
        f"the near-copy (`mimic_noised`) costs the most, {margin(f'mimic_noised-{three}-stand-in')} "
        f"({margin(f'mimic_noised-{three}-stand-in', suite.alone_of)} against the honest sites alone: worse than "
        f"leaving the attacker out), the late label "
        f"flip {margin(f'label_flip_late-{three}-stand-in')}, and the backdoor's success is "
        f"{success(f'backdoor-{three}-stand-in')} against the clean model's "
        f"{success('clean-3sites-0attackers-seed1-stand-in')}"
    ) in page
    assert (
        f"Leaving the fourth site out costs {cost(f'honest_alone-{four}-stand-in')} (from scratch "
        f"{cost(f'honest_alone-{four}')})"
    ) in page
    assert (
        f"the late label flip {margin(f'label_flip_late-{four}-stand-in')} and the near-copy "
        f"{margin(f'mimic_noised-{four}-stand-in')} (from scratch {margin(f'label_flip_late-{four}')} and "
        f"{margin(f'mimic_noised-{four}')}: both broke through against the clean run), the near-copy again "
        f"{margin(f'mimic_noised-{four}-stand-in', suite.alone_of)} against the honest sites alone; the backdoor's "
        f"success "
        f"{success(f'backdoor-{four}-stand-in')} and the boosted one's {success(f'backdoor_boosted-{four}-stand-in')} "
        f"against the clean model's {success('clean-4sites-0attackers-seed1-stand-in')}"
    ) in page
    copied = runs[f"mimic_noised-{four}-stand-in"]
    assert copied["rejected"] == ["site-chexpert-2", "site-nih-1"] and copied["attacking_sites"] == ["site-nih-2"]
    assert "site-chexpert-2 in round 1 and site-nih-1 in round 2, by the direction check" in page
    bn, clean3 = runs[f"bn_inflate-{three}-stand-in"], runs["clean-3sites-0attackers-seed1-stand-in"]
    assert all(bn["best_auroc"][site] == clean3["best_auroc"][site] for site in bn["best_auroc"])  # FedBN+: nothing
    assert "its run is the clean run's to the bit" in page
    off = json.loads((REPOSITORY / "docs" / "attack-suite" / "stand-in-defences-off.json").read_text())
    controls = {"update_bound": None, "clip_updates": False, "reject_opposed_updates": False,
                "robust_aggregation": "mean", "validation_guard": False}  # fmt: skip
    assert all(run["controller"] == controls and run["start"] == "stand-in" for run in off.values())
    flipped, copied_off = off[f"sign_flip-{three}-stand-in"], off[f"mimic_noised-{three}-stand-in"]
    backdoor_off = off[f"backdoor-{three}-stand-in"]  # the rates, not the defences: it does not take without them
    assert suite.verdict(backdoor_off, suite.clean_of(off, backdoor_off)) == "did not take"
    assert (
        f"`--attacks backdoor`, {backdoor_off['seconds']:.0f} s, the attacker's own model scored it at "
        f"{max(backdoor_off['attackers_own_backdoor_success'].values()):.1%} and the global model at "
        f"{backdoor_off['best_backdoor_success']:.1%} against that clean run's "
        f"{suite.clean_of(off, backdoor_off)['best_backdoor_success']:.1%}: the rates, not the defences"
    ).replace("%", " %") in page
    assert not flipped["rejected"] and suite.verdict(flipped, suite.clean_of(off, flipped)) == "breaks through"
    clean_off = suite.clean_of(off, flipped)
    assert (
        f"`sign_flip` costs site-nih-1 {suite.lowest_margin(flipped, clean_off):+.3f} against that clean run "
        f"({flipped['best_auroc']['site-nih-1']:.3f} against {clean_off['best_auroc']['site-nih-1']:.3f})"
    ) in page
    assert min(flipped["best_auroc"], key=flipped["best_auroc"].get) == "site-nih-1"
    without = suite.lowest_margin(copied_off, suite.clean_of(off, copied_off))
    with_them = margin(f"mimic_noised-{three}-stand-in")
    assert f"**The near-copy costs less without them** ({without:+.3f} against {with_them} with them)" in page
    seven = "7sites-1attackers-seed1-stand-in"
    seven_runs = [run for run in stand_in.values() if run["sites"] == 7 and run["attack"] != "backdoor_glyph"]
    assert (
        f"the code of commit 3768d6c, {min(run['seconds'] for run in seven_runs):.0f} to "
        f"{max(run['seconds'] for run in seven_runs):.0f} s a run with short tests beside it). Leaving the seventh "
        f"site out costs {cost(f'honest_alone-{seven}')} "
        f"(from scratch {cost('honest_alone-7sites-1attackers-seed1')}); "
        f"`label_flip`, left out in its warm-up round, ends there; the near-copy {margin(f'mimic_noised-{seven}')} "
        f"({margin(f'mimic_noised-{seven}', suite.alone_of)} against the honest sites alone), the late label flip "
        f"{margin(f'label_flip_late-{seven}')}, `alie` {margin(f'alie-{seven}')}, each never refused or left out"
    ) in page
    assert runs[f"label_flip-{seven}"]["excluded"] == ["site-nih-4"]
    assert margin(f"label_flip-{seven}", suite.alone_of) == "+0.000"
    assert not any(runs[f"{attack}-{seven}"]["rejected"] for attack in ("mimic_noised", "label_flip_late", "alie"))

    def percent(value: float) -> str:
        return f"{value:.1%}".replace("%", " %")

    def own_success(name: str) -> str:
        return percent(max(runs[name]["attackers_own_backdoor_success"].values()))

    large = "3sites-1attackers-seed1-400p5r-stand-in"
    cleans = [run["best_backdoor_success"] for run in stand_in.values() if run["attack"] == "clean"]
    clean_large = f"clean-{large}".replace("1attackers", "0attackers")
    seconds = [runs[name]["seconds"] for name in (clean_large, f"honest_alone-{large}", f"backdoor-{large}")]
    assert (
        f"The attacker's own last local model scored its trigger at {own_success(f'backdoor-{three}-stand-in')} at "
        f"three sites, {own_success(f'backdoor-{four}-stand-in')} at four and "
        f"{own_success('backdoor-7sites-1attackers-seed1-stand-in')} at seven (the boosted one's "
        f"{own_success(f'backdoor_boosted-{three}-stand-in')} and {own_success(f'backdoor_boosted-{four}-stand-in')}), "
        f"and at 400 patients a site and 5 rounds (`--settings 3:1 --start stand-in --patients 400 --rounds 5 "
        f"--attacks backdoor --references honest_alone`, on commit 7c5e767, {min(seconds):.0f} to {max(seconds):.0f} s "
        f"a run) {own_success(f'backdoor-{large}')}, where the clean models score {percent(min(cleans))} to "
        f"{percent(max(cleans))}"
    ) in page
    assert (
        f"the same attack reached {success('backdoor-3sites-1attackers-seed1-400p5r')} at three sites of 400 patients"
    ) in page
    assert (
        f"of commit 3768d6c, {tuned['seconds']:.0f} s) taught its own model the trigger to "
        f"{own_success(f'backdoor_tuned-{large}')} only, and its results were refused from round 2 on"
    ) in page
    glyph = runs[f"backdoor_glyph-{large}"]
    assert not glyph["rejected"] and not glyph["excluded"]
    assert (
        f"the code of commit 19fce85, {glyph['seconds']:.0f} s; the clean run and the honest sites alone scored again "
        f"with that trigger by `--rescore`) the attacker's own model learned it "
        f"({own_success(f'backdoor_glyph-{large}')}), "
        f"and the honest sites' best global model scores {percent(suite.success_of(glyph, 'backdoor_glyph'))} of the "
        f"triggered negatives above its 95th percentile against the clean model's "
        f"{percent(suite.success_of(runs[clean_large], 'backdoor_glyph'))} (its final model "
        f"{percent(suite.success_of(glyph, 'backdoor_glyph', 'final'))}), with the clean images' AUROC "
        f"{margin(f'backdoor_glyph-{large}')}; nothing was refused or left out"
    ) in page
    glyph7 = runs["backdoor_glyph-7sites-1attackers-seed1-stand-in"]
    clean7 = runs["clean-7sites-0attackers-seed1-stand-in"]
    assert not glyph7["rejected"] and not glyph7["excluded"]
    assert (
        f"(`--settings 7:1 --attacks backdoor_glyph`, the same code, {glyph7['seconds']:.0f} s) it breaks through too: "
        f"the attacker's own model {own_success('backdoor_glyph-7sites-1attackers-seed1-stand-in')}, the honest sites' "
        f"best global model {percent(suite.success_of(glyph7, 'backdoor_glyph'))} against the clean model's "
        f"{percent(suite.success_of(clean7, 'backdoor_glyph'))}, nothing refused or left out (against the honest sites "
        f"alone's {percent(suite.success_of(suite.alone_of(runs, glyph7), 'backdoor_glyph'))}, "
        f"{100 * suite.backdoor_above(glyph7, suite.alone_of(runs, glyph7)):.1f} points: at the tolerance's edge"
    ) in page
    assert (
        f"the global model's success {success(f'backdoor_tuned-{large}')}, the clean model's "
        f"{success(clean_large)}; it holds"
    ) in page


def test_patch_hardening_against_the_backdoors_is_the_pages_figures():
    """docs/server-checks.md on patch hardening, tried and withdrawn (docs/attack-suite/patch-hardening.json: runs
    with every honest site's ``patch_hardening`` at 0.5, the attacker's off): the clean run's cost against the one
    without it, and each backdoor's success against its hardened clean run and without the hardening."""
    suite = load_benchmark("attack_suite")
    plain = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    hardened = json.loads((REPOSITORY / "docs" / "attack-suite" / "patch-hardening.json").read_text())
    assert {json.dumps(run["honest_sites"]) for run in hardened.values()} == {'{"patch_hardening": 0.5}'}
    text = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    clean, glyph = (f"{attack}-3sites-{count}attackers-seed1-400p5r-stand-in" for attack, count in
                    (("clean", 0), ("backdoor_glyph", 1)))  # fmt: skip

    def percent(value: float) -> str:
        return f"{value:.1%}".replace("%", " %")

    def aurocs(run: dict) -> str:
        return " and ".join(f"{run['best_auroc'][site]:.3f}" for site in ("site-chexpert-1", "site-nih-1"))

    assert (
        f"the clean run lost at most {-suite.lowest_margin(hardened[clean], plain[clean]):.3f} "
        f"(best models {aurocs(hardened[clean])} against {aurocs(plain[clean])} without it)"
    ) in text
    success = [suite.success_of(hardened[glyph], "backdoor_glyph", label) for label in ("best", "final")]
    assert (
        f"the glyph backdoor's success was {percent(success[0])} by the best model and {percent(success[1])} by the "
        f"final one against that clean run's {percent(suite.success_of(hardened[clean], 'backdoor_glyph'))} (without "
        f"hardening {percent(suite.success_of(plain[glyph], 'backdoor_glyph'))} and "
        f"{percent(suite.success_of(plain[glyph], 'backdoor_glyph', 'final'))} against "
        f"{percent(suite.success_of(plain[clean], 'backdoor_glyph'))}; the attacker's own model "
        f"{percent(hardened[glyph]['attackers_own_backdoor_success']['site-nih-2'])} against "
        f"{percent(plain[glyph]['attackers_own_backdoor_success']['site-nih-2'])}): it breaks through as before"
    ) in text
    assert suite.verdict(hardened[glyph], hardened[clean]) == "breaks through"
    assert f"840e99f, {round(hardened[clean]['seconds'])} and {round(hardened[glyph]['seconds'])} s," in text
    square_clean, square = "clean-3sites-0attackers-seed1-400p5r", "backdoor-3sites-1attackers-seed1-400p5r"
    assert (
        f"From scratch the square backdoor's success was {percent(hardened[square]['best_backdoor_success'])} "
        f"against the hardened clean run's {percent(hardened[square_clean]['best_backdoor_success'])} (without "
        f"hardening {percent(plain[square]['best_backdoor_success'])} against "
        f"{percent(plain[square_clean]['best_backdoor_success'])}; the attacker's own model "
        f"{percent(hardened[square]['attackers_own_backdoor_success']['site-nih-2'])})"
    ) in text
    assert suite.verdict(hardened[square], hardened[square_clean]) == "breaks through"
    assert (
        f"commit e03487b, {round(hardened[square_clean]['seconds'])} and {round(hardened[square]['seconds'])} s;"
    ) in text


def test_the_attack_suite_at_two_sites_is_its_record():
    """docs/server-checks.md's paragraphs on two sites under the rules of stops 93 to 95, from scratch and from the
    stand-in: the catalogue's counts of each verdict against the clean run under the two-site rule, the runs' times,
    the figures of each attack the prose names, from docs/attack-suite/two-sites-before-stop96.json (the table's rows
    before stop 96 ran them again); the runs under the withdrawn rules and before any two-site rule, from
    their own records."""
    suite = load_benchmark("attack_suite")
    docs = REPOSITORY / "docs" / "attack-suite"
    runs = _with_two_sites_before_stop_96()  # the rules of stops 93 to 95, under which these paragraphs' runs ran
    text = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())

    def margin(run: dict, clean: dict) -> str:  # the largest loss against the clean run, as the prose writes it
        return f"{suite.lowest_margin(run, clean):+.3f}".replace("+", "")

    cleans = {}
    for start in ("scratch", "stand-in"):
        two = {run["attack"]: run for run in runs.values() if run["sites"] == 2 and run.get("start") == start}
        clean = cleans[start] = two[suite.CLEAN]
        verdicts = {attack: suite.verdict(run, clean) for attack, run in two.items() if attack in suite.ATTACKS}
        assert len(verdicts) == len(suite.ATTACKS)
        broken, closed = (list(verdicts.values()).count(word) for word in ("breaks through", "fails closed"))
        heading = (
            f"from scratch {broken} of the 15 attacks break{'s' * (broken == 1)} through and {closed} fail closed"
            if start == "scratch"
            else f"Before stop 96, from the stand-in, at two sites, {broken or 'none'} of the 15 breaks through and "
            f"{closed} fail closed"
        )
        assert heading in text, heading
        for attack in ("sign_flip_quiet", "sign_flip_late"):  # beyond the catalogue: stopped, after rounds 0 and 1
            assert suite.verdict(two[attack], clean) == "fails closed", (start, attack)
        assert two["sign_flip_quiet"]["stopped"].startswith("round 0: ")
        assert two["sign_flip_late"]["stopped"].startswith("round 1: ")
        inside = two["sign_flip_inside"]
        for figures in list(inside["two_sites"].values())[1:]:  # inside both bounds, as built
            assert -0.5 < figures["backbone_cosine"] <= -0.45 and figures["shared_rows_mean_cosine"] == -0.85
        seconds = [round(run["seconds"]) for attack, run in two.items() if attack != suite.ALONE]
        assert f"{min(seconds)} to {max(seconds)} s a run" in text, start
        if start == "scratch":
            assert f"so even the placebo ({margin(two[suite.PLACEBO], clean)} against the clean run)" in text
            assert sorted(attack for attack, verdict in verdicts.items() if verdict == "breaks through") == [
                "backdoor_boosted"]  # fmt: skip
            stop93 = json.loads((docs / "two-sites-stop93.json").read_text())["bn_inflate-2sites-1attackers-seed1"]
            assert suite.verdict(stop93, clean) == "breaks through"
            assert f"Before stop 94 `bn_inflate` broke through too ({margin(stop93, clean)}, exit 0:" in text
            inflated = two["bn_inflate"]
            assert verdicts["bn_inflate"] == "fails closed" and inflated["stopped"].startswith("round 0: ")
            pattern = r"(site-\w+) reads a BatchNorm layer of the candidate ([0-9.]+)"
            read = {site: float(value) for site, value in re.findall(pattern, inflated["stopped"])}
            assert all(value > judging.BATCHNORM_APART for value in read.values())
            assert (
                f"site-nih read a BatchNorm layer of the candidate {read['site-nih']:.2f} further from its images than "
                f"its own model's, and the attacker's own honest validation {read['site-chexpert']:.2f})" in text
            )
            reader = two["bn_inside"]
            assert suite.verdict(reader, clean) == "breaks through" and reader["exit_code"] == 0
            readings = [reader["validations"][index]["site-nih"]["val_batchnorm_minus_own"] for index in "012"]
            assert all(value <= judging.BATCHNORM_APART for value in readings)
            losses = [reader["validations"][index]["site-nih"]["val_loss"] for index in "012"]
            clean_losses = [clean["validations"][index]["site-nih"]["val_loss"] for index in "012"]
            assert losses == sorted(losses) and clean_losses == sorted(clean_losses, reverse=True)
            shown = margin(reader, clean)
            read_at = ", ".join(f"{value:.2f}" for value in readings)
            final, clean_final = reader["final_auroc"]["site-nih"], clean["final_auroc"]["site-nih"]
            clean_first = clean["validations"]["0"]["site-nih"]["val_mean_auroc"]
            for said in (
                f"**`bn_inside`, the reader of the BatchNorm bound, breaks through** ({shown}, exit 0",
                f"site-nih read its candidates at {read_at} in rounds 0, 1",
                f"({reader['best_auroc']['site-nih']:.3f} on the test set; the clean run's round-0 candidate was poor "
                f"too, site-nih's validation AUROC {clean_first:.3f}), while "
                f"the last model matches the clean run's ({final:.3f} against {clean_final:.3f})",
                f"validation loss of the later candidates ({', '.join(f'{value:.3f}' for value in losses)} in rounds",
                f"(the suite's `bn_inside`, [below](#attackers-who-know-the-rules): {shown} against",
            ):
                assert said in text, said
            rerun = json.loads((docs / "two-sites-rerun-stop94.json").read_text())
            assert sorted(run["attack"] for run in rerun.values()) == sorted(
                set(two) - {"bn_inflate", "bn_inside", suite.ALONE}
            )
            for name, run in rerun.items():  # the rule on, each outcome as recorded
                assert all(run[key] == runs[name][key] for key in ("best_auroc", "final_auroc", "exit_code", "stopped"))
            rerun_readings = [
                (figures["site-nih"]["val_batchnorm_minus_own"], run["attack"], index)
                for run in rerun.values()
                for index, figures in run["validations"].items()
                if "val_batchnorm_minus_own" in figures.get("site-nih", {})
            ]
            top_reading = max(rerun_readings)
            clean_first_reading = rerun["clean-2sites-0attackers-seed1"]["validations"]["0"]["site-nih"]
            assert top_reading[0] == clean_first_reading["val_batchnorm_minus_own"]  # the clean run's round 0
            rerun_seconds = [run["seconds"] for run in rerun.values()]
            for said in (
                f"`--out results/r94/suite-k2-all`, {min(rerun_seconds):.0f} to {max(rerun_seconds):.0f} s a run; "
                f"[record](attack-suite/two-sites-rerun-stop94.json)), each of these {len(rerun)} runs",
                f"site-nih read none of their candidates further than {top_reading[0]:.2f} (the clean run's round 0)",
            ):
                assert said in text, said
            seed2 = json.loads((docs / "two-sites-batchnorm-seed2.json").read_text())
            second = {run["attack"]: run for run in seed2.values()}
            seconds = [run["seconds"] for run in second.values()]
            first_clean = second[suite.CLEAN]
            stopped = dict(re.findall(pattern, second["bn_inflate"]["stopped"]))
            assert suite.verdict(second["bn_inflate"], first_clean) == "fails closed"
            assert suite.verdict(second["bn_inside"], first_clean) == "breaks through"
            kept = second["bn_inside"]["final_auroc"]["site-nih"]
            for said in (
                f"same command and commit, {min(seconds):.0f} to {max(seconds):.0f} s a run;",
                f"`bn_inflate` fails closed after round 0 (site-nih read {float(stopped['site-nih']):.2f})",
                f"`bn_inside` breaks through ({margin(second['bn_inside'], first_clean)}, the round-0 model kept "
                "again, "
                f"its last model {kept:.3f} against the clean run's {first_clean['final_auroc']['site-nih']:.3f}; "
                f"the placebo {margin(second[suite.PLACEBO], first_clean)})",
            ):
                assert said in text, said
            boosted = two["backdoor_boosted"]
            assert (
                f"`backdoor_boosted` ({margin(boosted, clean)}, success {boosted['best_backdoor_success']:.1%} "
                f"against the clean model's {clean['best_backdoor_success']:.1%}"
            ).replace("%", " %") in " ".join(text.replace("%", " %").split())
            assert verdicts["label_flip_late"] == "fails closed"
            assert two["label_flip_late"]["stopped"].startswith("round 1: ")
            assert suite.verdict(inside, clean) == "breaks through"
            assert f"to a backbone cosine of -0.45 and rows of -0.85) breaks through ({margin(inside, clean)})" in text
            # what the honest site's own validation ranked their candidates after the first round
            stop93_runs = {**two, "bn_inflate": stop93}  # the inflated statistics as they ran before stop 94's rule
            drops = {
                attack: max(
                    -stop93_runs[attack]["validations"][index]["site-nih"]["val_auroc_minus_own"]
                    for index in ("1", "2")
                )
                for attack in ("bn_inflate", "backdoor_boosted", "sign_flip_inside", suite.PLACEBO)
            }
            assert max(drops, key=drops.get) == "bn_inflate"
            assert (
                f"at most {drops['bn_inflate']:.3f} below its own model (`bn_inflate`'s round 2, before the BatchNorm "
                "rule; a placebo's " in text
            )
            assert f"a placebo's {-drops[suite.PLACEBO]:.3f})" in text
            worst = stop93["validations"]["2"]["site-nih"]
            z = (-worst["val_auroc_minus_own"] - judging.AUROC_HARM) / worst["val_auroc_minus_own_se"]
            level = judging.round_level(clean["job_rounds"]) / len(judging.TESTS)
            assert (
                f"(p = {judging.normal_upper_tail(z):.2f} against {level:.2g}, the round's level for one test" in text
            )
        else:
            assert "breaks through" not in verdicts.values()
            reader = two["bn_inside"]
            most = max(
                figures["site-nih"]["val_batchnorm_minus_own"] for figures in list(reader["validations"].values())[1:]
            )
            assert suite.verdict(reader, clean) == "holds"
            assert (
                f"so does `bn_inside`, {margin(reader, clean)}, site-nih reading its candidates {most:.2f} at most"
                in text
            )
            assert f"(the placebo {suite.lowest_margin(two[suite.PLACEBO], clean):+.3f})" in text.replace(
                "run, 0.712 alone; the placebo", "(the placebo"
            )
            assert (
                suite.verdict(inside, clean) == "holds"
                and f"`sign_flip_inside` holds ({margin(inside, clean)})" in text
            )
            late = two["label_flip_late"]
            assert f"`label_flip_late` ({margin(late, clean)}: " in text
            assert (
                f"its rows and its backbone reach {late['two_sites']['2']['shared_rows_mean_cosine']:.2f} and " in text
            )
            assert f"and {late['two_sites']['2']['backbone_cosine']:.2f} in round 2" in text
    second = {
        run["attack"]: run for run in json.loads((docs / "two-sites-stand-in-seed2-bounds.json").read_text()).values()
    }
    seconds = [run["seconds"] for run in second.values()]
    assert f"commit 10abea0, {min(seconds):.0f} to {max(seconds):.0f} s a run;" in text
    assert {run["seed"] for run in second.values()} == {2} and {run["start"] for run in second.values()} == {"stand-in"}
    clean = second[suite.CLEAN]
    rows = [f"{second[attack]['two_sites']['0']['shared_rows_mean_cosine']:.2f}" for attack in ("sign_flip",
            "sign_flip_quiet", "label_flip")]  # fmt: skip
    assert (
        f"the placebo {suite.lowest_margin(second[suite.PLACEBO], clean):+.3f}; `sign_flip`, `sign_flip_quiet` and "
        f"`label_flip` fail closed after round 0 (rows {', '.join(rows)}), `sign_flip_late` after round 1; "
        f"`sign_flip_inside` holds ({suite.lowest_margin(second['sign_flip_inside'], clean):+.3f})"
    ) in text
    for attack, stopped_in in (("sign_flip", 0), ("sign_flip_quiet", 0), ("label_flip", 0), ("sign_flip_late", 1)):
        assert suite.verdict(second[attack], clean) == "fails closed"
        assert second[attack]["stopped"].startswith(f"round {stopped_in}: "), attack
    assert suite.verdict(second["sign_flip_inside"], clean) == "holds"
    earlier = json.loads((docs / "two-sites-stop92.json").read_text())  # stop 92's runs, under its rule alone
    for start, attack, verdict in (
        ("scratch", "label_flip_late", "breaks through"),
        ("scratch", "sign_flip_late", "breaks through"),
        ("stand-in", "sign_flip_late", "holds"),
    ):
        before = {run["attack"]: run for run in earlier.values() if run.get("start") == start}
        assert suite.verdict(before[attack], before[suite.CLEAN]) == verdict, (start, attack)
        if start == "scratch":
            assert f"`{attack}` ({margin(before[attack], before[suite.CLEAN])})" in text
        else:
            assert f"(under stop 92's rule it held, {margin(before[attack], before[suite.CLEAN])})" in text
    withdrawn = json.loads((docs / "two-sites-withdrawn-rules.json").read_text())
    assert {run["attack"] for run in withdrawn.values()} == {"sign_flip_late", "label_flip_late", "sign_flip_own"}
    assert all(suite.verdict(run, cleans[run["start"]]) == "fails closed" for run in withdrawn.values())
    for start, said in (
        ("scratch", "commit 3fd4eb6, {} to {} s a run"),
        ("stand-in", "from the stand-in ({} to {} s a run)"),
    ):
        seconds = [round(run["seconds"]) for run in withdrawn.values() if run["start"] == start]
        assert said.format(min(seconds), max(seconds)) in text, start
    cosines = [  # the backbone rule's figures in the stop messages of the two from the stand-in stopped in round 2
        withdrawn[f"{attack}-2sites-1attackers-seed1-stand-in"]["stopped"].split("(cosine ")[1][:5]
        for attack in ("sign_flip_own", "label_flip_late")
    ]
    assert f"after round 2 by the backbone rule ({cosines[0]}, {cosines[1]})" in text
    stop91 = json.loads((docs / "two-sites-stop91.json").read_text())
    before = {run["attack"]: run for run in stop91.values() if run["start"] == "scratch"}
    old_clean = before[suite.CLEAN]
    verdicts = {attack: suite.verdict(run, old_clean) for attack, run in before.items() if attack in suite.ATTACKS}
    assert list(verdicts.values()).count("breaks through") == 4 and "fails closed" not in verdicts.values()
    assert "4 of the 15 broke through and none failed closed" in text
    for attack in ("sign_flip", "bn_inflate", "backdoor_boosted", "label_flip_late", "sign_flip_quiet"):
        assert f"`{attack}` {margin(before[attack], old_clean)}" in text, attack
    seed2 = json.loads((docs / "two-sites-stand-in-seed2.json").read_text())
    second = {run["attack"]: run for run in seed2.values()}  # the stand-in's second seed, in its own record
    clean = second.pop(suite.CLEAN)
    assert {run["seed"] for run in second.values()} == {2} and clean["seed"] == 2
    seconds = [run["seconds"] for run in (clean, *second.values())]
    assert f"commit 916c557, {round(min(seconds))} to {round(max(seconds))} s a run;" in text
    quiet = second["sign_flip_quiet"]
    assert (
        f"the placebo {suite.lowest_margin(second[suite.PLACEBO], clean):+.3f}, `label_flip` "
        f"{margin(second['label_flip'], clean)}, `sign_flip` fails closed by its own validation, `sign_flip_quiet` "
        f"{margin(quiet, clean)} ({quiet['best_auroc']['site-nih']:.3f} against "
        f"{clean['best_auroc']['site-nih']:.3f}), exit 0."
    ) in text


def _two_site_rounds(results: dict, seeds: range = range(300, 332)) -> list[tuple[str, int, dict]]:
    """Every round of two of a sweep record's federations of ``seeds`` (default stop 92's, which the bounds on
    opposite updates were chosen by): (federation, round, its ``two_sites`` figures)."""
    return [
        (name, int(index), figures)
        for name, result in sorted(results.items())
        if result["federation"]["seed"] in seeds
        for index, figures in result.get("two_sites", {}).items()
        if figures
    ]


def test_the_two_site_bounds_were_tested_on_federations_no_rule_had_seen():
    """docs/server-checks.md's test of the two-site bounds (stop 93): the eleven two-site draws of seeds 335-366 (from
    the stand-in, four also from scratch), their times, none stopped, their figures; that no round of any two-site
    federation recorded crossed the rule (``core.robust.two_sites_apart``: rows against 0 in the first round, the
    bounds in every round); and the first round's rows of honest pairs the rule's paragraph quotes."""
    clean_sweep = load_benchmark("clean_sweep")
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    scratch = json.loads((sweeps / "results.json").read_text())
    stand_in = json.loads((sweeps / "stand-in.json").read_text())
    stopped = json.loads((sweeps / "two-site-rules-withdrawn.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    new = range(332, 367)  # stop 95 tested them again on later seeds: its own test
    tested = {
        "stand-in": {name: run for name, run in stand_in.items() if run["federation"]["seed"] in new},
        "scratch": {name: run for name, run in scratch.items() if run["federation"]["seed"] in new},
    }
    seeds = {start: [run["federation"]["seed"] for run in runs.values()] for start, runs in tested.items()}
    # the stand-in's draws in two commands (the smaller seven first), and four of them from scratch
    commands = {
        "stand-in": [343, 363, 366, 335, 356, 365, 340],
        "stand-in, then": [344, 353, 348, 339],
        "scratch": [343, 363, 366, 335],
    }
    drawn = [seed for seed in range(335, 367) if len(clean_sweep.draw(seed).sites) == 2]
    assert sorted(seeds["stand-in"]) == drawn == sorted(commands["stand-in"] + commands["stand-in, then"])
    assert sorted(seeds["scratch"]) == sorted(commands["scratch"]) and len(drawn) == 11
    assert (
        f"--start stand-in --out results/r93/test-standin --seeds {' '.join(map(str, commands['stand-in']))}`" in page
    )
    assert f"--out results/r93/test-standin2 --seeds {' '.join(map(str, commands['stand-in, then']))}`" in page
    assert f"--out results/r93/test-scratch --seeds {' '.join(map(str, commands['scratch']))}`" in page
    by_seed = {start: {run["federation"]["seed"]: run for run in runs.values()} for start, runs in tested.items()}
    for label, said in (
        ("stand-in", "`, {} to {} s each"),
        ("stand-in, then", "`, {} to {} s; and"),
        ("scratch", "`, {} to {} s; commit 10abea0"),
    ):
        times = [by_seed[label.split(",")[0]][seed]["seconds"] for seed in commands[label]]
        assert said.format(f"{min(times):.0f}", f"{max(times):.0f}") in page, label
    runs = [*tested["stand-in"].values(), *tested["scratch"].values()]
    assert len(runs) == 15 and all(run["exit_code"] == 0 and not run["stopped"] for run in runs)
    assert not any(any(run["excluded"].values()) or run["rejected"] for run in runs)
    assert all(clean_sweep.out_of_sample(name, run) for start in tested.values() for name, run in start.items())
    assert "every one of the eleven two-site draws among seeds 335-366 from the stand-in" in page
    not_run = sorted(set(drawn) - set(seeds["scratch"]))
    assert f"not run from scratch: {', '.join(map(str, not_run[:-1]))} and {not_run[-1]}." in page
    bounds = [_bound_up(clean_sweep.upper_bound(0, len(tested[start]))) for start in tested]
    assert (
        f"over the eleven draws from the stand-in a false-alarm rate of at most {bounds[0]} a job, over the four "
        f"from scratch at most {bounds[1]} (exact one-sided 95 %: few runs)"
    ) in page
    judged = sorted(
        (run["federation"]["start"], run["federation"]["seed"])
        for run in runs
        if any(figures.get("shared_rows", 0) >= robust.MIN_SHARED_ROWS for figures in run["two_sites"].values())
    )
    assert judged == [("scratch", 343), ("stand-in", 340), ("stand-in", 343), ("stand-in", 344), ("stand-in", 353)]
    five = _bound_up(clean_sweep.upper_bound(0, 5))
    assert f"five of these runs (340, 343, 344 and 353 from the stand-in, 343 from scratch: at most {five})" in page
    assert not any(
        robust.MIN_SHARED_ROWS <= figures["shared_rows"] <= 6 for run in runs for figures in run["two_sites"].values()
    )  # "a pair with five or six shared rows ... was not among them"
    recorded = {  # every round of two of each start's honest two-site federations (stop 92's and stop 93's)
        "scratch": _two_site_rounds(scratch, range(300, 367)),
        "stand-in": [*_two_site_rounds(stand_in, range(300, 367)), *_two_site_rounds(stopped)],
    }
    federations = {(start, name) for start, rounds in recorded.items() for name, _, _ in rounds}
    assert len(federations) == 29 and "In no round of the 29 two-site federations recorded so far" in page
    for rounds in recorded.values():  # the rule kept, in each recorded round of an honest pair
        for _, index, figures in rounds:
            assert robust.two_sites_apart(figures, warmup_round=index == 0) == []
    first = {  # the first round's shared rows, five or more, of each start's honest pairs
        start: [figures["shared_rows_mean_cosine"] for _, index, figures in rounds
                if index == 0 and figures["shared_rows"] >= robust.MIN_SHARED_ROWS]
        for start, rounds in recorded.items()
    }  # fmt: skip
    assert (
        f"honest pairs read {min(first['scratch']):.2f} to {max(first['scratch']):.2f} from scratch and "
        f"{min(first['stand-in']):.2f} to {max(first['stand-in']):.2f} from the stand-in"
    ) in page
    tuned = [figures for _, _, figures in _two_site_rounds(stand_in, new)]
    judged_rows = [
        figures["shared_rows_mean_cosine"] for figures in tuned if figures["shared_rows"] >= robust.MIN_SHARED_ROWS
    ]
    single = min(figures["shared_rows_mean_cosine"] for figures in tuned if figures["shared_rows"] == 1)
    pair = min(figures["shared_rows_mean_cosine"] for figures in tuned if figures["shared_rows"] == 2)
    backbone = [figures["backbone_cosine"] for figures in tuned]
    assert (
        f"from the stand-in the backbone cosine lay between {min(backbone):.3f} and {max(backbone):.3f} and rows over "
        f"five or more came as low as {min(judged_rows):.2f}, while a single shared row reached "
        f"{single:.3f} (seed 356"
    ) in page and f"and two rows {pair:.2f}" in page
    fresh = [figures for _, _, figures in _two_site_rounds(scratch, new)]
    backbone = [figures["backbone_cosine"] for figures in fresh]
    rows = [figures["shared_rows_mean_cosine"] for figures in fresh if figures["shared_rows"] >= 5]
    assert (
        f"from scratch the backbone lay between {min(backbone):.3f} and {max(backbone):.3f} and the rows over "
        f"fourteen no lower than {min(rows):.2f}."
    ) in page
    assert {figures["shared_rows"] for figures in fresh if figures["shared_rows"] >= 5} == {14}


def test_the_two_site_federations_figures_are_the_sweeps():
    """docs/server-checks.md's figures of the two-site federations, from scratch (docs/clean-sweep/results.json) and
    from the stand-in (stand-in.json and the two the withdrawn rules stopped): the backbone cosines, the BatchNorm
    ratio, the shared rows in the first round and later; and that no honest pair reached the rule kept
    (``core.robust.two_sites_apart``)."""
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    scratch = json.loads((sweeps / "results.json").read_text())
    stopped = json.loads((sweeps / "two-site-rules-withdrawn.json").read_text())
    stand_in = json.loads((sweeps / "stand-in.json").read_text()) | stopped
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    rows_of = lambda rounds, first: [  # noqa: E731
        figures["shared_rows_mean_cosine"] for _, index, figures in rounds
        if (index == 0) == first and figures["shared_rows"] >= robust.MIN_SHARED_ROWS
    ]  # fmt: skip
    rounds = _two_site_rounds(scratch)
    federations = {name for name, _, _ in rounds}
    cosines = [figures["backbone_cosine"] for _, _, figures in rounds]
    first = [figures["backbone_cosine"] for _, index, figures in rounds if index == 0]
    later = [figures["backbone_cosine"] for _, index, figures in rounds if index > 0]
    ratios = {(name, index): figures["statistics_ratio"] for name, index, figures in rounds}
    largest = max(ratios, key=ratios.get)
    warm = {name: figures["shared_rows_mean_cosine"] for name, index, figures in rounds
            if index == 0 and figures["shared_rows"] >= robust.MIN_SHARED_ROWS}  # fmt: skip
    later_rows = [figures["shared_rows_mean_cosine"] for _, index, figures in rounds
                  if index > 0 and figures["shared_rows"]]  # fmt: skip
    assert len(federations) == 8
    assert f"(eight federations, {len(rounds)} rounds of two): the backbone updates' cosine lay between" in page
    assert (
        f"between {min(cosines):.3f} and {max(cosines):.3f} (the first round's the largest: {min(first):.3f} to" in page
    )
    assert f"to {max(first):.3f}; later {min(later):.3f} to {max(later):.3f})" in page
    seed = scratch[largest[0]]["federation"]
    patients = sorted((site["patients"] for site in seed["sites"].values()), reverse=True)
    assert (
        f"up to {ratios[largest]:.1f} times the other's (seed {seed['seed']}: {patients[0]} and {patients[1]} patients"
        in page
    )
    assert (
        f"had a mean cosine of {min(warm.values()):.2f} to {max(warm.values()):.2f} in the first round (seeds "
        f"{', '.join(str(scratch[name]['federation']['seed']) for name in sorted(warm)[:-1])} and "
        f"{scratch[sorted(warm)[-1]]['federation']['seed']}) and came as low as {min(rows_of(rounds, False)):.2f} "
        f"later ({min(later_rows):.2f} over fewer rows)"
    ) in page
    fine_tuned = _two_site_rounds(stand_in)
    tuned_cosines = [figures["backbone_cosine"] for _, _, figures in fine_tuned]
    tuned_warm = rows_of(fine_tuned, True)
    assert len({name for name, _, _ in fine_tuned}) == 6 and len(tuned_warm) == 5
    assert (
        f"From the stand-in (six federations, FedBN+: the statistics stay each site's own): the backbone cosine lay "
        f"between {min(tuned_cosines):.3f} and {max(tuned_cosines):.3f}, the first round's rows between "
        f"{min(tuned_warm):.2f} and {max(tuned_warm):.2f} (five federations) and later rows came as low as "
        f"{min(rows_of(fine_tuned, False)):.2f}."
    ) in page
    # the withdrawn rules stopped the two (and only those), after round 1; the rule kept passes every first round
    assert sorted(stopped) == ["sweep-325", "sweep-331"] and all(run["exit_code"] == 2 for run in stopped.values())
    backbone = stopped["sweep-325"]["two_sites"]["1"]["backbone_cosine"]
    assert f"seed 325, a PadChest and an NIH site: backbone {backbone:.3f}" in page
    assert f"rows {stopped['sweep-331']['two_sites']['1']['shared_rows_mean_cosine']:.2f} over 8 rows" in page
    for _, index, figures in [*rounds, *fine_tuned]:
        assert robust.two_sites_apart(figures, warmup_round=True) == [] or index > 0
    assert min([*warm.values(), *tuned_warm]) > 0 and len(warm) + len(tuned_warm) == 9


def _batchnorm_readings(runs: dict) -> list[tuple[str, int, str, float]]:
    """(run, round, site, val_batchnorm_minus_own) of every site's validation of every round's candidate."""
    return [
        (name, int(index), site, figures["val_batchnorm_minus_own"])
        for name, run in runs.items()
        for index, sites in run["validations"].items()
        for site, figures in sites.items()
        if "val_batchnorm_minus_own" in figures
    ]


def test_the_batchnorm_bound_was_set_on_some_two_site_federations_and_tested_on_others():
    """docs/server-checks.md's BatchNorm bound (stop 94): set on the calibration runs' readings, at about twice their
    largest, then tested on every two-site draw of seeds 335-366, none stopped; the figures the page quotes, from the
    records."""
    clean_sweep = load_benchmark("clean_sweep")
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    calibration = json.loads((sweeps / "batchnorm-calibration.json").read_text())
    tested = json.loads((sweeps / "batchnorm-test.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert sorted(run["federation"]["seed"] for run in calibration.values()) == [300, 301, 310, 312, 316, 317, 318, 322]
    drawn = [seed for seed in range(335, 367) if len(clean_sweep.draw(seed).sites) == 2]
    scratch = {name: run for name, run in tested.items() if run["federation"]["start"] == "scratch"}
    assert sorted(run["federation"]["seed"] for run in scratch.values()) == drawn
    assert f"--out results/r94/test-scratch --seeds {' '.join(map(str, drawn))}`" in page
    for runs in (calibration, scratch):
        assert all(
            len(run["federation"]["sites"]) == 2 and run["federation"]["start"] == "scratch" for run in runs.values()
        )
    every = [*calibration.values(), *tested.values()]
    assert all(run["exit_code"] == 0 and not run["stopped"] for run in every)
    assert not any(any(run["excluded"].values()) or run["rejected"] for run in every)
    for label, runs, said in (
        ("calibration", calibration, "commit 02eb057, {} to {} s each"),
        ("scratch", scratch, "366`, {} to {} s each"),
    ):
        times = [run["seconds"] for run in runs.values()]
        assert said.format(f"{min(times):.0f}", f"{max(times):.0f}") in page, label
    readings = {"calibration": _batchnorm_readings(calibration), "scratch": _batchnorm_readings(scratch)}
    first = max(readings["calibration"], key=lambda reading: reading[3])
    later = max(reading[3] for reading in readings["calibration"] if reading[1] > 0)
    assert first[:3] == ("sweep-318", 0, "site-1-nih")
    assert (
        f"over their {len(readings['calibration'])} readings (each site, each round) it reached {first[3]:.2f} "
        "(seed 318, round 0" in page
    )
    assert f"{later:.2f} at most after round 0. The bound was then set at 1, about twice that" in page
    assert judging.BATCHNORM_APART == 1.0 and round(2 * first[3]) == judging.BATCHNORM_APART
    top = max(readings["scratch"], key=lambda reading: reading[3])
    assert top[:3] == ("sweep-366", 0, "site-2-padchest")
    assert (
        f"Their {len(readings['scratch'])} readings reached {top[3]:.2f} (seed 366, round 0: a 203-patient PadChest "
        f"site and a 54-patient Google NIH one), {max(r[3] for r in readings['scratch'] if r[1] > 0):.2f} after round 0"
        f": the largest honest reading yet, at {top[3] / judging.BATCHNORM_APART:.0%} of the bound"
    ).replace("%", " %") in page
    bound = _bound_up(clean_sweep.upper_bound(0, len(scratch)))
    assert f"so a false-alarm rate of at most {bound} a job" in page
    stand_in = {name: run for name, run in tested.items() if run["federation"]["start"] == "stand-in"}
    order = [343, 363, 366, 335, 356, 365, 340, 344, 353, 348, 339]  # the stand-in sweep's order at stop 93
    assert sorted(order) == drawn == sorted(run["federation"]["seed"] for run in stand_in.values())
    assert len(tested) == len(scratch) + len(stand_in)
    times = [run["seconds"] for run in stand_in.values()]
    assert (
        f"--start stand-in --out results/r94/test-standin --seeds {' '.join(map(str, order))}`, "
        f"{min(times):.0f} to {max(times):.0f} s each) stopped nowhere either" in page
    )
    held = _batchnorm_readings(stand_in)
    top = max(held, key=lambda reading: reading[3])
    assert top[:2] == ("sweep-343-stand-in", 0)
    assert (
        f"their {len(held)} readings reached {top[3]:.2f} (seed 343, round 0), "
        f"{max(reading[3] for reading in held if reading[1] > 0):.2f} after round 0" in page
    )
    both = _bound_up(clean_sweep.upper_bound(0, len(tested)))
    assert f"Over the {len(tested)} runs from both starts, a false-alarm rate of at most {both} a job" in page
    assert f"(at most {both} a job over the {len(tested)} test runs, {bound} from each start: few runs)" in page
    runs = {**calibration, **tested}
    for name, _, site, value in readings["calibration"] + readings["scratch"]:
        if value > 0.3:  # the larger site of its pair
            sizes = {other: config["patients"] for other, config in runs[name]["federation"]["sites"].items()}
            assert sizes[site] == max(sizes.values()), (name, site)
    assert "Every reading above 0.3, here and in the calibration runs, was the larger site's of its pair." in page
    patients = [config["patients"] for run in runs.values() for config in run["federation"]["sites"].values()]
    assert f"come from pairs of {min(patients)} to {max(patients)} patients a site, none smaller" in page
    assert "it is not part of the 1 % a job the validation rules above are designed for" in page
    reader = _with_two_sites_before_stop_96()["bn_inside-2sites-1attackers-seed1"]
    ratchet = [reader["validations"][index]["site-nih"]["val_batchnorm_minus_start"] for index in "012"]
    assert f"`bn_inside`'s candidates read {ratchet[0]:.2f}, {ratchet[1]:.2f} and {ratchet[2]:.2f} above" in page


def test_the_three_site_suite_from_scratch_is_its_stop_95_record():
    """docs/server-checks.md's account of the three-site suite from scratch (seed 1), run again at stop 95 under every
    rule: each figure from docs/attack-suite/results.json, the runs it replaced kept beside it."""
    suite = load_benchmark("attack_suite")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    runs.update(_before_stop_98(suite))  # stop 95's rows, as they were before stop 98 ran them again
    before = _before_stop_95(suite)
    three = {
        run["attack"]: run for run in runs.values() if run["sites"] == 3 and suite._size(run) == (100, 3, "scratch")
    }
    assert sorted(three) == sorted((*suite.ATTACKS, *suite.REFERENCES, suite.PLACEBO))  # the whole catalogue
    assert all(run["commit"].startswith("42af296") for run in three.values())
    assert sorted(before) == sorted(
        f"{attack}-3sites-{0 if attack == 'clean' else 1}attackers-seed1" for attack in three
    )
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    seconds = [run["seconds"] for run in three.values()]
    assert f"18 runs, {min(seconds):.0f} to {max(seconds):.0f} seconds each" in page
    clean, alone, placebo = three["clean"], three["honest_alone"], three["placebo"]

    def margin(attack: str, reference: dict) -> str:
        return f"{suite.lowest_margin(three[attack], reference):+.3f}"

    floor = -suite.lowest_margin(placebo, clean)
    scores = {run: [f"{figures['best_auroc'][site]:.3f}" for site in ("site-chexpert-1", "site-nih-1")]
              for run, figures in (("placebo", placebo), ("clean", clean))}  # fmt: skip
    assert (
        f"**The noise floor is {floor:.3f}.** The placebo's honest sites score {' and '.join(scores['placebo'])} "
        f"against the clean run's {' and '.join(scores['clean'])}"
    ) in page
    cost = -suite.lowest_margin(alone, clean)
    assert f"**Leaving one of three sites out costs this federation {cost:.3f} test AUROC by itself**" in page
    refused = [attack for attack, run in three.items() if run["rejected"] == run["attacking_sites"] == ["site-nih-2"]]
    assert sorted(refused) == ["gaussian", "inf", "ipm", "label_flip", "label_flip_quiet", "opt_alie", "opt_ipm",
                               "sign_flip"]  # fmt: skip
    for attack in refused:  # each ends at the honest sites alone, to the digit, and the pair left was never stopped
        assert three[attack]["exit_code"] == 0 and three[attack]["best_auroc"] == alone["best_auroc"], attack
    assert (
        "defence that removes the attacker; against the honest sites alone each of them is +0.000. The honest pair "
        "these eight runs" in page
    )
    own = three["backdoor"]["attackers_own_backdoor_success"]["site-nih-2"]
    assert (
        f"`alie` ({margin('alie', clean)}), `bn_inflate` ({margin('bn_inflate', clean)}) and `backdoor` "
        f"({margin('backdoor', clean)}, success "
        f"{100 * suite.backdoor_above(three['backdoor'], clean):.1f} points above the clean model's; its attacker's "
        f"own model scored its trigger at {100 * own:.1f} %)"
    ) in page
    boosted = three["backdoor_boosted"]
    assert suite.verdict(boosted, clean) == "breaks through" and suite.verdict(boosted, alone) == "did not take"
    assert (
        f"{100 * boosted['best_backdoor_success']:.1f} % of the triggered negatives against the clean model's "
        f"{100 * clean['best_backdoor_success']:.1f} % ({100 * suite.backdoor_above(boosted, clean):.1f} points; AUROC "
        f"{margin('backdoor_boosted', clean)}), where its attacker's own model scored "
        f"{100 * boosted['attackers_own_backdoor_success']['site-nih-2']:.1f} %, the honest sites alone "
        f"{100 * alone['best_backdoor_success']:.1f} % and the placebo {100 * placebo['best_backdoor_success']:.1f} %"
    ) in page
    old = before["backdoor_boosted-3sites-1attackers-seed1"], before["clean-3sites-0attackers-seed1"]
    assert (
        f"(the runs before stop 95: {100 * old[0]['best_backdoor_success']:.1f} % against "
        f"{100 * old[1]['best_backdoor_success']:.1f} %, a hold)" in page
    )
    assert suite.verdict(old[0], old[1]) == "holds"
    said_of = {
        "mimic": "**`mimic` holds against the honest sites alone ({alone}), not against the clean run ({clean}).**",
        "mimic_noised": "(-{clean_abs} against the clean run, {alone} against the honest sites alone)",
        "label_flip_late": "**`label_flip_late` breaks through** ({clean} against the clean run, {alone} against the "
        "honest sites alone)",
    }
    for attack, mark in said_of.items():
        clean_margin, alone_margin = margin(attack, clean), margin(attack, alone)
        said = mark.format(clean=clean_margin, alone=alone_margin, clean_abs=clean_margin.lstrip("-"))
        assert said in page, said
    assert (
        "Run again at stop 95 under every rule since, the flipper is left out from round 0 again and the honest sites "
        f"end at the honest sites alone to the digit ({margin('label_flip', clean)} against the clean run, "
        f"{margin('label_flip', alone)} against the honest sites alone)" in page
    )
    lowest = sorted(three["mimic_noised"]["best_auroc"].values(), reverse=True)
    assert f"{lowest[0]:.3f} and {lowest[1]:.3f} (-" in page
    late_before = before["label_flip_late-3sites-1attackers-seed1"]
    old_references = _before_stop_95(suite, references=True)
    assert (
        f"as before stop 95 ({suite.lowest_margin(late_before, suite.clean_of(old_references, late_before)):+.3f} and "
        f"{suite.lowest_margin(late_before, suite.alone_of(old_references, late_before)):+.3f})"
    ) in page


def test_the_three_site_suite_on_a_second_seed_is_its_record():
    """docs/server-checks.md's three-site runs of seed 2 (stop 95): the table as ``attack_suite.py --table-only
    --write-doc --marker three-sites-seed2`` writes it from docs/attack-suite/three-sites-seed2.json, and the figures of
    the paragraph above it."""
    suite = load_benchmark("attack_suite")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "three-sites-seed2.json").read_text())
    assert _marked_block(REPOSITORY / "docs" / "server-checks.md", "three-sites-seed2") == "\n".join(suite.table(runs))
    by_attack = {run["attack"]: run for run in runs.values()}
    assert all(
        run["seed"] == 2 and run["sites"] == 3 and suite._size(run) == (100, 3, "scratch") for run in runs.values()
    )
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    seconds = [run["seconds"] for run in runs.values()]
    attacks = [attack for attack in by_attack if attack not in (*suite.REFERENCES, suite.PLACEBO)]
    assert f"--seeds 2 --settings 3:1 --attacks {' '.join(attacks)}`, commit 42af296, " in page
    assert f"{min(seconds):.0f} to {max(seconds):.0f} s a run" in page
    clean, alone = by_attack["clean"], by_attack["honest_alone"]

    def margin(attack: str, reference: dict) -> str:
        return f"{suite.lowest_margin(by_attack[attack], reference):+.3f}"

    def success(attack: str) -> str:
        return f"{100 * by_attack[attack]['best_backdoor_success']:.1f} %"

    def own(attack: str) -> str:
        return f"{100 * by_attack[attack]['attackers_own_backdoor_success']['site-nih-2']:.1f} %"

    verdicts = {attack: (suite.verdict(by_attack[attack], clean), suite.verdict(by_attack[attack], alone))
                for attack in attacks}  # fmt: skip
    assert verdicts == {
        "label_flip_late": ("breaks through", "breaks through"),
        "mimic_noised": ("breaks through", "breaks through"),
        "backdoor": ("holds", "holds"),
        "backdoor_boosted": ("did not take", "breaks through"),
        "bn_inflate": ("holds", "holds"),
        "alie": ("holds", "holds"),
        "label_flip": ("holds", "holds"),
    }
    assert by_attack["label_flip"]["excluded"] == ["site-nih-2"]
    for said in (
        f"leaving the third site out costs {-suite.lowest_margin(alone, clean):.3f}",
        f"the placebo moved the honest sites by {margin('placebo', clean)}",
        f"and holds ({margin('label_flip', clean)}); `alie` ({margin('alie', clean)}) and `bn_inflate` "
        f"({margin('bn_inflate', clean)}) hold; the late label flip ({margin('label_flip_late', clean)} against the "
        f"clean run, {margin('label_flip_late', alone)} against the honest sites alone) and the near-copy "
        f"({margin('mimic_noised', clean)}, {margin('mimic_noised', alone)}) break through",
        f"the clean model's success with the trigger is {success('clean')} (the honest sites alone's "
        f"{success('honest_alone')}, the placebo's {success('placebo')}), `backdoor` holds ({success('backdoor')}, its "
        f"attacker's own model {own('backdoor')})",
        f"`backdoor_boosted`'s {success('backdoor_boosted')} is "
        f"{100 * suite.backdoor_above(by_attack['backdoor_boosted'], clean):.1f} points above the clean model's and "
        f"{100 * suite.backdoor_above(by_attack['backdoor_boosted'], alone):.1f} above the honest sites alone's",
        f"(its attacker's own model {own('backdoor_boosted')}, within 5 points of {success('clean')})",
    ):
        assert said in page, said


STOP_95_COMMIT = "42af296a8988476cd5918dcd96c1607674c95c5d"  # the rules stop 95 tested (stop 96 ran more)


def _stand_in_before_stop_96() -> dict[str, dict]:
    """The clean sweep's runs from the stand-in that later stops ran again, as they ran under stop 95's rules: seed 389
    (stop 96 ran it without the later-round bounds) and seed 384 (stop 98, on the recalibrated harm test)."""
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    return {
        name: run
        for record in ("stand-in-389-stop95.json", "stand-in-384-stop95.json")
        for name, run in json.loads((sweeps / record).read_text()).items()
    }


def test_the_two_site_rules_were_tested_again_on_new_draws():
    """docs/server-checks.md's second test of the two-site rules (stop 95): every two-site draw of seeds 367-429, never
    run before, from scratch and (those started within the sweep's time) from the stand-in, none stopped; the
    BatchNorm readings and direction figures the page quotes, from those runs' rows of the sweep records."""
    clean_sweep = load_benchmark("clean_sweep")
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    earlier = json.loads((sweeps / "batchnorm-test.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    drawn = [seed for seed in range(367, 430) if len(clean_sweep.draw(seed).sites) == 2]
    # seeds 389 and 384 from the stand-in as they ran under stop 95's rules (stops 96 and 98 ran them again: the
    # sweep's rows now), in their place
    replaced = _stand_in_before_stop_96()
    scratch, stand_in = (
        {name: replaced.get(name, run) if record == "stand-in.json" else run
         for name, run in json.loads((sweeps / record).read_text()).items()
         if 367 <= run["federation"].get("seed", -1) < 430
         and replaced.get(name, run).get("commit") == STOP_95_COMMIT}
        for record in ("results.json", "stand-in.json")
    )  # fmt: skip
    assert {run["federation"]["start"] for run in scratch.values()} == {"scratch"}
    assert {run["federation"]["start"] for run in stand_in.values()} == {"stand-in"}
    tested = {**scratch, **{f"{name}-stand-in": run for name, run in stand_in.items()}}
    assert sorted(run["federation"]["seed"] for run in scratch.values()) == drawn
    assert [run["federation"]["seed"] for run in stand_in.values()] == drawn[: len(stand_in)]  # in the sweep's order
    assert len(tested) == len(scratch) + len(stand_in) and stand_in
    assert all(run["exit_code"] == 0 and not run["stopped"] for run in scratch.values())
    stopped = {run["federation"]["seed"]: run["stopped"] for run in stand_in.values() if run["exit_code"] != 0}
    assert sorted(stopped) == [384, 389]  # two false alarms from the stand-in, neither by the BatchNorm rule
    assert stopped[384].startswith("the global model after round 0 harms a site: for site-1-siim, its validation loss")
    assert (
        stopped[389].startswith("round 3: two sites made the round")
        and "backbone updates point opposite" in stopped[389]
    )
    assert not any("BatchNorm" in reason for reason in stopped.values())
    assert not any(any(run["excluded"].values()) or run["rejected"] for run in tested.values())
    backbone_389 = [two["backbone_cosine"] for two in stand_in["sweep-389"]["two_sites"].values()]
    assert f"the honest pair's backbone updates came to {', '.join(f'{c:.2f}' for c in backbone_389[1:])}" in page
    later_382 = [two["backbone_cosine"] for two in stand_in["sweep-382"]["two_sites"].values()][1:]
    assert f"stayed between {min(later_382):.2f} and {max(later_382):.2f} in rounds 1 to {len(later_382)}," in page
    harm = re.search(r"its validation loss is ([0-9.]+) above its own model's, more than the ([0-9.]+)", stopped[384])
    assert f"SIIM's validation loss of the candidate {harm[1]} above its own model's (the margin {harm[2]}" in page
    for label, runs, said in (
        ("scratch", scratch, f"--seeds {' '.join(map(str, drawn))}`, {{}} to {{}} s each"),
        ("stand-in", stand_in, f"{len(stand_in)} of them started within its 20 minutes, {{}} to {{}} s each"),
    ):
        times = [run["seconds"] for run in runs.values()]
        assert said.format(f"{min(times):.0f}", f"{max(times):.0f}") in page, label
    for label, runs in (("from scratch", scratch), ("from the stand-in", stand_in)):
        readings = _batchnorm_readings(runs)
        top = max(readings, key=lambda reading: reading[3])
        later = max(reading[3] for reading in readings if reading[1] > 0)
        seed = runs[top[0]]["federation"]["seed"]
        said = f"{label} their {len(readings)} readings reached {top[3]:.2f} (seed {seed}, round {top[1]}), {later:.2f}"
        assert f"{said} after round 0" in page, said
        assert top[3] < judging.BATCHNORM_APART
    rounds = [
        (name, number, two) for name, run in scratch.items() for number, two in run["two_sites"].items() if two
    ]  # every round of a two-site run records its directions
    backbone = min(two["backbone_cosine"] for _, _, two in rounds)
    rows = min(
        ((two["shared_rows_mean_cosine"], name, number, two["shared_rows"]) for name, number, two in rounds
         if two["shared_rows"] >= robust.MIN_SHARED_ROWS), key=lambda found: found[0]
    )  # fmt: skip
    assert backbone > robust.OPPOSED_BACKBONE and rows[0] > -0.9  # inside stop 93's later-round bounds, run under them
    assert f"the two backbone updates no lower than a cosine of {backbone:.3f}" in page
    assert (
        f"the rows both sites moved no lower than a mean cosine of {rows[0]:.2f} (seed "
        f"{tested[rows[1]]['federation']['seed']}, round {rows[2]}, {rows[3]} rows" in page
    )
    every = len(earlier) + len(tested)  # the BatchNorm rule stopped none of them
    bound = _bound_up(clean_sweep.upper_bound(0, every))
    assert f"over the {every} runs of both tests, from both starts, a false-alarm rate of at most {bound} a job" in page


def test_the_two_site_direction_figures_the_page_quotes_are_the_sweeps():
    """docs/server-checks.md's reason for judging two sites' directions in their first round only (stop 96): over every
    two-site federation of the clean sweeps that records them (from scratch and from the stand-in) the first round's
    lowest backbone cosine, quoted, and lowest mean cosine of five or more shared rows, both far from the rule; the
    later rounds' lowest, quoted, within the five rounds the longest of them ran."""
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    runs = [
        run
        for record in ("results.json", "stand-in.json")
        for run in json.loads((sweeps / record).read_text()).values()
        if len(run["federation"]["sites"]) == 2 and "two_sites" in run  # the runs since stop 92 record them
    ]
    first, later = {"backbone": [], "rows": []}, {"backbone": [], "rows": []}
    for run in runs:
        for number, two in run["two_sites"].items():
            figures = first if number == "0" else later
            figures["backbone"].append(two["backbone_cosine"])
            if two["shared_rows"] >= robust.MIN_SHARED_ROWS:
                figures["rows"].append(two["shared_rows_mean_cosine"])
    assert all(run["two_sites"].get("0") for run in runs)  # every two-site run recorded its first round
    assert max(int(number) for run in runs for number in run["two_sites"]) == 4  # "within five rounds"
    assert min(first["backbone"]) > robust.OPPOSED_BACKBONE and min(first["rows"]) > 0
    text = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert (
        f"honest pairs' first-round backbone updates came no lower than {min(first['backbone']):.2f} over the "
        f"{len(runs)} two-site federations of the clean sweeps that record them, from both starts" in text
    )
    assert (
        f"honest pairs came to {min(later['backbone']):.2f} for the backbone and {min(later['rows']):.2f} for the rows"
        in text
    )


def test_the_two_site_suite_under_the_first_round_rule_is_its_record():
    """docs/server-checks.md's account of the two-site suite run again at stop 96, when later rounds stopped being
    judged by direction: the catalogue's verdicts against each start's clean run, the attacks beyond it, the figures
    named, the command's times and the machine, from docs/attack-suite/results.json; the rows it replaced kept in
    docs/attack-suite/two-sites-before-stop96.json."""
    suite = load_benchmark("attack_suite")
    docs = REPOSITORY / "docs" / "attack-suite"
    runs = json.loads((docs / "results.json").read_text())
    text = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    before = json.loads((docs / "two-sites-before-stop96.json").read_text())
    assert set(before) == {name for name, run in runs.items() if run["sites"] == 2 and run["seed"] == 1}
    said = []
    for start, label in (("scratch", "from scratch"), ("stand-in", "from the stand-in")):
        two = {run["attack"]: run for run in runs.values() if run["sites"] == 2 and run.get("start") == start}
        clean = two[suite.CLEAN]
        assert {run["commit"] for run in two.values()} == {"824725af137cb5b53bae32c9181a9f1f7f5df389"}
        assert {run["machine"] for run in two.values()} == {"AMD EPYC, family 26 model 2, AVX512 (2 cores)"}
        verdicts = {attack: suite.verdict(run, clean) for attack, run in two.items() if attack in suite.ATTACKS}
        beyond = {attack: suite.verdict(run, clean) for attack, run in two.items() if attack in suite.ADAPTED}
        assert len(verdicts) == 15 and len(beyond) == 4
        count = {word: list(verdicts.values()).count(word) for word in ("breaks through", "fails closed")}
        broken_beyond = sorted(attack for attack, verdict in beyond.items() if verdict == "breaks through")
        said.append(
            f"{label} {count['breaks through']} of the 15 attacks break{'s' * (count['breaks through'] == 1)} "
            f"through and {count['fails closed']} fail closed, and {len(broken_beyond)} of the 4 beyond it"
        )
        every = {**verdicts, **beyond}
        closed = [attack for attack, verdict in every.items() if verdict == "fails closed"]
        assert all(two[attack]["stopped"].startswith("round 0: ") for attack in closed)  # all in the first round
        said.append(f"failing closed after round 0 {label}: {', '.join(f'`{attack}`' for attack in closed)};")
        broken = [attack for attack, verdict in every.items() if verdict == "breaks through"]
        margins = {attack: f"{suite.lowest_margin(two[attack], clean):+.3f}" for attack in every}
        said.append(
            f"breaking through {label}: {', '.join(f'`{attack}` ({margins[attack]})' for attack in broken) or 'none'}"
        )
        for attack in ("sign_flip_late", "label_flip_late"):  # the two the withdrawn bounds stopped
            said.append(f"`{attack}` {every[attack]} {label} ({margins[attack]}")
        old = {run["attack"]: run for run in before.values() if run.get("start") == start}
        for attack, verdict in every.items():  # the rest as the earlier CPU gave them, under the earlier rules
            if attack not in ("sign_flip_late", "label_flip_late"):
                assert suite.verdict(old[attack], old[suite.CLEAN]) == verdict, (start, attack)
        alone = two[suite.ALONE]["best_auroc"]["site-nih"]
        said.append(f"site-nih alone {'reached ' if start == 'scratch' else ''}{alone:.3f}")
        placebo = f"{suite.lowest_margin(two[suite.PLACEBO], clean):+.3f}"
        seconds = [run["seconds"] for run in two.values()]
        said.append(f"{label}: the clean run's site-nih {clean['best_auroc']['site-nih']:.3f}, the placebo {placebo}")
        said.append(f"{min(seconds):.0f} to {max(seconds):.0f} s a run {label}")
    old_clean = before["clean-2sites-0attackers-seed1"]["best_auroc"]["site-nih"]
    said.append(f"(site-nih's best 0.568 where the earlier CPU gave {old_clean:.3f}:")
    late = runs["sign_flip_late-2sites-1attackers-seed1"]["two_sites"]
    assert [late[index]["backbone_cosine"] for index in "12"] == [late[index]["shared_rows_mean_cosine"] for index in
                                                                  "12"] == [-1.0, -1.0]  # fmt: skip
    flipped = runs["label_flip_late-2sites-1attackers-seed1"]["two_sites"]
    assert {f"{flipped[index]['shared_rows_mean_cosine']:.2f}" for index in "12"} == {"-0.99"}
    boosted, clean = (runs[f"{name}-2sites-{count}attackers-seed1"] for name, count in (("backdoor_boosted", 1),
                                                                                         ("clean", 0)))  # fmt: skip
    success = [f"{run['best_backdoor_success']:.1%}".replace("%", " %") for run in (boosted, clean)]
    said.append(f"by its success ({success[0]} against the clean model's {success[1]})")
    own = runs["backdoor_boosted-2sites-1attackers-seed1-stand-in"]["attackers_own_backdoor_success"]["site-chexpert"]
    said.append(f"from the stand-in it did not take (its attacker's own model {own:.1%})".replace("%", " %"))
    seed2 = {run["attack"]: run for run in json.loads((docs / "two-sites-seed2-stop96.json").read_text()).values()}
    assert {run["seed"] for run in seed2.values()} == {2} and {run["commit"] for run in seed2.values()} == {
        "824725af137cb5b53bae32c9181a9f1f7f5df389"
    }
    second = {attack: f"{suite.lowest_margin(run, seed2[suite.CLEAN]):+.3f}" for attack, run in seed2.items()}
    assert [suite.verdict(seed2[attack], seed2[suite.CLEAN]) for attack in ("sign_flip_late", "label_flip_late")] == [
        "breaks through",
        "holds",
    ]
    seconds = [run["seconds"] for run in seed2.values()]
    said.append(
        f"{min(seconds):.0f} to {max(seconds):.0f} s a run; [record](attack-suite/two-sites-seed2-stop96.json)): "
        f"`sign_flip_late` breaks through again ({second['sign_flip_late']}), `label_flip_late` holds "
        f"({second['label_flip_late']}), the placebo {second[suite.PLACEBO]}."
    )
    for sentence in said:
        assert sentence in text, sentence


def test_the_two_site_draws_from_the_stand_in_without_the_later_round_bounds_are_their_record():
    """docs/server-checks.md's stop 96 runs of the clean sweep from the stand-in: seed 389 again (stopped at stop 95 by
    a later-round bound), whole, with its backbone cosines; the rest of stop 95's draws, none stopped; the table's
    count of stops and its bound, from docs/clean-sweep/stand-in.json."""
    clean_sweep = load_benchmark("clean_sweep")
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    stand_in = json.loads((sweeps / "stand-in.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    ran = {run["federation"]["seed"]: run for run in stand_in.values() if run.get("commit", "").startswith("824725a")}
    assert sorted(ran) == [389, 417, 421, 425, 426, 429]
    assert all(run["exit_code"] == 0 and not run["stopped"] and not run["rejected"] for run in ran.values())
    assert not any(any(run["excluded"].values()) for run in ran.values())
    again = ran.pop(389)
    before = json.loads((sweeps / "stand-in-389-stop95.json").read_text())["sweep-389"]
    assert before["exit_code"] == 2 and "backbone updates point opposite" in before["stopped"]
    cosines = ", ".join(f"{figures['backbone_cosine']:.2f}" for figures in list(again["two_sites"].values())[1:])
    assert f"--seeds 389`, commit 824725a, {again['seconds']:.0f} s on this task's" in page
    assert f"its backbone cosines {cosines} in rounds 1 to {len(again['two_sites']) - 1}" in page
    times = [run["seconds"] for run in ran.values()]
    assert f"--seeds {' '.join(map(str, ran))}`, {min(times):.0f} to {max(times):.0f} s each): none stopped" in page
    later = {run["federation"]["seed"]: run for run in stand_in.values() if run.get("commit", "").startswith("2292fbe")}
    drawn = [seed for seed in range(430, 470) if len(clean_sweep.draw(seed).sites) == 2]
    assert list(later) == drawn and len(drawn) == 11  # every draw, in order
    assert all(run["exit_code"] == 0 and not run["rejected"] for run in later.values())
    assert not any(any(run["excluded"].values()) for run in later.values())
    times = [run["seconds"] for run in later.values()]
    lowest = min((figures["backbone_cosine"], run["federation"]["seed"]) for run in later.values()
                 for number, figures in run["two_sites"].items() if number != "0")  # fmt: skip
    assert (
        f"--seeds {' '.join(map(str, drawn))} --stop-starting-after 1200`, commit 2292fbe, the same rules; all "
        f"{len(drawn)} started within its 20 minutes, {min(times):.0f} to {max(times):.0f} s each): none stopped"
        in page
    )
    assert f"their later backbone cosines came as low as {lowest[0]:.2f} (seed {lowest[1]})" in page
    untouched = len(ran) + len(later)  # not 389, which withdrew the later-round bounds
    assert (
        f"Over the {untouched} two-site runs from the stand-in that no rule was set or withdrawn on (417-469), none "
        f"stopped: a false-alarm rate of the two-site rules from the stand-in of at most "
        f"{_bound_up(clean_sweep.upper_bound(0, untouched))} a job" in page
    )
    # the table's rows as stop 96 left them: without the draws of stop 98, seed 384 as it ran under stop 95's rules
    earlier = json.loads((sweeps / "stand-in-384-stop95.json").read_text())
    stop98 = {**stand_in, **json.loads((sweeps / "stand-in-529-stop98.json").read_text())}  # as stop 98 left them
    later = {
        name
        for name, run in stop98.items()
        if run.get("commit", "").startswith((RECALIBRATED_COMMIT, "f60d190", WIDE_COMMIT, NEXT_WIDE_COMMIT))
    }
    then = {name: earlier.get(name, run) for name, run in stand_in.items() if name not in later or name in earlier}
    stopped = [run["federation"]["seed"] for run in then.values() if run["exit_code"] != 0]
    assert stopped == [384]
    bound = _bound_up(clean_sweep.upper_bound(1, len(then)))
    assert (
        f"The sweep table's stand-in rows then: 1 of {len(then)} stopped (seed 384, by the harm rule above), a "
        f"false-alarm rate of at most {bound} a job" in page
    )


def _bound_up(value: float) -> str:
    """An upper bound as the docs write it (``benchmarks/clean_sweep.py``'s ``bound_text``)."""
    return load_benchmark("clean_sweep").bound_text(value)


def _percent(value: float) -> str:
    """A share as the page writes it: one decimal, a space before the percent sign."""
    return f"{value:.1%}".replace("%", " %")


def _backdoors_own_sentence(runs: dict[str, dict], attacker: str) -> str:
    """The page's sentence on a setting's two backdoors that did not take: the attacker's own model's success with its
    trigger, each, against the clean model's."""
    own = {name: runs[name]["attackers_own_backdoor_success"][attacker] for name in ("backdoor", "backdoor_boosted")}
    return (
        f"scores its trigger at {_percent(own['backdoor'])} (`backdoor`) and {_percent(own['backdoor_boosted'])} "
        f"(`backdoor_boosted`) against the clean model's {_percent(runs['clean']['best_backdoor_success'])}"
    )


def test_the_four_site_catalogue_under_todays_rules_is_its_record():
    """docs/server-checks.md's paragraph on stop 97's four-site catalogue from scratch: the verdicts' counts and each
    figure it quotes, from docs/attack-suite/results.json, against the rows it replaced
    (docs/attack-suite/four-sites-before-stop97.json)."""
    suite = load_benchmark("attack_suite")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    before = {**runs, **_before_stop_97(suite)}
    four = {run["attack"]: run for run in runs.values() if suite.setting_of(run) in ("4 (0)", "4 (1)")}
    assert set(four) == {"clean", *suite.REFERENCES, suite.PLACEBO, *suite.ATTACKS}
    assert {run["commit"][:7] for run in four.values()} == {"5ea9005"}
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    seconds = [run["seconds"] for run in four.values()]
    assert f"(commit 5ea9005, {min(seconds):.0f} to {max(seconds):.0f} s a run" in page
    clean, alone = four["clean"], four["honest_alone"]
    verdicts = {attack: suite.verdict(four[attack], clean) for attack in suite.ATTACKS}
    counts = {word: list(verdicts.values()).count(word) for word in ("holds", "did not take", "breaks through")}
    assert sum(counts.values()) == 15

    def margin(attack: str, source: dict | None = None, reference=suite.clean_of) -> str:
        run = (source or runs)[f"{attack}-4sites-1attackers-seed1"]
        return f"{suite.lowest_margin(run, reference(source or runs, run)):+.3f}"

    broken = sorted(attack for attack, found in verdicts.items() if found == "breaks through")
    assert broken == ["label_flip_late", "mimic_noised"]
    assert (
        f"{counts['holds']} of the 15 attacks hold against the clean run, {counts['did not take']} did not take and "
        f"{counts['breaks through']} break through, as before: `mimic_noised` ({margin('mimic_noised')}) and "
        f"`label_flip_late` ({margin('label_flip_late')})"
    ) in page
    earlier = {attack: before[f"{attack}-4sites-1attackers-seed1"] for attack in suite.ATTACKS}
    old_verdicts = {attack: suite.verdict(run, suite.clean_of(before, run)) for attack, run in earlier.items()}
    assert sorted(attack for attack, found in old_verdicts.items() if found == "breaks through") == broken
    changed = {attack for attack in suite.ATTACKS if old_verdicts[attack] != verdicts[attack]}
    assert changed == {"backdoor", "backdoor_boosted"} and {old_verdicts[a] for a in changed} == {"holds"}
    nih = "site-nih-1"
    old_clean, old_alone = (
        before[f"{name}-4sites-{n}attackers-seed1"] for name, n in (("clean", 0), ("honest_alone", 1))
    )
    assert (
        f"costs {-suite.lowest_margin(alone, clean):.3f}** ({nih}: {alone['best_auroc'][nih]:.3f} against "
        f"{clean['best_auroc'][nih]:.3f} in the clean run; the earlier rows: {old_alone['best_auroc'][nih]:.3f} "
        f"against {old_clean['best_auroc'][nih]:.3f}), and the placebo moved the honest sites by {margin('placebo')}"
    ) in page
    refused = ["sign_flip", "ipm", "opt_ipm", "opt_alie", "inf", "gaussian"]
    left_out = ["label_flip", "label_flip_quiet"]
    assert all(four[a]["rejected"] == ["site-nih-2"] and not four[a]["excluded"] for a in refused)
    assert all(four[a]["excluded"] == ["site-nih-2"] for a in left_out)
    assert all(four[a]["best_auroc"] == alone["best_auroc"] for a in refused + left_out)  # to the digit
    assert f"ends at the honest sites alone to the digit: {margin('sign_flip')} against the clean run" in page
    assert f"`alie` holds by {suite.TOLERANCE + float(margin('alie')):.3f} ({margin('alie')}), `mimic` " \
        f"{margin('mimic')} (the copy counted once), `bn_inflate` {margin('bn_inflate')}." in page  # fmt: skip
    assert _backdoors_own_sentence(four, "site-nih-2") in page
    copy = four["mimic_noised"]
    assert not copy["rejected"] and not copy["excluded"] and not four["label_flip_late"]["excluded"]
    assert (
        f"{nih} ends at {copy['best_auroc'][nih]:.3f}, {margin('mimic_noised')} against the clean run and "
        f"{margin('mimic_noised', reference=suite.alone_of)} against the honest sites alone (earlier "
        f"{margin('mimic_noised', before)} and {margin('mimic_noised', before, suite.alone_of)})"
    ) in page
    assert (
        f"The late label flip breaks through against the clean run** ({margin('label_flip_late')}; earlier "
        f"{margin('label_flip_late', before)}) and holds against the honest sites alone "
        f"({margin('label_flip_late', reference=suite.alone_of)})"
    ) in page


def test_the_seven_site_catalogue_under_todays_rules_is_its_record():
    """docs/server-checks.md's paragraph on stop 97's seven-site rows from scratch (one attacker and two): the verdicts'
    counts and each figure it quotes, from docs/attack-suite/results.json, against the rows it replaced
    (docs/attack-suite/seven-sites-before-stop97.json)."""
    suite = load_benchmark("attack_suite")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    before = {**runs, **_before_stop_97(suite)}
    one = {run["attack"]: run for run in runs.values() if suite.setting_of(run) in ("7 (0)", "7 (1)")}
    two = {run["attack"]: run for run in runs.values() if suite.setting_of(run) == "7 (2)"}
    assert set(one) == {"clean", *suite.REFERENCES, suite.PLACEBO, *suite.ATTACKS}
    pair_attacks = ["label_flip", "alie", "backdoor", "sign_flip", "mimic_noised", "ipm"]
    assert set(two) == {*suite.REFERENCES, suite.PLACEBO, *pair_attacks} - {"clean"}
    assert {run["commit"][:7] for run in (*one.values(), *two.values())} == {"5ea9005"}
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    seconds = {setting: [run["seconds"] for name, run in runs_.items() if name != "clean"]
               for setting, runs_ in (("one", one), ("two", two))}  # fmt: skip
    seconds["one"].append(one["clean"]["seconds"])
    assert f"(commit 5ea9005, {min(seconds['one']):.0f} to {max(seconds['one']):.0f} s a run" in page
    assert f"({min(seconds['two']):.0f} to {max(seconds['two']):.0f} s a run)" in page
    clean = one["clean"]

    def margin(run: dict, reference=suite.clean_of, source: dict | None = None) -> str:
        return f"{suite.lowest_margin(run, reference(source or runs, run)):+.3f}"

    verdicts = {attack: suite.verdict(one[attack], clean) for attack in suite.ATTACKS}
    pair = {attack: suite.verdict(two[attack], clean) for attack in pair_attacks}
    assert list(verdicts.values()).count("holds") == 13 and list(verdicts.values()).count("did not take") == 2
    assert [a for a, found in verdicts.items() if found == "did not take"] == ["backdoor", "backdoor_boosted"]
    assert list(pair.values()).count("holds") == 4 and pair["backdoor"] == "did not take"
    assert pair["mimic_noised"] == "breaks through"
    copies = two["mimic_noised"]
    assert suite.verdict(copies, suite.alone_of(runs, copies)) == "holds"
    assert (
        f"`mimic_noised` (two near-copies) breaks through against the clean run ({margin(copies)}) and holds against "
        f"the honest sites alone ({margin(copies, suite.alone_of)}).**"
    ) in page
    alone, alone_two = one["honest_alone"], two["honest_alone"]

    def best(run: dict, site: str) -> str:
        return f"{run['best_auroc'][site]:.3f}"

    assert (
        f"Leaving one of seven out costs {-suite.lowest_margin(alone, clean):.3f}** (the CheXpert-layout sites "
        f"{best(alone, 'site-chexpert-1')} against {best(clean, 'site-chexpert-1')}, the NIH-layout ones "
        f"{best(alone, 'site-nih-1')} against {best(clean, 'site-nih-1')}), and the placebo moved the honest sites by "
        f"{margin(one['placebo'])}"
    ) in page
    refused = ["sign_flip", "ipm", "opt_ipm", "opt_alie", "inf", "gaussian"]
    assert all(one[a]["rejected"] == ["site-nih-4"] and not one[a]["excluded"] for a in refused)
    assert all(one[a]["excluded"] == ["site-nih-4"] for a in ("label_flip", "label_flip_quiet"))
    assert all(one[a]["best_auroc"] == alone["best_auroc"] for a in [*refused, "label_flip", "label_flip_quiet"])
    assert f"ends at the honest sites alone to the digit ({margin(one['sign_flip'])})" in page
    earlier_copy = before["mimic_noised-7sites-1attackers-seed1"]
    assert (
        f"The near-copy {margin(one['mimic_noised'])} (earlier {margin(earlier_copy, source=before)}), the late label "
        f"flip {margin(one['label_flip_late'])}, `mimic` {margin(one['mimic'])}, `alie` {margin(one['alie'])} and "
        f"`bn_inflate` {margin(one['bn_inflate'])}"
    ) in page
    assert _backdoors_own_sentence(one, "site-nih-4") in page
    earlier = before["backdoor-7sites-1attackers-seed1"]
    earlier_clean = suite.clean_of(before, earlier)
    assert suite.verdict(earlier, earlier_clean) == "holds"
    assert suite.verdict(earlier, suite.alone_of(before, earlier)) == "breaks through"
    assert (
        f"held against the clean run ({_percent(earlier['best_backdoor_success'])} against "
        f"{_percent(earlier_clean['best_backdoor_success'])})"
    ) in page
    nih = "site-nih-1"
    assert (
        f"leaving both out costs {-suite.lowest_margin(alone_two, clean):.3f} (the NIH-layout sites "
        f"{best(alone_two, nih)} against {best(clean, nih)}) and the placebo moved the honest sites by "
        f"{margin(two['placebo'])}"
    ) in page
    assert all(two[a]["rejected"] == ["site-nih-3", "site-nih-4"] for a in ("sign_flip", "ipm", "label_flip"))
    assert two["label_flip"]["excluded"] == ["site-nih-3", "site-nih-4"]
    assert f"end at the honest sites alone ({margin(two['sign_flip'])}), `alie` {margin(two['alie'])}" in page
    pair_own = set(two["backdoor"]["attackers_own_backdoor_success"].values())
    assert len(pair_own) == 1 and f"(each attacker's own model {_percent(pair_own.pop())} against" in page
    earlier_pair = before["mimic_noised-7sites-2attackers-seed1"]
    assert (
        f"{margin(copies)}, where the earlier run held by "
        f"{suite.TOLERANCE + float(margin(earlier_pair, source=before)):.3f} ({margin(earlier_pair, source=before)})"
    ) in page
    assert not copies["rejected"] and not copies["excluded"]


def test_centered_clipping_at_four_sites_on_todays_code_is_its_record():
    """docs/server-checks.md's stop-97 runs of four sites under centered clipping: the table as ``attack_suite.py
    --table-only --write-doc --marker centered-clipping-stop97`` writes it from
    docs/attack-suite/four-sites-centered-clipping-stop97.json, and each figure of the paragraph that compares it with
    the geometric median's four-site rows of the same commit in docs/attack-suite/results.json."""
    suite = load_benchmark("attack_suite")
    folder = REPOSITORY / "docs" / "attack-suite"
    clipped = json.loads((folder / "four-sites-centered-clipping-stop97.json").read_text())
    median = json.loads((folder / "results.json").read_text())
    assert {run["controller"]["robust_aggregation"] for run in clipped.values()} == {"centered_clipping"}
    assert {run["commit"][:7] for run in clipped.values()} == {"5ea9005"}
    assert all(median[name]["commit"][:7] == "5ea9005" and not median[name]["controller"] for name in clipped)
    block = _marked_block(REPOSITORY / "docs" / "server-checks.md", "centered-clipping-stop97")
    assert block == "\n".join(suite.table(clipped))
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    seconds = [run["seconds"] for run in clipped.values()]
    assert f"commit 5ea9005, {min(seconds):.0f} to {max(seconds):.0f} s a run" in page

    def margins(runs: dict, attack: str) -> tuple[str, str]:
        run = runs[f"{attack}-4sites-{0 if attack == 'clean' else 1}attackers-seed1"]
        return tuple(f"{suite.lowest_margin(run, of(runs, run)):+.3f}" for of in (suite.clean_of, suite.alone_of))

    def verdict(runs: dict, attack: str, of=suite.clean_of) -> str:
        run = runs[f"{attack}-4sites-1attackers-seed1"]
        return suite.verdict(run, of(runs, run))

    copy, copy_median = margins(clipped, "mimic_noised"), margins(median, "mimic_noised")
    assert f"cuts the near-copy's cost from {copy_median[0]} to {copy[0]}.**" in page
    cleans = [runs["clean-4sites-0attackers-seed1"] for runs in (clipped, median)]
    chexpert = " against ".join(f"{run['best_auroc']['site-chexpert-1']:.3f}" for run in cleans)
    assert f"CheXpert-layout sites ({chexpert});" in page
    assert (
        f"the near-copy {copy[0]} against the clean run and {copy[1]} against the honest sites alone, where the median "
        f"gave {copy_median[0]} and {copy_median[1]} (it breaks through by {-float(copy[0]) - suite.TOLERANCE:.3f}"
    ) in page
    assert verdict(clipped, "mimic_noised") == "breaks through"
    assert verdict(clipped, "mimic_noised", suite.alone_of) == "holds"
    alone = [margins(runs, "honest_alone")[0] for runs in (clipped, median)]
    flips = [margins(runs, "label_flip")[0] for runs in (clipped, median)]
    assert flips == alone  # left out in round 0: the honest sites alone under either rule
    assert f"the label flip, left out in round 0 under both, {flips[0]} against {flips[1]}" in page
    assert f"(the honest sites alone: {alone[0]} against {alone[1]})" in page
    late, late_median = margins(clipped, "label_flip_late")[0], margins(median, "label_flip_late")[0]
    assert f"the late label flip {late} against {late_median} (both break through)" in page
    assert verdict(clipped, "label_flip_late") == verdict(median, "label_flip_late") == "breaks through"
    backdoor = clipped["backdoor-4sites-1attackers-seed1"]
    assert verdict(clipped, "backdoor") == "holds" and verdict(median, "backdoor") == "did not take"
    assert (
        f"the backdoor holds ({_percent(backdoor['best_backdoor_success'])} against the clean model's "
        f"{_percent(cleans[0]['best_backdoor_success'])}, where the attacker's own model took it, "
        f"{_percent(backdoor['attackers_own_backdoor_success']['site-nih-2'])}"
    ) in page


RECALIBRATED_COMMIT = "dd70a3f"  # stop 98: the harm test also on the losses recalibrated in the large


def test_the_label_flips_on_the_recalibrated_harm_test_are_the_rows_they_ran_again():
    """docs/server-checks.md's stop 98 runs of the rows a flag decided (the label flippers left out in their warm-up
    round) at four and seven sites, on the recalibrated harm test: the same rows to the last digit as the table's
    (docs/attack-suite/label-flips-stop98.json against docs/attack-suite/results.json)."""
    folder = REPOSITORY / "docs" / "attack-suite"
    runs = json.loads((folder / "results.json").read_text())
    again = json.loads((folder / "label-flips-stop98.json").read_text())
    assert sorted(again) == sorted([
        "clean-4sites-0attackers-seed1",
        *(f"{attack}-{setting}-seed1" for attack in ("label_flip", "label_flip_quiet")
          for setting in ("4sites-1attackers", "7sites-1attackers")),
        "label_flip-7sites-2attackers-seed1",
    ])  # fmt: skip
    assert {run["commit"][:7] for run in again.values()} == {RECALIBRATED_COMMIT}
    for name, run in again.items():
        kept = runs[name]
        assert kept["commit"][:7] != RECALIBRATED_COMMIT
        for field in ("exit_code", "excluded", "rejected", "best_auroc", "final_auroc", "stopped"):
            assert run[field] == kept[field], (name, field)
    flippers = [run for run in again.values() if run["attack"] != "clean"]
    assert all(run["excluded"] == run["attacking_sites"] for run in flippers)
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    times = [run["seconds"] for run in again.values()]
    assert (
        f"commit {RECALIBRATED_COMMIT}, {min(times):.0f} to {max(times):.0f} s a run): in every one of the "
        f"{len(flippers)} runs each flipper ({sum(len(run['attacking_sites']) for run in flippers)} sites) was left "
        "out again (the round is not recorded)" in page
    )


def test_the_harm_test_recalibrated_in_the_large_is_its_record():
    """docs/server-checks.md's stop 98 runs of the clean sweep from the stand-in: seed 384 again (stopped at stop 95 by
    the harm rule), whole, with SIIM's figures recomputed by the harm test itself; every two-site draw of seeds 470-559,
    in order, with the one stopped by the initial model's bar (529) and its figures; the table's count of stops."""
    clean_sweep = load_benchmark("clean_sweep")
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    stand_in = json.loads((sweeps / "stand-in.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    stopped_then = json.loads((sweeps / "stand-in-529-stop98.json").read_text())  # run again at stop 99
    ran = {run["federation"]["seed"]: stopped_then.get(name, run) for name, run in stand_in.items()
           if stopped_then.get(name, run).get("commit", "").startswith(RECALIBRATED_COMMIT)}  # fmt: skip
    again = ran.pop(384)
    before = json.loads((sweeps / "stand-in-384-stop95.json").read_text())["sweep-384"]
    assert before["exit_code"] == 2 and "harms a site: for site-1-siim" in before["stopped"]
    assert again["exit_code"] == 0 and again["published"] and 384 in clean_sweep.CALIBRATION_SEEDS
    rounds = again["federation"]["rounds"]
    assert f"--seeds 384`, commit {RECALIBRATED_COMMIT}, {again['seconds']:.0f} s on this task's" in page
    assert f"it ran its {rounds} rounds whole and published" in page
    first, last = (again["validations"][str(number)]["site-1-siim"] for number in (0, rounds - 1))
    harm = judging.harm_of(first)
    assert harm.p > 0.5 and harm.recalibrated.difference < harm.recalibrated.margin

    def own(figures: dict, name: str, against: str) -> float:
        return figures[name] - figures[against]

    assert (
        f"its loss of the candidate {harm.difference:.4f} above its own model's ({first['val_loss']:.4f} against "
        f"{own(first, 'val_loss', 'val_loss_minus_own'):.4f}), {harm.recalibrated.difference:.4f} above once both are "
        f"recalibrated (standard error {harm.recalibrated.error:.4f}, against a margin of "
        f"{harm.recalibrated.margin:.4f}), its mean AUROC {first['val_mean_auroc']:.3f} against its own model's "
        f"{own(first, 'val_mean_auroc', 'val_auroc_minus_own'):.3f}; in the last round its loss of the global model "
        f"{last['val_loss']:.4f} against its own model's {own(last, 'val_loss', 'val_loss_minus_own'):.4f}, "
        f"{last['val_recalibrated_loss']:.4f} against "
        f"{own(last, 'val_recalibrated_loss', 'val_recalibrated_loss_minus_own'):.4f} recalibrated, its AUROC "
        f"{last['val_mean_auroc']:.3f} against {own(last, 'val_mean_auroc', 'val_auroc_minus_own'):.3f}" in page
    )
    drawn = [seed for seed in range(470, 560) if len(clean_sweep.draw(seed).sites) == 2]
    assert list(ran) == drawn  # every draw, in order
    times = [run["seconds"] for run in ran.values()]
    assert f"--seeds {' '.join(map(str, drawn))} --stop-starting-after 1500`" in page
    assert f"all {len(drawn)} started within its 25 minutes, {min(times):.0f} to {max(times):.0f} s each" in page
    for run in ran.values():  # no harm test flagged a site, on the losses as they are or recalibrated
        for number, validation in run["validations"].items():
            if number == "-1":
                continue
            level = judging.round_level(run["federation"]["rounds"])
            as_they_are = {site: {key: value for key, value in figures.items() if "recalibrated" not in key}
                           for site, figures in validation.items()}  # fmt: skip
            assert not judging.flagged(validation, {}, level) and not judging.flagged(as_they_are, {}, level)
    assert not any(any(run["excluded"].values()) or run["rejected"] for run in ran.values())
    stopped = {seed: run for seed, run in ran.items() if run["exit_code"] != 0}
    assert list(stopped) == [529] and len(ran) - len(stopped) == 17
    assert stopped[529]["stopped"].startswith("no trained global model was judged at least as good as the initial")
    initial = re.search(r"the initial model's: ([0-9.]+)\)", stopped[529]["stopped"])[1]
    assert f"the initial model's judged loss {initial})" in page
    figures = stopped[529]["validations"]
    siim = [figures[str(number)]["site-2-siim"] for number in range(stopped[529]["federation"]["rounds"])]
    losses, aurocs = [round(one["val_loss"], 4) for one in siim], [one["val_mean_auroc"] for one in siim]
    start = figures["-1"]
    assert min(losses) > start["site-2-siim"]["local_val_loss"] > start["site-2-siim"]["val_loss"]
    assert (
        f"(its own model of round 0 {start['site-2-siim']['local_val_loss']:.4f}, the global models "
        f"{min(losses):.4f} to {max(losses):.4f}, the start {start['site-2-siim']['val_loss']:.4f}), while its mean "
        f"AUROC rose from {start['site-2-siim']['val_mean_auroc']:.3f} to {min(aurocs):.3f}-{max(aurocs):.3f} and "
        f"PadChest's loss fell from {start['site-1-padchest']['val_loss']:.4f} to "
        f"{figures['0']['site-1-padchest']['val_loss']:.3f}"
    ) in page
    assert (
        f"Of the {len(drawn)} new draws 1 stopped, a false-alarm rate of at most "
        f"{_bound_up(clean_sweep.upper_bound(1, len(drawn)))} a job (exact one-sided 95 %)." in page
    )


NO_VETO_COMMIT = "f60d190"  # stop 99: the initial model's bar without a veto for a site its own training did not help


def _judging_losses(run: dict, number: int) -> dict[str, float]:
    """A record's validation losses of round ``number``'s model by the sites that judged it (neither rejected nor left
    out that round)."""
    left = {*run.get("rejections", {}).get(str(number), {}), *run["excluded"].get(str(number), {})}
    return {site: one["val_loss"] for site, one in run["validations"][str(number)].items()
            if site not in left and "val_loss" in one}  # fmt: skip


def _as_stop_99(run: dict, losses: dict[str, float], initial: dict, bar: float) -> dict[str, float]:
    """The bar's losses as stop 99 weighed them (``losses_against_the_bar``, until stop 100): a site without a veto at
    most the larger of its loss of the start and the bar, and two ties more; each loss on its own scale."""
    unable = [site for site in losses if site in initial and initial[site].get("local_val_loss") is not None
              and initial[site]["local_val_loss"] >= initial[site]["val_loss"]]  # fmt: skip
    if not unable or len(unable) == len(losses):
        return losses
    return {site: min(loss, max(initial[site]["val_loss"], bar) + 2 * START_TIE) if site in unable else loss
            for site, loss in losses.items()}  # fmt: skip


RECALIBRATED_BAR = "recalibrated"  # stop 104's bar: a site's change also once recalibrated, where the model ranks


def _past_the_bar(run: dict, number: int, recalibrated: bool) -> bool:
    """Whether round ``number``'s model passes the initial model's bar, replayed from a record: each judging site's
    change against its own loss of the initial model (a site without a veto counted as two ties at most: stop 100),
    with ``recalibrated`` the lower of it and its recalibrated change where the model ranks its images no worse than
    the initial model and its own first-round model (stop 104)."""
    figures = run["validations"]
    initial = {site: one for site, one in figures["-1"].items() if "val_loss" in one}
    losses = _judging_losses(run, number)
    judges = {site: figures[str(number)][site] for site in losses}
    again = recalibrated_changes(judges, figures.get("0", {}), initial) if recalibrated else {}
    changes = changes_against_the_bar(losses, initial, START_TIE, vetoes=True, recalibrated=again)[0]
    return judged_loss(changes)[0] < START_TIE


def _first_past_the_bar(run: dict, rule) -> int | None:
    """Replayed from a clean-sweep record: the first trained round whose model passes the initial model's bar, judged
    by that round's sites (those neither rejected nor left out): by stop 100's rule (True: each site's change against
    its own loss of the initial model, a site without a veto counted as two ties at most), by stop 104's
    (``RECALIBRATED_BAR``: each change the lower of it and the site's recalibrated change, where the model ranks the
    site's images no worse than the initial model and its own first-round model), by the losses as they are
    against the initial model's judged loss (False: the bar before stop 99), or as a given rule weighs the losses
    (``rule(run, losses, initial, bar)``, against the initial model's judged loss)."""
    assert "rejections" in run or not run["rejected"]  # a record without the rounds of its rejections has none
    figures = run["validations"]
    initial = {site: one for site, one in figures["-1"].items() if "val_loss" in one}
    bar = judged_loss({site: one["val_loss"] for site, one in initial.items()})[0]
    for number in sorted(int(key) for key in figures if key != "-1"):
        losses = _judging_losses(run, number)
        if rule in (True, RECALIBRATED_BAR):
            if _past_the_bar(run, number, rule == RECALIBRATED_BAR):
                return number
            continue
        if callable(rule):
            losses = rule(run, losses, initial, bar)
        if judged_loss(losses)[0] < bar + START_TIE:
            return number
    return None


def test_the_initial_models_bar_without_a_veto_is_its_record():
    """docs/server-checks.md's stop 99 section: how many sites of the clean sweeps' records had no veto, the replay of
    every run's first best under the rule and without it, seed 529 from the stand-in again (stopped at stop 98 by the
    bar) with the bar's figures recomputed by the rule itself, and the stand-in table's count of stops."""
    clean_sweep = load_benchmark("clean_sweep")
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    counted, changed = [], []
    before = json.loads((sweeps / "stand-in-529-stop98.json").read_text())["sweep-529"]
    for record in ("results.json", "stand-in.json"):
        runs = json.loads((sweeps / record).read_text())
        initial = [figures for run in runs.values() for figures in run["validations"]["-1"].values()]
        counted.append((sum(one["local_val_loss"] >= one["val_loss"] for one in initial), len(initial)))
        without_veto = [run for run in runs.values() if any(one["local_val_loss"] >= one["val_loss"]
                                                            for one in run["validations"]["-1"].values())]  # fmt: skip
        assert all(run["exit_code"] == 0 for run in without_veto)  # "every run of them passed the bar"
        for name, run in runs.items():
            replayed = _first_past_the_bar(run, True), _first_past_the_bar(run, False)
            assert replayed[0] is not None  # every run of the records passes the bar under the rule
            if replayed[0] != replayed[1]:
                changed.append((record, name, *replayed))
    assert changed == [("stand-in.json", "sweep-529", 0, None)]
    assert (_first_past_the_bar(before, True), _first_past_the_bar(before, False)) == (0, None)
    (scratch, scratch_sites), (stand_in_count, stand_in_sites) = counted
    assert (
        f"at {scratch} of the {scratch_sites} sites from scratch and {stand_in_count} of the {stand_in_sites} from the "
        "stand-in" in page
    )
    runs = json.loads((sweeps / "stand-in.json").read_text())
    again = runs["sweep-529"]
    assert before["exit_code"] == 2 and before["stopped"].startswith("no trained global model was judged")
    assert again["exit_code"] == 0 and again["published"] and again["commit"].startswith(NO_VETO_COMMIT)
    assert 529 in clean_sweep.CALIBRATION_SEEDS
    assert f"--seeds 529`, commit {NO_VETO_COMMIT}, {again['seconds']:.0f} s on this task's 2-core Intel Xeon" in page
    figures, rounds = again["validations"], again["federation"]["rounds"]
    start = figures["-1"]
    initial_judged = judged_loss({site: one["val_loss"] for site, one in start.items()})[0]
    first = {site: one["val_loss"] for site, one in figures["0"].items()}
    weighed = _as_stop_99(again, first, start, initial_judged)
    without_veto = changes_against_the_bar(first, start, START_TIE, vetoes=True)[1]
    assert without_veto == ["site-2-siim"] and start["site-2-siim"]["val_loss"] < initial_judged  # "under it"
    trained = [figures[str(number)] for number in range(rounds)]
    judged = [judged_loss({site: one["val_loss"] for site, one in sites.items()})[0] for sites in trained]
    siim = [sites["site-2-siim"]["val_loss"] for sites in trained]
    padchest = [sites["site-1-padchest"]["val_loss"] for sites in trained]
    assert judged_loss(weighed)[0] <= initial_judged < min(judged)  # the bar passed it; the old bar passed none
    assert (
        f"(its own model of round 0 {start['site-2-siim']['local_val_loss']:.4f} against its start's "
        f"{start['site-2-siim']['val_loss']:.4f}), so the bar weighs round 0's model at {judged_loss(weighed)[0]:.4f} "
        f"(the mean of PadChest's {first['site-1-padchest']:.4f} and the bar, SIIM's loss of the start being under "
        f"it) against the initial model's {initial_judged:.4f}; it ran its {rounds} rounds whole and published, exit "
        f"0, the trained models judged at {min(judged):.4f} to {max(judged):.4f} on the losses as they are (SIIM's "
        f"{min(siim):.4f} to {max(siim):.4f}, PadChest's {min(padchest):.4f} to {max(padchest):.4f})" in page
    )
    # the two-site draws of 561-656, run on the first version of the rule (a site without a veto at its own start)
    ran = {run["federation"]["seed"]: run for name, run in runs.items()
           if run.get("commit", "").startswith(NO_VETO_COMMIT) and name != "sweep-529"}  # fmt: skip
    drawn = [seed for seed in range(561, 657) if len(clean_sweep.draw(seed).sites) == 2]
    assert list(ran) == drawn[: len(ran)] and len(ran) == 23  # the first 23 of them, in order
    times = [run["seconds"] for run in ran.values()]
    assert f"--seeds {' '.join(map(str, drawn))} --stop-starting-after 3600`" in page
    assert f"{min(times):.0f} to {max(times):.0f} s each" in page
    assert f"the first {len(ran)} of the {len(drawn)} started within its hour, and all {len(ran)} ran whole" in page
    assert all(run["exit_code"] == 0 and run["published"] and not run["rejected"] for run in ran.values())
    assert not any(any(run["excluded"].values()) for run in ran.values())
    for run in ran.values():  # no harm test flagged a site, on the losses as they are or recalibrated
        level = judging.round_level(run["federation"]["rounds"])
        assert not any(judging.flagged(validation, {}, level)
                       for number, validation in run["validations"].items() if number != "-1")  # fmt: skip

    def as_first_run(run: dict, losses: dict[str, float], initial: dict, bar: float) -> dict[str, float]:
        """The bar as commit f60d190 weighed it: a site without a veto at its own loss of the start."""
        unable = [site for site in losses if initial[site]["local_val_loss"] >= initial[site]["val_loss"]]
        if not unable or len(unable) == len(losses):
            return losses
        return {site: min(loss, initial[site]["val_loss"] + 2 * START_TIE) if site in unable else loss
                for site, loss in losses.items()}  # fmt: skip

    unable = [(run["federation"]["seed"], site) for run in ran.values()
              for site, one in run["validations"]["-1"].items()
              if one["local_val_loss"] >= one["val_loss"]]  # fmt: skip
    assert unable == [(585, "site-1-siim")]
    assert "One site had no veto (seed 585's site-1-siim)" in page
    for run in ran.values():  # "the same round under the rule of their commit, today's and none"
        replayed = {
            _first_past_the_bar(run, True),
            _first_past_the_bar(run, False),
            _first_past_the_bar(run, as_first_run),
        }
        assert len(replayed) == 1 and None not in replayed
    assert (
        f"Of the {len(ran)} new draws 0 stopped, a false-alarm rate of at most "
        f"{_bound_up(clean_sweep.upper_bound(0, len(ran)))} a job (exact one-sided 95 %)." in page
    )
    stops = sum(run["exit_code"] != 0 for run in runs.values())
    fresh = [run for name, run in runs.items() if clean_sweep.out_of_sample(name, run)]
    fresh_stops = sum(run["exit_code"] != 0 for run in fresh)
    assert stops == fresh_stops == 0
    assert (
        f"The sweep table's stand-in rows: {stops} of {len(runs)} stopped (at most "
        f"{_bound_up(clean_sweep.upper_bound(stops, len(runs)))}), and of the {len(fresh)} never used to set a rule "
        f"{fresh_stops} (at most {_bound_up(clean_sweep.upper_bound(fresh_stops, len(fresh)))})" in page
    )


WIDE_COMMIT = "56003b1"  # stop 99: the draws of three or more sites from the stand-in under today's rules
NEXT_WIDE_COMMIT = "bab048d"  # stop 100: the next such draws, 7-site ones among them


def _wide_draws(
    commit: str,
    seeds: range,
    command_seeds: list[int],
    stop_after: int,
    refused: tuple[int, ...] = (),
    record: str = "stand-in.json",
) -> tuple[dict[int, dict], str]:
    """The draws of three or more sites from the stand-in that ran at ``commit``: the first of those of ``seeds`` in
    order (the command's ``command_seeds``, each started within ``stop_after`` seconds), each run whole and published
    with nothing stopped, left out or flagged, and nothing refused but in the ``refused`` seeds, its first best the
    same with the bar's rule and without; and the page, whitespace joined, which quotes the command and the times."""
    clean_sweep = load_benchmark("clean_sweep")
    runs = json.loads((REPOSITORY / "docs" / "clean-sweep" / record).read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    ran = {run["federation"]["seed"]: run for run in runs.values()
           if run.get("commit", "").startswith(commit) and run["federation"]["seed"] in seeds}  # fmt: skip
    drawn = [seed for seed in seeds if len(clean_sweep.draw(seed).sites) >= 3]
    assert drawn[: len(command_seeds)] == command_seeds
    assert list(ran) == command_seeds[: len(ran)]  # the first of them, in order
    times = [run["seconds"] for run in ran.values()]
    assert f"--seeds {' '.join(map(str, command_seeds))} --stop-starting-after {stop_after}`, commit {commit}" in page
    assert f"{min(times):.0f} to {max(times):.0f} s each" in page
    assert all(run["exit_code"] == 0 and run["published"] for run in ran.values())
    assert tuple(seed for seed, run in ran.items() if run["rejected"]) == refused
    assert not any(any(run["excluded"].values()) for run in ran.values())
    for run in ran.values():
        level = judging.round_level(run["federation"]["rounds"])
        assert not any(judging.flagged(validation, {}, level)
                       for number, validation in run["validations"].items() if number != "-1")  # fmt: skip
        assert _first_past_the_bar(run, True) == _first_past_the_bar(run, False) is not None
    return ran, page


def _unable_and_lowest(ran: dict[int, dict]) -> tuple[str, tuple[float, int]]:
    """The sites without a veto (their own model of round 0 no better than the start by loss), and the lowest cosine
    of an honest site's update with the robust aggregate, with its seed."""
    unable = [f"{run['federation']['seed']}'s {site}" for run in ran.values()
              for site, one in run["validations"]["-1"].items()
              if one["local_val_loss"] >= one["val_loss"]]  # fmt: skip
    lowest = min((min(sites.values()), run["federation"]["seed"]) for run in ran.values()
                 for sites in run["directions"].values() if sites)  # fmt: skip
    return ", ".join(unable) or "none", lowest


def test_the_wider_draws_from_the_stand_in_under_todays_rules_are_their_record():
    """docs/server-checks.md's stop 99 runs of three or more sites from the stand-in: every such draw of seeds 562-579
    in order, the first that started within the command's time; none stopped, left a site out, had a result refused
    or a harm flag; the sites without a veto, and the first best replayed with the rule and without it."""
    command = [562, 565, 566, 567, 568, 569, 571, 572, 573, 575, 577, 578, 579]
    ran, page = _wide_draws(WIDE_COMMIT, range(562, 580), command, 1500)
    sizes = sorted({len(run["federation"]["sites"]) for run in ran.values()})
    assert f"the first {len(ran)} of the {len(command)} ({' and '.join(map(str, sizes))} sites) started" in page
    unable, lowest = _unable_and_lowest(ran)
    assert f"Sites without a veto: {unable}" in page
    assert f"the robust aggregate was {lowest[0]:.2f} (seed {lowest[1]})" in page
    bound = _bound_up(load_benchmark("clean_sweep").upper_bound(0, len(ran)))
    assert f"0 of {len(ran)} stopped, at most {bound} a job (exact one-sided 95 %: few runs)" in page


def test_the_next_draws_from_the_stand_in_are_their_record():
    """docs/server-checks.md's stop 100 runs of three or more sites from the stand-in: the next such draws of seeds
    571-590 in order, the first 12 of which started; none stopped, left a site out or had a harm flag, two had an honest
    site's results refused; the sizes, the sites without a veto, the bounds and the sweep table's counts."""
    command = [571, 572, 573, 575, 577, 578, 579, 582, 583, 584, 586, 587, 589, 590]
    ran, page = _wide_draws(NEXT_WIDE_COMMIT, range(571, 591), command, 5700, refused=(575, 578))
    clean_sweep = load_benchmark("clean_sweep")
    sizes = sorted({len(run["federation"]["sites"]) for run in ran.values()})
    seven = sum(len(run["federation"]["sites"]) == 7 for run in ran.values())
    assert sizes == [3, 4, 7]
    assert f"the first {len(ran)} of the {len(command)} (3, 4 and 7 sites; {seven} of seven) started" in page
    assert f"and all {len(ran)} ran whole and published" in page
    unable, _ = _unable_and_lowest(ran)
    assert f"Sites without a veto: {unable}." in page
    assert all(len(ran[seed]["federation"]["sites"]) == 7 for seed in (575, 578))
    bound = _bound_up(clean_sweep.upper_bound(0, len(ran)))
    refused = _bound_up(clean_sweep.upper_bound(2, len(ran)))
    assert f"0 of {len(ran)} stopped, at most {bound} a job (exact one-sided 95 %: few runs); 2 of {len(ran)}" in page
    assert f"with an honest site's results refused, at most {refused}." in page
    runs = json.loads((REPOSITORY / "docs" / "clean-sweep" / "stand-in.json").read_text())
    untouched = [run for run in runs.values() if clean_sweep.out_of_sample(run["federation"]["name"], run)]
    assert (
        f"The sweep table's stand-in rows: 0 of {len(runs)} stopped (at most "
        f"{_bound_up(clean_sweep.upper_bound(0, len(runs)))}), and of the {len(untouched)} never used to set a rule 0 "
        f"(at most {_bound_up(clean_sweep.upper_bound(0, len(untouched)))})" in page
    )


def test_the_three_site_catalogue_under_todays_rules_is_its_record():
    """docs/server-checks.md's paragraph on stop 98's three-site rows from scratch: the verdicts' counts and each figure
    it quotes, from docs/attack-suite/results.json, against the rows it replaced
    (docs/attack-suite/three-sites-before-stop98.json)."""
    suite = load_benchmark("attack_suite")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    three = {run["attack"]: run for name, run in runs.items()
             if run["sites"] == 3 and run["seed"] == 1 and suite._size(run) == (100, 3, "scratch")}  # fmt: skip
    assert set(three) == {"clean", *suite.REFERENCES, suite.PLACEBO, *suite.ATTACKS}
    assert {run["commit"][:7] for run in three.values()} == {RECALIBRATED_COMMIT}
    before = _before_stop_98(suite, references=True)
    assert set(before) == {f"{attack}-3sites-{0 if attack == 'clean' else 1}attackers-seed1"
                           for attack in ("clean", "honest_alone", "placebo")}  # fmt: skip
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    seconds = [run["seconds"] for run in three.values()]
    assert f"(commit {RECALIBRATED_COMMIT}, {min(seconds):.0f} to {max(seconds):.0f} s a run on this task's" in page
    clean, alone, placebo = three["clean"], three["honest_alone"], three["placebo"]

    def margin(attack: str, reference: dict = clean) -> str:
        return f"{suite.lowest_margin(three[attack], reference):+.3f}"

    verdicts = {attack: suite.verdict(three[attack], clean) for attack in suite.ATTACKS}
    against_alone = {attack: suite.verdict(three[attack], alone) for attack in suite.ATTACKS}
    counted = {
        verdict: list(verdicts.values()).count(verdict) for verdict in ("holds", "did not take", "breaks through")
    }
    refused = [attack for attack, run in three.items() if run["rejected"] == run["attacking_sites"] == ["site-nih-2"]]
    assert sorted(refused) == sorted(["sign_flip", "ipm", "opt_ipm", "opt_alie", "inf", "gaussian", "label_flip",
                                      "label_flip_quiet"])  # fmt: skip
    assert all(three[attack]["best_auroc"] == alone["best_auroc"] for attack in refused)
    cost = -suite.lowest_margin(alone, clean)
    assert cost > suite.TOLERANCE and all(verdicts[attack] == "breaks through" for attack in refused)
    broken_alone = [attack for attack, verdict in against_alone.items() if verdict == "breaks through"]
    assert broken_alone == ["mimic_noised", "label_flip_late", "backdoor"]
    alone_counted = {verdict: list(against_alone.values()).count(verdict) for verdict in ("holds", "did not take")}
    backdoor, boosted = three["backdoor"], three["backdoor_boosted"]

    def share(value: float) -> str:
        return f"{100 * value:.1f} %"

    assert (
        f"against the clean run {counted['holds']} of the 15 attacks hold, {counted['did not take']} did not take and "
        f"{counted['breaks through']} break through, {len(refused)} of them by no more than leaving the attacker out "
        f"costs here ({cost:.3f}, past the tolerance); against the honest sites alone {alone_counted['holds']} hold, "
        f"{alone_counted['did not take']} did not take and {len(broken_alone)} break through: `mimic_noised` "
        f"({margin('mimic_noised', alone)}), `label_flip_late` ({margin('label_flip_late', alone)}) and `backdoor` "
        f"({share(backdoor['best_backdoor_success'])} of the triggered negatives against "
        f"{share(alone['best_backdoor_success'])} for the honest sites alone).**" in page
    )
    old_cost = -suite.lowest_margin(before["honest_alone-3sites-1attackers-seed1"],
                                    before["clean-3sites-0attackers-seed1"])  # fmt: skip
    assert (
        f"**Leaving the third site out costs {cost:.3f}** (site-nih-1: {alone['best_auroc']['site-nih-1']:.3f} against "
        f"{clean['best_auroc']['site-nih-1']:.3f} in the clean run; stop 95's rows: {old_cost:.3f}), and the placebo "
        f"moved the honest sites by {suite.lowest_margin(placebo, clean):+.3f}" in page
    )
    assert verdicts["alie"] == verdicts["bn_inflate"] == "holds" and against_alone["mimic"] == "holds"
    assert (
        f"`alie` ({margin('alie')}) and `bn_inflate` ({margin('bn_inflate')}) hold; `mimic` {margin('mimic')} against "
        f"the clean run, {margin('mimic', alone)} against the honest sites alone" in page
    )
    for attack, said in (("mimic_noised", "the honest sites end at {} and {} ({} against the clean run, {} against"),
                         ("label_flip_late", "the late label flip at {} and {} ({} and {})")):  # fmt: skip
        ends = sorted(f"{value:.3f}" for value in three[attack]["best_auroc"].values())
        assert not three[attack]["rejected"] and not three[attack]["excluded"]
        assert said.format(*ends, margin(attack), margin(attack, alone)) in page, attack
    own = backdoor["attackers_own_backdoor_success"]["site-nih-2"]
    assert verdicts["backdoor"] == "breaks through" and verdicts["backdoor_boosted"] == "did not take"
    assert (
        f"{share(backdoor['best_backdoor_success'])} of the honest sites' triggered negatives against the clean "
        f"model's {share(clean['best_backdoor_success'])} ({100 * suite.backdoor_above(backdoor, clean):.1f} points, "
        f"where {100 * suite.BACKDOOR_TOLERANCE:.0f} are allowed; the attacker's own model {share(own)}), AUROC "
        f"{margin('backdoor')}; "
        f"the boosted one did not take ({share(boosted['best_backdoor_success'])}, its attacker's own "
        f"{share(boosted['attackers_own_backdoor_success']['site-nih-2'])})" in page
    )


def _rounded_up(value: float, digits: int) -> str:
    """A largest difference as the page prints it: rounded up, never down, to ``digits`` places."""
    return f"{math.ceil(value * 10**digits - 1e-9) / 10**digits:.{digits}f}"


def _percent_rounded_up(share: float, digits: int) -> str:
    """A rate as the harm-test paragraphs print their maxima: in percent, rounded up to ``digits`` places."""
    return f"{_rounded_up(100 * share, digits)} %"


def test_the_recalibrated_halfs_standard_error_is_its_record():
    """The page's figures of the harm test's two halves under a true null are those of
    ``docs/harm-test/recalibrated-null.json`` (``benchmarks/recalibrated_null.py``): the most each half rejected, the
    server's test where a candidate's intercepts are far off, and the recalibrated half from 200 images."""
    stored = json.loads((REPOSITORY / "docs" / "harm-test" / "recalibrated-null.json").read_text())
    record, draws = stored["rates"], stored["draws"]
    levels = ("0.05", "0.01", "0.001")
    assert len(record) == 18 and draws == 8000

    def most(test: str, keep) -> list[float]:
        return [max(rates[test][level] for name, rates in record.items() if keep(name)) for level in levels]

    def up(rates: list[float]) -> list[str]:  # the most, rounded up: a tenth of a percent, a hundredth at 0.1 %
        return [_percent_rounded_up(value, digits) for value, digits in zip(rates, (1, 1, 2), strict=True)]

    recalibrated = most("recalibrated", lambda name: True)
    assert recalibrated == most("recalibrated", lambda name: name.startswith("20x7@"))  # the most: at 20 images of 7
    shown = up(recalibrated)
    raw = up(most("as they are", lambda name: name.endswith("/same")))
    shifted = most("both (the server's)", lambda name: name.endswith("/shifted"))
    assert shifted == most("both (the server's)", lambda name: True)
    server = up(shifted)
    for name, rates in record.items():  # from 200 images: within two standard errors of the draws of the level
        if int(name.split("x")[0]) >= 200:
            for level in levels:
                error = math.sqrt(float(level) * (1 - float(level)) / draws)
                assert abs(rates["recalibrated"][level] - float(level)) <= 2 * error, (name, level)
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert f"{draws:,} draws in each of {len(record)} settings of 20 to 1,000 images" in page
    assert (
        f"the recalibrated half rejected a true null in up to {shown[0]} of the draws at the 5 % level, {shown[1]} at "
        f"1 % and {shown[2]} at 0.1 %, with 20 images of seven findings, and within two standard errors of the draws "
        "of its level from 200 images"
    ) in page
    assert f"in up to {raw[0]}, {raw[1]} and {raw[2]} where their null holds" in page
    assert f"the recalibrated half decides alone: up to {server[0]}, {server[1]} and {server[2]}." in page
    assert "up to about four times the level with 20 validation images" in page
    told = min(rates["as they are"][level] for name, rates in record.items() if "x7@" in name and "shifted" in name
               for level in levels)  # fmt: skip
    assert f"tell it worse in {math.floor(1000 * told) / 10:.1f} % of the draws or more" in page
    assert round(recalibrated[2] / 0.001) == 4


def test_the_harm_tests_rates_at_ten_images_and_under_students_t_are_their_record():
    """The page's figures of the server's test at ten validation images, and of Student's t, are those of
    ``docs/harm-test/recalibrated-null-small.json`` (``recalibrated_null.py --student-t``): the most the server's test
    rejected at ten images of seven findings (the recalibrated half deciding alone) and of one, the most under t with
    seven findings (ten and 20 images) and with one, and the z each test needs at 0.1 % with ten images."""
    from scipy.stats import norm, t

    from surgical_aggregation.data.site_view import DataConfig

    stored = json.loads((REPOSITORY / "docs" / "harm-test" / "recalibrated-null-small.json").read_text())
    record, levels = stored["rates"], ("0.05", "0.01", "0.001")
    assert stored["draws"] == 20000 and len(record) == 9 and stored["machine"].startswith("AMD EPYC, family 25 model 1")

    def most(test: str, prefixes: tuple[str, ...]) -> list[float]:
        return [
            max(rates[test][level] for name, rates in record.items() if name.startswith(prefixes)) for level in levels
        ]

    def up(rates: list[float], digits: tuple[int, ...] = (1, 1, 2)) -> str:  # the most, rounded up, as the page shows
        shown = [_percent_rounded_up(value, places) for value, places in zip(rates, digits, strict=True)]
        return f"{shown[0]}, {shown[1]} and {shown[2]}"

    server = "both (the server's)"
    seven, one = most(server, ("10x7@",)), most(server, ("10x1@",))
    assert seven == most("recalibrated", ("10x7@0.15/shifted",))  # "the recalibrated half decides alone"
    assert round(seven[2] / 0.001) == 8 and round(seven[1] / 0.01) == 3  # "eight times ... three times"
    assert all(value < float(level) for value, level in zip(one, levels, strict=True))  # "below the level"
    seven_t, one_t = most(f"{server} (t)", ("10x7@", "20x7@")), most(f"{server} (t)", ("10x1@",))
    assert seven_t[0] > 0.05 and seven_t[1] > 0.01  # "still above them"
    assert abs(seven_t[2] - 0.001) <= 2 * math.sqrt(0.001 * 0.999 / stored["draws"])  # "within two standard errors"
    assert seven_t[2] == max(
        record[f"20x7@0.15/{kind}"][f"{server} (t)"]["0.001"] for kind in ("same", "own", "shifted")
    )
    assert one_t[2] == 0.0
    again = most(server, ("20x7@",))
    earlier = json.loads((REPOSITORY / "docs" / "harm-test" / "recalibrated-null.json").read_text())
    before = [earlier["rates"]["20x7@0.15/shifted"][server][level] for level in levels]
    for now, then, level in zip(again, before, levels, strict=True):  # "within the two runs' noise"
        variance = now * (1 - now) / stored["draws"] + then * (1 - then) / earlier["draws"]
        assert abs(now - then) <= 2 * math.sqrt(variance), level
    # from 200 images: each test's rate above its level, in standard errors of the draws, where its null holds
    excess = max(
        (by_level[level] - float(level)) / math.sqrt(float(level) * (1 - float(level)) / earlier["draws"])
        for name, rates in earlier["rates"].items()
        if int(name.split("x")[0]) >= 200
        for test, by_level in rates.items()
        if test != "as they are" or name.endswith("/same")
        for level in levels
    )
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert f"`python benchmarks/recalibrated_null.py --draws {stored['draws']} --settings 10x1@0.1 10x7@0.15" in page
    assert f"{stored['seconds']} s on this task's 2-core AMD EPYC, family 25 model 1;" in page
    assert f"of seven findings the server's test rejected a true null in up to {up(seven)} of the draws" in page
    assert f"with ten images of one finding in up to {up(one, (1, 2, 2))}, below the level" in page
    assert f"At 20 images of seven these draws give {up(again)}, the earlier record's {up(before)} within" in page
    shown = up(seven_t, (1, 1, 2)).split(", ")
    assert f"to up to {shown[0]} and {shown[1].split(' and ')[0]} at the 5 % and 1 % levels, still above them" in page
    assert f"and {shown[1].split(' and ')[1]} at 0.1 %, within two standard errors of the draws of it" in page
    assert f"(up to {up(one_t, (1, 2, 2)).removesuffix(' and 0.00 %')} and none)" in page
    assert f"from 200 images every test at most {excess:.1f} standard errors of the draws above its level" in page
    needed, normal = t.isf(0.001, 9), norm.isf(0.001)
    assert f"for z = {needed:.2f} where the normal asks {normal:.2f}, {needed / normal:.2f} times as large" in page
    assert DataConfig().split_fractions[1] == 0.1  # "a tenth of its patients, the sites' default split"
    readme = " ".join((REPOSITORY / "README.md").read_text().split())
    assert seven[2] > 0.001  # not at ten images
    assert "false alarms per job: each test near its level from 200 validation images a site)" in readme


def _best_round(run: dict, paired: bool, recalibrated: bool = False) -> int | None:
    """Replayed from a record (its ``excluded`` by round): the round whose model is the best at the end, past the
    initial model's bar (stop 100's; ``recalibrated``, stop 104's), then each later model the best when its judged
    loss is lower than the best's by more than the controller's default ``min_delta`` (1e-4), or, ``paired`` (stop
    104), when the judged statistic of each judge's change of loss against its own loss of the best is below -1e-4."""
    figures = run["validations"]
    best, reference = None, {}
    for number in sorted(int(key) for key in figures if key != "-1"):
        losses = _judging_losses(run, number)
        changes = {site: loss - reference[site] for site, loss in losses.items() if site in reference}
        if best is None:
            better = _past_the_bar(run, number, recalibrated)
        elif paired and changes:
            better = judged_loss(changes)[0] < -1e-4
        else:
            better = judged_loss(losses)[0] < judged_loss(reference)[0] - 1e-4
        if better:
            best, reference = number, losses
    return best


@functools.cache  # read once for the tests that replay them
def _replayable_runs() -> tuple[tuple[str, str, dict], ...]:
    """Every record of the clean sweeps and the attack suite up to stop 104 that keeps each site's losses by round:
    (file, run, record); the suite's records say who was rejected or left out, not in which rounds: those sites are
    left out of every round."""
    runs = []
    for folder in ("clean-sweep", "attack-suite"):
        for path in sorted((REPOSITORY / "docs" / folder).glob("*.json")):
            if f"{folder}/{path.name}" in AFTER_STOP_104:
                continue
            stored = json.loads(path.read_text())
            for name, run in stored.items() if isinstance(stored, dict) else ():
                figures = run.get("validations", {}) if isinstance(run, dict) else {}
                if "-1" not in figures or len(figures) < 2:
                    continue  # no losses by round: nothing to replay
                if run.get("commit", "").startswith(STOP_113):
                    continue  # a run added to the suite's table after stop 104
                if not isinstance(run.get("excluded"), dict):  # the suite's records: who was left out, not when
                    out = dict.fromkeys([*run.get("rejected", []), *run.get("excluded", [])])  # taken as every round
                    run = {**run, "excluded": {number: out for number in figures}, "rejections": {}, "rejected": []}
                runs.append((f"{folder}/{path.name}", name, run))
    return tuple(runs)


def test_the_initial_models_bar_each_site_against_its_own_start_is_its_record():
    """docs/server-checks.md's stop 100 section: replayed from every record of the clean sweeps and the attack suite
    that keeps each site's losses by round, the first best is the same round under today's bar (each site's change
    against its own start) as under stop 99's (losses on their own scales), and the page counts the runs. The suite's
    records say who was rejected or left out, not in which rounds: their replay leaves those sites out of every
    round. A choice of the best on paired changes would pick another round in as many runs as the page says."""
    replayed, paired = [], []
    for file, name, run in _replayable_runs():
        replayed.append((file, name, _first_past_the_bar(run, True), _first_past_the_bar(run, _as_stop_99)))
        paired.append(_best_round(run, True) != _best_round(run, False))
    assert all(today == before for *_, today, before in replayed), [run for run in replayed if run[2] != run[3]]
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert f"keeps each site's losses by round ({len(replayed)} runs; an attack run's rejected and left-out" in page
    assert "sites left out of every round, its record saying not which), the first best is the same round" in page
    assert f"would pick another best round in {sum(paired)} of the {len(replayed)} runs replayed" in page


FIRST_ROUND_COMMIT = "4e832d0"  # stop 101: the jobs from pretrained weights judge direction in the first round only
NEXT_STOP_AFTER = 3146  # stop 101's next draws: seconds after which none started (the time left until 12:10 that day)


def test_the_direction_check_from_pretrained_weights_in_the_first_round_only_is_its_record():
    """docs/server-checks.md's stop 101 section: the premise of the direction check by round, from scratch and from the
    stand-in (the sweep tables' records); the three federations it refused, run again with the first round only, each
    whole, published, nothing refused, and its best model against the one the rule every round kept; the table."""
    clean_sweep = load_benchmark("clean_sweep")
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    from_scratch = [cosine for run in json.loads((sweeps / "results.json").read_text()).values()
                    for sites in (run.get("directions") or {}).values() for cosine in sites.values()]  # fmt: skip
    assert f"(the clean sweep's {len(from_scratch)} recorded honest site-rounds, the lowest cosine " in page
    assert f"the lowest cosine {min(from_scratch):.3f})" in page and min(from_scratch) > 0
    every = json.loads((sweeps / "stand-in.json").read_text())
    wide = [run for run in every.values() if len(run["federation"]["sites"]) >= 3]
    first = [cosine for run in wide for cosine in run["directions"]["0"].values()]
    later = [(run, number, site, cosine) for run in wide for number, sites in run["directions"].items()
             if number != "0" for site, cosine in sites.items()]  # fmt: skip
    opposed = [(run, number, site) for run, number, site, cosine in later if cosine <= 0]
    assert all(len(run["federation"]["sites"]) == 7 and re.search("padchest|vindr", site) for run, _, site in opposed)

    def first_refusal(run: dict, site: str) -> int:
        return min(int(number) for number, sites in run["rejections"].items() if site in sites)

    after = sum(int(number) > first_refusal(run, site) for run, number, site in opposed)
    assert (
        f"(the {len(first)} honest site-rounds of the {len(wide)} federations of three or more sites in the table "
        f"[above](#clean-federations-from-the-stand-in), the consortium job among them, the lowest {min(first):.3f}) "
        f"and failed after it ({len(opposed)} of the {len(later)} honest site-rounds of later rounds at or below 0, "
        f"all at a PadChest or VinDr site of seven, {after} of them after that site's first refusal)"
    ) in page
    assert min(first) > 0 and clean_sweep.CONSORTIUM in every
    runs = json.loads((sweeps / "stand-in-first-round.json").read_text())
    assert all(run["direction_check"] == "first_round" and run["federation"]["start"] == "stand-in"
               and run["commit"].startswith(FIRST_ROUND_COMMIT) for run in runs.values())  # fmt: skip
    reruns = {name: runs[name] for name in ("sweep-575", "sweep-578", clean_sweep.CONSORTIUM)}
    assert all(not clean_sweep.out_of_sample(name, run) for name, run in reruns.items())  # they chose the rule
    assert clean_sweep.out_of_sample(clean_sweep.CONSORTIUM, every[clean_sweep.CONSORTIUM])  # not for the old rule
    seconds = [run["seconds"] for run in reruns.values()]
    assert (
        f"--seeds 575 578 --consortium`, commit {FIRST_ROUND_COMMIT}, {min(seconds):.0f} to {max(seconds):.0f} s"
        in page
    )
    for run in reruns.values():
        assert run["exit_code"] == 0 and run["published"] and not run["rejected"]
        assert not any(run["excluded"].values()) and len(run["validations"]) == run["federation"]["rounds"] + 1

    def best(
        run: dict,
    ) -> tuple[int, float, float]:  # the best round, its judged loss, the sites' mean validation AUROC
        number = _best_round(run, False)
        sites = run["validations"][str(number)]
        loss = judged_loss({site: one["val_loss"] for site, one in sites.items()})[0]
        return number, loss, float(np.mean([one["val_mean_auroc"] for one in sites.values()]))

    quoted = []
    for name, run in reruns.items():
        (kept, kept_loss, kept_auroc), (now, loss, auroc) = best(every[name]), best(run)
        figures = (
            f"({kept_loss:.3f}, {kept_auroc:.3f})"
            if quoted
            else (f"model (judged loss {kept_loss:.3f}, the sites' mean validation AUROC {kept_auroc:.3f})")
        )
        quoted.append(f"from round {kept}'s {figures} to round {now}'s ({loss:.3f}, {auroc:.3f})")  # fmt: skip
        assert int(max(every[name]["validations"], key=int)) == kept < now  # the rule every round threw the rest away
    assert f"went on {quoted[0]}; seed 578" in page
    assert f"every later round) {quoted[1]}; the consortium job {quoted[2]}, as with the check off" in page
    padchest = reruns["sweep-575"]["directions"]
    vindr = reruns["sweep-578"]["directions"]
    assert (
        f"(its PadChest site's lowest cosine {min(sites['site-1-padchest'] for sites in padchest.values()):.2f}, "
        in page
    )
    assert f"(its VinDr site's {vindr['1']['site-7-vindr']:.2f} in round 1, positive in every later round)" in page
    assert all(sites["site-7-vindr"] > 0 for number, sites in vindr.items() if int(number) > 1)
    # differences of the figures as the page rounds them
    gains = [round(best(every[name])[1], 3) - round(best(run)[1], 3) for name, run in reruns.items()]
    moves = [round(best(run)[2], 3) - round(best(every[name])[2], 3) for name, run in reruns.items()]
    assert (
        f"lowered the judged loss by {min(gains):.3f} to {max(gains):.3f} and moved the mean AUROC by "
        f"{min(moves):+.3f} to {max(moves):+.3f}"
    ) in page

    moved = [name for name, run in reruns.items() if best(run)[2] - best(every[name])[2] > 0.001]  # unrounded
    assert moved == ["sweep-575"] and "the AUROC by more than 0.001 only at seed 575" in page
    table = _marked_block(REPOSITORY / "docs" / "server-checks.md", "clean-sweep-first-round")
    assert table == "\n".join(clean_sweep.table(runs))


def test_the_attack_rows_from_the_stand_in_under_the_first_round_only_are_their_record():
    """docs/server-checks.md's stop 101 section: the suite's runs from the stand-in that the direction check judged
    after round 0, run again with it in the first round only, and the late sign flip at three sites and the update
    attacks at seven: each holds, who was refused in which round, and the figures the page quotes."""
    suite = load_benchmark("attack_suite")
    before, made = _before_stop_101()
    current = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    three, four, seven = (f"{sites}sites-1attackers-seed1-stand-in" for sites in (3, 4, 7))
    expected = [f"{attack}-{three}" for attack in ("sign_flip", "ipm", "opt_ipm", "opt_alie", "sign_flip_late")]
    expected += [f"sign_flip-{four}", f"mimic_noised-{four}", f"sign_flip-{seven}", f"ipm-{seven}"]
    assert sorted(made) == sorted(expected) and all(
        run["commit"].startswith(FIRST_ROUND_COMMIT) for run in made.values()
    )
    assert sorted(before.keys() & made.keys()) == sorted(expected[:4] + expected[5:7])  # the runs they replaced
    seconds = [run["seconds"] for run in made.values()]
    assert f"commit {FIRST_ROUND_COMMIT}, {min(seconds):.0f} to {max(seconds):.0f} s a run;" in page
    for name, run in made.items():
        assert suite.verdict(run, suite.clean_of(current, run)) == "holds", name
        assert suite.verdict(run, suite.alone_of(current, run)) == "holds", name
        assert run["exit_code"] == 0 and not run["excluded"]
    assert f"All {len(made)} hold, against the clean run and against the honest sites alone." in page

    def alone(name: str) -> float:
        return suite.lowest_margin(made[name], suite.alone_of(current, made[name]))

    judged = [f"{attack}-{three}" for attack in ("sign_flip", "ipm", "opt_ipm")]
    judged += [f"sign_flip-{four}", f"sign_flip-{seven}", f"ipm-{seven}"]
    for name in judged:  # refused in round 0 only, the attacker alone
        assert _refused_by_round(made[name]) == {"0": made[name]["attacking_sites"]}, name
    for name in judged[:3]:  # the old rule: refused every round, the honest sites alone exactly
        assert before[name]["best_auroc"] == suite.alone_of(before, before[name])["best_auroc"]
    at_three = [alone(name) for name in judged[:3]]
    assert f"end {min(at_three):+.3f} to {max(at_three):+.3f} from the honest sites alone at three sites" in page
    assert (
        f"`sign_flip` {alone(judged[3]):+.3f} at four, `sign_flip` and `ipm` {alone(judged[4]):+.3f} at seven" in page
        and f"{alone(judged[5]):+.3f}" == f"{alone(judged[4]):+.3f}"
    )
    opt_alie = made[f"opt_alie-{three}"]
    assert set(_refused_by_round(made[f"opt_alie-{three}"])) == {"0", "1", "2"}
    assert all("times their size" in opt_alie["rejections"][number]["site-nih-2"] for number in ("1", "2"))
    late = f"sign_flip_late-{three}"
    assert not _refused_by_round(made[late])
    clean = suite.lowest_margin(made[late], suite.clean_of(current, made[late]))
    assert f"ends {alone(late):+.3f} from the honest sites alone ({clean:+.3f} from the clean run)" in page
    copied, copied_before = made[f"mimic_noised-{four}"], before[f"mimic_noised-{four}"]
    assert not copied["rejected"] and copied_before["rejected"] == ["site-chexpert-2", "site-nih-1"]
    cost = suite.lowest_margin(copied, suite.clean_of(current, copied))
    assert f"{suite.lowest_margin(copied_before, suite.clean_of(before, copied_before)):+.3f}" == f"{cost:+.3f}"
    assert (
        f"and costs {cost:+.3f} against the clean run as before ({alone(f'mimic_noised-{four}'):+.3f} against the "
        "honest sites alone)"
    ) in page
    earlier = json.loads((REPOSITORY / "docs" / "attack-suite" / "direction-first-round.json").read_text())[
        "first_round"
    ]
    for name in (f"sign_flip-{three}", f"ipm-{three}"):  # the same rule on the AMD EPYC: the same to four places
        assert {site: f"{value:.4f}" for site, value in earlier[name]["best_auroc"].items()} == {
            site: f"{value:.4f}" for site, value in made[name]["best_auroc"].items()
        }
    assert "gave the same honest AUROCs to four places as stop 96's runs of the same rule on the AMD EPYC" in page
    worst = max(-alone(name) for name in judged)
    leaving = -suite.lowest_margin(suite.alone_of(current, made[judged[0]]), suite.clean_of(current, made[judged[0]]))
    assert f"cost the honest sites at most {worst:.3f} more without it after round 0" in page
    assert f"from a start whose third site is itself worth {leaving:.3f}" in page


def test_the_next_draws_from_the_stand_in_under_the_first_round_only_are_their_record():
    """docs/server-checks.md's stop 101 section: the next draws of three or more sites from the stand-in in order,
    none run before, under the direction check in the first round only: none stopped, left a site out, had a result
    refused or a harm flag; the sizes, the lowest cosine and the bounds (the README since stop 110 gives today's rules'
    unselected draws instead)."""
    command = [589, 590, 592, 593, 594, 595, 596, 597, 599, 600]
    ran, page = _wide_draws(FIRST_ROUND_COMMIT, range(589, 601), command, NEXT_STOP_AFTER,
                            record="stand-in-first-round.json")  # fmt: skip
    clean_sweep = load_benchmark("clean_sweep")
    assert all(
        run["direction_check"] == "first_round" and clean_sweep.out_of_sample(run["federation"]["name"], run)
        for run in ran.values()
    )
    sizes = sorted({len(run["federation"]["sites"]) for run in ran.values()})
    seven = sum(len(run["federation"]["sites"]) == 7 for run in ran.values())
    listed = ", ".join(map(str, sizes[:-1])) + f" and {sizes[-1]}" if len(sizes) > 1 else str(sizes[0])
    assert f"the first {len(ran)} of the {len(command)} ({listed} sites; {seven} of seven) started" in page
    assert f"and all {len(ran)} ran whole and published" in page
    _, (lowest, seed) = _unable_and_lowest(ran)
    (number,) = [number for number, sites in ran[seed]["directions"].items() if sites and min(sites.values()) == lowest]
    assert f"the robust aggregate was {lowest:.2f} (seed {seed}, round {number})" in page
    later = [(run["federation"]["seed"], cosine) for run in ran.values() for number, sites in run["directions"].items()
             if number != "0" for cosine in sites.values()]  # fmt: skip
    opposed = [seed for seed, cosine in later if cosine <= 0]
    assert (
        f"{len(opposed)} of the {len(later)} honest site-rounds after the first round came at or below 0 "
        f"({len(set(opposed))} of the {len(ran)} federations had one: what the rule every round would have refused)"
    ) in page
    (seed, number, site), *others = [(run["federation"]["seed"], number, site) for run in ran.values()
                                     for number, sites in run["directions"].items() if number != "0"
                                     for site, cosine in sites.items() if cosine <= 0]  # fmt: skip
    small = ran[seed]["federation"]["sites"][site]
    assert not others and small["kind"] == "nih"
    assert small["patients"] == min(drawn["patients"] for drawn in ran[seed]["federation"]["sites"].values())
    cosine = ran[seed]["directions"][number][site]
    assert (
        f"seed {seed}'s {site} in round {number} ({cosine:.2f}; {small['patients']} patients, the smallest of" in page
    )
    assert all(sites[site] > 0 for other, sites in ran[seed]["directions"].items() if other != number)
    assert all(cosine > 0 for run in ran.values() for cosine in run["directions"]["0"].values())  # the premise held
    assert "and the first round's premise held here too" in page
    such = [run for run in ran.values()
            if {site["kind"] for site in run["federation"]["sites"].values()} & {"padchest", "vindr"}]  # fmt: skip
    seven_such = sum(len(run["federation"]["sites"]) == 7 for run in such)
    assert f"Of these draws {len(such)} had a PadChest or VinDr site ({seven_such} of seven sites)." in page
    runs = json.loads((REPOSITORY / "docs" / "clean-sweep" / "stand-in-first-round.json").read_text())
    assert (
        f"0 of {len(ran)} with an honest site refused, at most {_bound_up(clean_sweep.upper_bound(0, len(ran)))}"
        in page
    )
    assert (
        f"with the three above, 0 of {len(runs)} (at most {_bound_up(clean_sweep.upper_bound(0, len(runs)))})" in page
    )
    assert not any(run["rejected"] for run in runs.values())


LATE_JOINER_COMMITS = STOP_102 = ("9444d7d", "1f33fc1")  # stop 102's runs: e5661f9's server, the suite's roles after it
BEFORE_STOP_102 = "091c35b"  # the code that judged direction in the job's first round only


def _refused_by_round(run: dict) -> dict[str, list[str]]:
    return {number: sorted(sites) for number, sites in run["rejections"].items() if sites}


def test_a_site_that_misses_the_first_round_is_judged_when_it_comes_as_its_record_says():
    """docs/server-checks.md's stop 102 section: ``sign_flip_absent`` (its first round's result broken, then flipping)
    refused on arrival in round 0 and by direction in round 1 only, at three, four and seven sites, holding; on the
    code before, refused in round 0 only; the honest late joiner judged in round 1 and never refused after round 0;
    and the rate the page gives for such a judgment of an honest site, from the clean sweeps' later rounds."""
    suite, clean_sweep = load_benchmark("attack_suite"), load_benchmark("clean_sweep")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    record = json.loads((REPOSITORY / "docs" / "attack-suite" / "late-joiners.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    absent = sorted((run for run in runs.values() if run["attack"] == "sign_flip_absent"), key=lambda run: run["sites"])
    joiners = sorted(record["late_joiner"].values(), key=lambda run: run["sites"])
    assert [run["sites"] for run in absent] == [run["sites"] for run in joiners] == [3, 4, 7]
    made = [*absent, *joiners]
    assert all(run["commit"].startswith(LATE_JOINER_COMMITS) and run["direction_check"] == "first_round"
               and run["start"] == "stand-in" and run["exit_code"] == 0 for run in made)  # fmt: skip
    seconds = [run["seconds"] for run in made]
    assert f"commits {' and '.join(LATE_JOINER_COMMITS)}, whose server code is e5661f9's" in page
    assert f"{min(seconds):.0f} to {max(seconds):.0f} s a run on this task's Intel Xeon;" in page
    cosines, margins = [], []
    for run in absent:
        (attacker,) = run["attacking_sites"]
        assert _refused_by_round(run) == {"0": [attacker], "1": [attacker]}
        assert "non-finite" in run["rejections"]["0"][attacker]
        assert "points against the round's consensus" in run["rejections"]["1"][attacker]
        cosines.append(re.search(r"cosine (-?[0-9.]+) with", run["rejections"]["1"][attacker]).group(1))
        for reference in (suite.clean_of(runs, run), suite.alone_of(runs, run)):
            assert suite.verdict(run, reference) == "holds"
        margins.append(f"{suite.lowest_margin(run, suite.alone_of(runs, run)):+.3f}")
    assert (
        f"it was refused in round 1 by direction at three, four and seven sites (cosines {', '.join(cosines)} with "
        f"the robust aggregate) and accepted, clipped, in round 2 (judged once); all {len(absent)} hold, against the "
        f"clean run and the honest sites alone ({', '.join(margins)} from the honest sites alone)"
    ) in page
    (before,) = record["sign_flip_absent_before_stop_102"].values()
    assert before["commit"].startswith(BEFORE_STOP_102) and before["sites"] == 3
    assert _refused_by_round(before) == {"0": before["attacking_sites"]}
    assert (
        f"refused in round 0 only (the broken result) and never after, and ended "
        f"{suite.lowest_margin(before, suite.alone_of(runs, before)):+.3f} from the honest sites alone"
    ) in page
    first, joined = [], []
    for run in joiners:
        (site,) = run["attacking_sites"]
        assert _refused_by_round(run) == {"0": [site]} and "non-finite" in run["rejections"]["0"][site]
        assert site not in run["directions"]["0"] and all(site in run["directions"][n] for n in ("1", "2"))
        first.append(f"{run['directions']['1'][site]:.2f}")
        joined.append(f"{suite.lowest_margin(run, suite.alone_of(runs, run)):+.3f}")
        assert suite.verdict(run, suite.clean_of(runs, run)) == "holds"
    assert (
        f"The honest late joiner was judged in round 1 and accepted at all three sizes (cosines {', '.join(first)}); "
        f"none of its results was refused after round 0, and the other honest sites ended {', '.join(joined)} from "
        "the honest sites alone"
    ) in page
    later = _later_round_cosines(_honest_later_rounds_from_the_stand_in())
    opposed = sum(cosine <= 0 for cosine in later)
    bound = _bound_up(clean_sweep.upper_bound(opposed, len(later)))
    assert (
        f"in {opposed} of the {len(later)} honest later-round site-rounds recorded (stop 100's table and stop 101's "
        f"next draws), {100 * opposed / len(later):.1f} %, at most {bound}"
    ) in page
    rows = {run["sites"]: suite.verdict(run, suite.alone_of(runs, run)) for run in runs.values()
            if run["attack"] == "label_flip_late" and run.get("start") == "stand-in" and run["sites"] >= 3}  # fmt: skip
    assert rows == {3: "holds", 4: "holds", 7: "holds"}
    assert "as `label_flip_late` does, which holds from the stand-in at three, four and seven sites" in page


STOP_102_ATTACKS = {  # the stand-in's rows stop 101 left open: (--settings, --rounds) -> attacks
    ("7:2", 3): ("sign_flip", "ipm"),
    ("4:1", 3): ("sign_flip_late", "opt_ipm", "opt_alie"),
    ("7:1", 3): ("sign_flip_late", "opt_ipm", "opt_alie"),
    ("3:1", 8): ("sign_flip", "sign_flip_late"),
}


def test_the_attacks_stop_101_left_open_from_the_stand_in_are_their_record():
    """docs/server-checks.md's stop 102 section: two attackers of seven, the late and optimised attacks at four and
    seven sites and three attacks over eight rounds, from the stand-in under the first-round direction check: the
    command's runs, each one's verdicts against the clean run and the honest sites alone, and who was refused when."""
    suite = load_benchmark("attack_suite")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    made = {}
    for (setting, rounds), attacks in STOP_102_ATTACKS.items():
        sites, attackers = setting.split(":")
        size = "" if rounds == suite.ROUNDS else f"-{suite.PATIENTS}p{rounds}r"
        for attack in attacks:
            made[attack, setting, rounds] = runs[f"{attack}-{sites}sites-{attackers}attackers-seed1{size}-stand-in"]
    assert all(run["commit"].startswith(LATE_JOINER_COMMITS[-1]) and run["direction_check"] == "first_round"
               and run["exit_code"] == 0 and not run["excluded"] for run in made.values())  # fmt: skip
    seconds = [run["seconds"] for run in made.values()]
    assert f"commit {LATE_JOINER_COMMITS[-1]}, {min(seconds):.0f} to {max(seconds):.0f} s a run" in page
    for run in made.values():  # each against its own references: eight rounds against eight rounds
        assert suite._size(suite.clean_of(runs, run)) == suite._size(run) == suite._size(suite.alone_of(runs, run))
    verdicts = {key: (suite.verdict(run, suite.clean_of(runs, run)), suite.verdict(run, suite.alone_of(runs, run)))
                for key, run in made.items()}  # fmt: skip
    held = [key for key, pair in verdicts.items() if pair == ("holds", "holds")]
    assert f"{len(held)} of the {len(made)} hold against the clean run and against the honest sites alone" in page
    worst = min(suite.lowest_margin(run, suite.alone_of(runs, run)) for run in made.values())
    assert f"the lowest {worst:+.3f} from the honest sites alone" in page

    assert all(set(run["rejected"]) <= set(run["attacking_sites"]) for run in made.values())  # no honest site

    def refused(key: tuple) -> str:
        rounds = list(_refused_by_round(made[key]))
        return "never" if not rounds else f"in round{'s' * (len(rounds) > 1)} " + ", ".join(rounds)

    listed = "; ".join(f"`{attack}` at {setting}{'' if rounds == suite.ROUNDS else f' over {rounds} rounds'} "
                       f"{refused((attack, setting, rounds))}" for attack, setting, rounds in made)  # fmt: skip
    assert f"No honest site's result was refused; the attackers' were: {listed}." in page
    eight, three = made["sign_flip", "3:1", 8], runs["sign_flip-3sites-1attackers-seed1-stand-in"]
    (attacker,) = eight["attacking_sites"]
    pulls = [sites[attacker] for sites in eight["directions"].values()]
    assert len(pulls) == 8 and max(pulls) < 0
    late = made["sign_flip_late", "3:1", 8]
    (flipper,) = late["attacking_sites"]
    assert late["directions"]["0"][flipper] > 0 and all(late["directions"][str(n)][flipper] < 0 for n in range(1, 8))
    assert (
        f"Over eight rounds `sign_flip`, refused in round 0 and accepted, clipped, in the seven after (its cosine "
        f"{min(pulls):.2f} to {max(pulls):.2f} every round), cost the honest sites "
        f"{suite.lowest_margin(eight, suite.alone_of(runs, eight)):+.3f} against the honest sites alone, where over "
        f"three rounds it cost {suite.lowest_margin(three, suite.alone_of(runs, three)):+.3f}"
    ) in page
    assert (
        f"`sign_flip_late`, honest in round 0 ({late['directions']['0'][flipper]:.2f}) and flipping in every round "
        f"after, ended {suite.lowest_margin(late, suite.alone_of(runs, late)):+.3f}."
    ) in page


BEFORE_STOP_103 = "209b638"  # the first-round direction check without the running opposition
STOP_103 = "bf08b81"  # the running opposition's runs: 2a8f0ad's server, the suite's records of each round's opposition
AT_STOP_103 = (BEFORE_STOP_103, STOP_103)  # stop 103's runs: its references ran on the code before
TWELVE_ROUNDS = ("sign_flip", "sign_flip_late", "sign_flip_persistent")


def _honest_later_rounds_from_the_stand_in() -> list[dict]:
    """The clean sweep's federations of three or more sites from the stand-in whose later rounds the page counts:
    stop 100's table and stop 101's next draws."""
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    wide = [run for run in json.loads((sweeps / "stand-in.json").read_text()).values()
            if len(run["federation"]["sites"]) >= 3]  # fmt: skip
    drawn, _ = _wide_draws(FIRST_ROUND_COMMIT, range(589, 601), [589, 590, 592, 593, 594, 595, 596, 597, 599, 600],
                           NEXT_STOP_AFTER, record="stand-in-first-round.json")  # fmt: skip
    return [*wide, *drawn.values()]


def _later_round_cosines(runs: list[dict]) -> list[float]:
    """Every site's cosine with the consensus in the rounds after the first, over ``runs``."""
    return [cosine for run in runs for number, sites in run["directions"].items() if number != "0"
            for cosine in sites.values()]  # fmt: skip


def test_the_running_opposition_is_its_record():
    """docs/server-checks.md's stop 103 section: twelve rounds of the flippers on the code before (accepted, clipped,
    after round 0) and under the running opposition (refused in every round after their judgment), the reader of the
    rule, its reference value from the clean sweep's later rounds, and its replay on the honest and hostile records."""
    suite, clean_sweep = load_benchmark("attack_suite"), load_benchmark("clean_sweep")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    before = json.loads((REPOSITORY / "docs" / "attack-suite" / "running-opposition.json").read_text())[
        "before_stop_103"
    ]
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    size = f"-{suite.PATIENTS}p12r"
    old = {run["attack"]: run for run in before.values()}
    new = {attack: runs[f"{attack}-3sites-1attackers-seed1{size}-stand-in"] for attack in TWELVE_ROUNDS}
    references = [runs[f"{name}-3sites-{n}attackers-seed1{size}-stand-in"] for name, n in (("clean", 0),
                  ("honest_alone", 1))]  # fmt: skip
    assert sorted(old) == ["sign_flip", "sign_flip_late"]
    assert all(run["commit"].startswith(BEFORE_STOP_103) for run in [*old.values(), *references])
    assert all(run["commit"].startswith(STOP_103) for run in new.values())
    made = [*old.values(), *new.values(), *references]
    assert all(run["direction_check"] == "first_round" and run["exit_code"] == 0 and run["job_rounds"] == 12
               and not run["excluded"] for run in made)  # fmt: skip
    for run in [*old.values(), *new.values()]:
        assert suite._size(suite.clean_of(runs, run)) == suite._size(run) == suite._size(suite.alone_of(runs, run))
    seconds = [run["seconds"] for run in [*old.values(), *references]]
    assert (
        f"commit {BEFORE_STOP_103}, {min(seconds):.0f} to {max(seconds):.0f} s a run on this task's Intel Xeon" in page
    )
    flip, late = old["sign_flip"], old["sign_flip_late"]
    (attacker,) = flip["attacking_sites"]
    assert _refused_by_round(flip) == {"0": [attacker]} and _refused_by_round(late) == {}
    pulls = [flip["directions"][str(n)][attacker] for n in range(1, 12)]
    alone = suite.alone_of(runs, flip)
    assert (
        f"refused in round 0 and accepted, clipped, in the eleven rounds after at cosines of {min(pulls):.2f} to "
        f"{max(pulls):.2f}, it ended {suite.lowest_margin(flip, alone):+.3f} from the honest sites alone "
        f"({suite.lowest_margin(flip, suite.clean_of(runs, flip)):+.3f} from the clean run), and `sign_flip_late` "
        f"{suite.lowest_margin(late, alone):+.3f}"
    ) in page

    honest = _honest_later_rounds_from_the_stand_in()
    later = _later_round_cosines(honest)
    assert (
        f"the honest sites' later-round opposition from the stand-in, -{sum(later) / len(later):.2f} (their cosines' "
        f"mean over the {len(later)} honest later-round site-rounds recorded"
    ) in page
    assert abs(0.25 - (1 - sum(later) / len(later)) / 2) < 0.01  # Page's reference value: halfway between the means
    assert f"adds is {-min(later) - 0.25:.2f} (its cosine {min(later):.2f})" in page
    replayed = [(value, run["federation"]["name"], int(number), site)
                for run in honest
                for number, sites in clean_sweep.replayed_opposition(run["directions"]).items()
                for site, value in sites.items()]  # fmt: skip
    highest, federation, number, site = max(replayed)
    assert highest <= 0.5 and federation == clean_sweep.CONSORTIUM and site == "site-padchest"
    assert (
        f"the highest running opposition an honest site reached was {highest:.2f} (the consortium job's PadChest "
        f"site, in round {number})"
    ) in page

    seconds = [run["seconds"] for run in new.values()]
    assert f"commit {STOP_103}, {min(seconds):.0f} to {max(seconds):.0f} s a run;" in page
    assert min(cosine for run in references for number, sites in run["directions"].items() if number != "0"
               for cosine in sites.values()) >= 0.40  # fmt: skip
    for run in new.values():
        assert set(run["rejected"]) <= set(run["attacking_sites"])  # no honest site
        assert all(
            suite.verdict(run, reference(runs, run)) == "holds" for reference in (suite.clean_of, suite.alone_of)
        )

    def margins(run: dict) -> str:
        return (f"{suite.lowest_margin(run, suite.alone_of(runs, run)):+.3f} from the honest sites alone "
                f"({suite.lowest_margin(run, suite.clean_of(runs, run)):+.3f} from the clean run)")  # fmt: skip

    flip, late, reader = (new[attack] for attack in TWELVE_ROUNDS)
    assert _refused_by_round(flip) == {str(n): [attacker] for n in range(12)}
    assert _refused_by_round(late) == {str(n): [attacker] for n in range(1, 12)}
    assert not _refused_by_round(reader)
    assert all(
        "running opposition" in run["rejections"][str(n)][attacker] for run in (flip, late) for n in range(1, 12)
    )
    assert (
        f"`sign_flip` was refused in every round, by direction in round 0 and by its running opposition after "
        f"({flip['opposition']['1'][attacker]:.2f} in round 1, {flip['opposition']['11'][attacker]:.2f} by round "
        f"11), and ended {margins(flip)}; `sign_flip_late`, judged in round 0 and flipping after, was refused in "
        f"rounds 1 to 11 ({late['opposition']['1'][attacker]:.2f}, then {late['opposition']['11'][attacker]:.2f}) "
        f"and ended {margins(late)}."
    ) in page
    for run in (flip, late):  # run before the cap and the carry: each flipped round alone takes it past the limit
        assert all(-run["directions"][str(n)][attacker] - 0.25 > 0.5 for n in range(1, 12))
        assert not any(2 * sum(cosine <= 0 for cosine in sites.values()) >= len(sites)
                       for sites in run["directions"].values())  # fmt: skip
    assert "These ran before the cap and the carry through rounds that are no one's (commit fdd25ee)" in page
    aimed = [reader["directions"][str(n)][attacker] for n in range(1, 12)]
    rows = [reader["shared_rows"][str(n)][attacker]["cosine"] for n in range(1, 12)]
    assert all(reader["opposition"][str(n)][attacker] == 0 for n in range(1, 12))
    assert (
        f"its backbone update's cosine with the round's consensus came to {min(aimed):+.2f} to {max(aimed):+.2f}, "
        f"not the -0.20 it aimed at with the honest sites' mean"
    ) in page
    assert (
        f"its flipped head rows read {min(rows):.2f} to {max(rows):.2f} against theirs, and it ended {margins(reader)}"
        in page
    )

    hostile, pulls = [], []
    for name, run in runs.items():
        if not run.get("commit", "").startswith(STOP_102[-1]) or run["direction_check"] != "first_round":
            continue
        replayed = clean_sweep.replayed_opposition(run["directions"])
        assert all(value == 0 for sites in replayed.values() for site, value in sites.items()
                   if site not in run["attacking_sites"])  # fmt: skip
        for attacker in run["attacking_sites"]:
            measured = [
                number for number in sorted(run["directions"], key=int) if attacker in run["directions"][number]
            ]
            accepted = [number for number in measured[1:] if attacker not in run["rejections"].get(number, {})]
            if accepted:
                hostile.append(name)
                pulls += [run["directions"][number][attacker] for number in accepted]
                refused = [number for number, sites in replayed.items() if sites.get(attacker, 0) > 0.5]
                assert refused == measured[1:]  # from its first round after its judgment
    assert (
        f"each of the {len(hostile)} attackers of {len(set(hostile))} runs accepted after its judged round (cosines "
        f"{min(pulls):.2f} to {max(pulls):.2f} in those rounds) would have been refused from the first round after it"
    ) in page


RUNNING_OPPOSITION_SEEDS = [623, 626, 627, 638]  # the first draws after 600 with a PadChest or VinDr site among seven


def test_the_running_opposition_on_draws_it_was_not_set_on_is_their_record():
    """docs/server-checks.md's stop 103 section, out of sample: the first four draws after seed 600 with a PadChest or
    VinDr site among seven sites, from the stand-in under the running opposition: each whole, published, nothing
    refused, stopped or left out; each honest site's running opposition and later-round cosines as quoted; the
    table."""
    clean_sweep = load_benchmark("clean_sweep")
    drawn = {seed: list(clean_sweep.draw(seed).sites) for seed in range(601, 700)}
    chosen = [seed for seed, sites in drawn.items()
              if len(sites) == 7 and any(kind in site for site in sites for kind in ("padchest", "vindr"))]  # fmt: skip
    assert chosen[:4] == RUNNING_OPPOSITION_SEEDS
    record = json.loads((REPOSITORY / "docs" / "clean-sweep" / "stand-in-running-opposition.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert sorted(run["federation"]["seed"] for run in record.values()) == RUNNING_OPPOSITION_SEEDS
    runs = list(record.values())
    assert all(run["commit"].startswith(STOP_103) and run["direction_check"] == "first_round"
               and run["federation"]["start"] == "stand-in" and len(run["directions"]) == run["federation"]["rounds"]
               and not run["rejected"] and not any(run["excluded"].values()) for run in runs)  # fmt: skip
    stopped = {run["federation"]["seed"]: run for run in runs if run["exit_code"] != 0}
    assert list(stopped) == [626] and all(run["published"] for run in runs if run["exit_code"] == 0)
    bar = stopped[626]
    assert not bar["published"] and bar["stopped"].startswith("no trained global model was judged at least as good")
    figures = bar["validations"]
    single = [site for site in bar["federation"]["sites"] if "siim" in site or "rsna" in site]
    assert all(figures[number][site]["val_loss"] > figures["-1"][site]["val_loss"]
               for number in ("0", "1", "2") for site in single)  # fmt: skip
    rises = [figures[number][site]["val_mean_auroc"] for number in ("0", "1", "2") for site in single]
    starts = [figures["-1"][site]["val_mean_auroc"] for site in single]
    recalibrated = [figures["0"][site]["val_recalibrated_loss_minus_start"] for site in single]
    assert all(figures["-1"][site]["local_val_loss"] < figures["-1"][site]["val_loss"] for site in single)  # vetoes
    assert (
        f"while their mean validation AUROC rose from {min(starts):.2f}-{max(starts):.2f} to {min(rises):.2f}-"
        f"{max(rises):.2f}, and recalibrated in the large their round-0 loss fell ({max(recalibrated):.2f} to "
        f"{min(recalibrated):.2f} against the stand-in"
    ) in page
    first, second = (
        [f"{figures[number][site]['val_loss']:.2f}" for number in ("-1", "0", "1", "2")] for site in single[:2]
    )
    assert (
        f"({single[0]} {first[1]}, {first[2]} and {first[3]} against {first[0]}; {single[1]} {second[1]}, "
        f"{second[2]}, {second[3]} against {second[0]})"
    ) in page
    assert (
        f"An honest federation stopped: 1 of these 4 (at most {_bound_up(clean_sweep.upper_bound(1, len(runs)))})"
    ) in page
    seconds = [run["seconds"] for run in runs]
    assert (
        f"--seeds {' '.join(map(str, RUNNING_OPPOSITION_SEEDS))}`, commit {STOP_103}, {min(seconds):.0f} to "
        f"{max(seconds):.0f} s each on this task's Intel Xeon"
    ) in page
    highest = max((value, run["federation"]["seed"], site) for run in runs for sites in run["opposition"].values()
                  for site, value in sites.items())  # fmt: skip
    assert highest[0] < 0.5
    for run in runs:  # the replay gives what the server recorded
        replayed = clean_sweep.replayed_opposition(run["directions"])
        assert {number: {site: round(value, 4) for site, value in sites.items()}
                for number, sites in replayed.items() if sites} == {
            number: sites for number, sites in run["opposition"].items() if sites}  # fmt: skip
    later = [(cosine, run["federation"]["seed"], site) for run in runs for number, sites in run["directions"].items()
             if number != "0" for site, cosine in sites.items()]  # fmt: skip
    lowest, seed, site = min(later)
    assert (highest[1], highest[2]) == (seed, site)
    opposed = sum(cosine <= 0 for cosine, *_ in later)
    sites = sum(len(run["federation"]["sites"]) for run in runs)
    assert (
        f"the lowest cosine of an honest update with the consensus after the first round was {lowest:.2f} ({site} of "
        f"seed {seed}), {opposed} of the {len(later)} honest later-round site-rounds came at or below 0, and the "
        f"highest running opposition was {highest[0]:.2f} (the same site, after that round): 0 of the {sites} honest "
        f"sites refused by it (at most "
        f"{_bound_up(clean_sweep.upper_bound(0, sites))}, exact one-sided 95 %)"
    ) in page
    table = _marked_block(REPOSITORY / "docs" / "server-checks.md", "clean-sweep-running-opposition")
    assert table == "\n".join(clean_sweep.table(record))


ONE_FINDING_RECORD = "stand-in-one-finding-sites.json"  # stop 105: the consortium job as the README runs it, the
# next draws with half their sites of one finding
STOP_104 = "7db6e37"  # the bar on recalibrated losses where the model ranks a site's images no worse: its runs
RECALIBRATED_BAR_SEEDS = [706, 708, 722, 723]  # the first draws after 700 with half their sites of one finding or more
STOP_113 = "6b48c32"  # the stand-in suite's gaps at four and seven sites, today's rules: its runs in the table
REFERENCES_RERUN_RECORD = "stand-in-references-rerun.json"  # stop 113's reference runs again, their records' figures
# the records added after stop 104's replay (its page counts the records before them)
AFTER_STOP_104 = frozenset(  # stop 107's, stop 108's, stop 110's, stop 112's, stop 113's and stop 114's
    [
        f"clean-sweep/{ONE_FINDING_RECORD}",
        "attack-suite/glyph-tuned.json",
        "attack-suite/glyph-seed2.json",
        "clean-sweep/stand-in-unselected.json",
        "clean-sweep/stand-in-twelve-rounds.json",
        f"attack-suite/{REFERENCES_RERUN_RECORD}",
        "attack-suite/two-flippers.json",
        "clean-sweep/warmup-rounds-split.json",
    ]
)


def test_the_initial_models_bar_on_recalibrated_losses_is_its_record():
    """docs/server-checks.md's stop 104 section: seed 626 run again (the same figures, past the bar now), the first
    four draws after seed 700 with half their sites or more of one finding (each whole, published, nothing refused or
    left out), the replay of every record under the bar before and after, and the table."""
    clean_sweep = load_benchmark("clean_sweep")
    drawn = {seed: list(clean_sweep.draw(seed).sites) for seed in range(701, 800)}
    one_finding = [seed for seed, sites in drawn.items()
                   if 2 * sum("siim" in site or "rsna" in site for site in sites) >= len(sites)]  # fmt: skip
    assert one_finding[:4] == RECALIBRATED_BAR_SEEDS
    sweeps = REPOSITORY / "docs" / "clean-sweep"
    record = json.loads((sweeps / "stand-in-recalibrated-bar.json").read_text())
    runs = {run["federation"]["seed"]: run for run in record.values()}
    assert sorted(runs) == [626, *RECALIBRATED_BAR_SEEDS]
    for seed, run in runs.items():
        assert run["commit"].startswith(STOP_104) and run["federation"]["start"] == "stand-in"
        assert run["exit_code"] == 0 and run["published"] and not run["rejected"]
        assert not any(run["excluded"].values()) and len(run["validations"]) == run["federation"]["rounds"] + 1
        assert clean_sweep.out_of_sample(f"sweep-{seed}", run) == (seed != 626)  # 626 chose the rule
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    before = json.loads((sweeps / "stand-in-running-opposition.json").read_text())["sweep-626"]
    again = runs[626]
    assert again["validations"] == before["validations"] and again["directions"] == before["directions"]
    assert "every figure of its record is the same as stop 103's run" in page
    assert _first_past_the_bar(before, True) is None and _first_past_the_bar(again, RECALIBRATED_BAR) == 0
    figures = again["validations"]
    initial = figures["-1"]
    counted = recalibrated_changes(figures["0"], figures["0"], initial)
    sites = sorted(figures["0"])
    as_they_are = {site: figures["0"][site]["val_loss"] - initial[site]["val_loss"] for site in sites}
    stood = [site for site in sites if site not in counted]
    weighed = changes_against_the_bar(_judging_losses(again, 0), initial, START_TIE, vetoes=True, recalibrated=counted)
    ranked = ", ".join(
        f"{figures['0'][site]['val_mean_auroc']:.2f} against {initial[site]['local_val_mean_auroc']:.2f}"
        for site in stood
    )
    first = counted["site-1-siim"], as_they_are["site-1-siim"]
    lowered = sum(counted[site] < as_they_are[site] for site in counted)
    assert (
        f"{len(counted)} of the {len(sites)} sites qualified for their recalibrated change, and it was the lower for "
        f"{lowered} (site-1-siim's {first[0]:.2f} for "
        f"{first[1]:+.2f} as it is); the model ranked the images of {stood[0]} and {stood[1]} below their own models "
        f"(AUROC {ranked}), so their changes stood as they were ({as_they_are[stood[0]]:.2f}, "
        f"{as_they_are[stood[1]]:+.2f}), and the median change was {judged_loss(weighed[0])[0]:.2f}"
    ) in page
    seconds = [run["seconds"] for run in runs.values()]
    assert (
        f"--seeds 626 708 722 723 706`, commit {STOP_104}, {min(seconds):.0f} to {max(seconds):.0f} s each on this "
        "task's Intel Xeon"
    ) in page
    fresh = [runs[seed] for seed in RECALIBRATED_BAR_SEEDS]
    assert max(value for run in runs.values() for sites in run["opposition"].values() for value in sites.values()) == 0
    assert all(_first_past_the_bar(run, True) is not None for run in fresh)  # the bar before would have stopped none
    firsts = {seed: (_first_past_the_bar(runs[seed], True), _first_past_the_bar(runs[seed], RECALIBRATED_BAR))
              for seed in RECALIBRATED_BAR_SEEDS}  # fmt: skip
    assert firsts == {706: (1, 0), 708: (0, 0), 722: (1, 0), 723: (0, 0)}
    single = [site for site in runs[706]["federation"]["sites"] if "siim" in site or "rsna" in site]
    starts = [runs[706]["validations"]["-1"][site]["val_loss"] for site in single]
    rises = [runs[706]["validations"]["0"][site]["val_loss"] for site in single]
    assert (
        f"0 of 4 stopped (at most {_bound_up(clean_sweep.upper_bound(0, len(fresh)))})" in page
        and f"(706: {len(single)} sites of one finding, their losses up from {min(starts):.2f}-{max(starts):.2f} to "
        f"{min(rises):.2f}-{max(rises):.2f} in round 0)".replace("706: 4 sites", "706: four sites")
        in page
    )
    # every record, replayed under the bar before and after
    replayed = _replayable_runs()
    changed = [(file, name, _first_past_the_bar(run, True), _first_past_the_bar(run, RECALIBRATED_BAR))
               for file, name, run in replayed]  # fmt: skip
    changed = [entry for entry in changed if entry[2] != entry[3]]
    assert sorted(changed) == [
        ("clean-sweep/stand-in-recalibrated-bar.json", "sweep-626", None, 0),
        ("clean-sweep/stand-in-recalibrated-bar.json", "sweep-706", 1, 0),
        ("clean-sweep/stand-in-recalibrated-bar.json", "sweep-722", 1, 0),
        ("clean-sweep/stand-in-running-opposition.json", "sweep-626", None, 0),
        ("clean-sweep/stand-in.json", "sweep-524", 1, 0),
        ("clean-sweep/stand-in.json", "sweep-591", 1, 0),
    ]
    readable = [file for file, _, run in replayed
                if any("val_recalibrated_loss" in one for one in run["validations"].get("0", {}).values())]  # fmt: skip
    attacks = sum(file.startswith("attack-suite/") for file in readable)
    assert (
        f"(the {len(replayed)} runs of" in page
        and f"these included; {len(readable)} of them keep the round-0 recalibrated figures it reads, {attacks} of "
        "those attack runs), the first model past the bar moves in "
        + f"{len(changed)} of them"
        in page
    )
    paired = sum(_best_round(run, True, True) != _best_round(run, False, True) for *_, run in replayed)
    assert f"Replayed, it picks another best round in {paired} of the {len(replayed)} runs" in page
    assert all(_best_round(run, True, True) == _best_round(run, False, True) for run in runs.values())
    table = _marked_block(REPOSITORY / "docs" / "server-checks.md", "clean-sweep-recalibrated-bar")
    assert table == "\n".join(clean_sweep.table(record))


STOP_105 = "ac96d92"  # the consortium job from the stand-in: its run and the next draws with one-finding sites


def test_the_consortium_job_from_the_stand_in_and_the_next_one_finding_draws_are_their_record():
    """docs/server-checks.md's stop 105 section: the consortium job as the README runs it now (from the stand-in):
    the same figures as stop 101's run of it, its bar, opposition and best; then the next draws after seed 723 with
    half their sites or more of one finding, in order (each whole, published, nothing refused or left out), what the
    bar before stop 104 and the choice of the best on the losses as they are would have done on their records, the
    server's best round as the paired rule replays it, and the table."""
    clean_sweep = load_benchmark("clean_sweep")
    record = json.loads((REPOSITORY / "docs" / "clean-sweep" / ONE_FINDING_RECORD).read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert _marked_block(REPOSITORY / "docs" / "server-checks.md", "clean-sweep-one-finding-sites") == "\n".join(
        clean_sweep.table(record)
    )
    for run in record.values():
        assert run["commit"].startswith(STOP_105) and run["federation"]["start"] == "stand-in"
        assert run["exit_code"] == 0 and run["published"] and not run["rejected"] and not any(run["excluded"].values())
        assert len(run["validations"]) == run["federation"]["rounds"] + 1
        assert run["best_round"] == _best_round(run, True, True)  # the server chose what the paired rule replays
    # the consortium job
    consortium = record[clean_sweep.CONSORTIUM]
    before = json.loads((REPOSITORY / "docs" / "clean-sweep" / "stand-in-first-round.json").read_text())
    assert consortium["validations"] == before[clean_sweep.CONSORTIUM]["validations"]
    assert consortium["directions"] == before[clean_sweep.CONSORTIUM]["directions"]
    assert not clean_sweep.out_of_sample(clean_sweep.CONSORTIUM, consortium)  # it chose the first-round check
    assert f"--seeds`, commit {STOP_105}, {consortium['seconds']:.0f} s on this task's Intel Xeon;" in page
    figures = consortium["validations"]
    initial = figures["-1"]
    counted = recalibrated_changes(figures["0"], figures["0"], initial)
    weighed = changes_against_the_bar(
        _judging_losses(consortium, 0), initial, START_TIE, vetoes=True, recalibrated=counted
    )
    siim = figures["0"]["site-siim"]["val_loss"] - initial["site-siim"]["val_loss"]
    assert _first_past_the_bar(consortium, True) == 0 == _first_past_the_bar(consortium, RECALIBRATED_BAR)
    assert (
        f"round 0's model past the initial model's bar (the median change {judged_loss(weighed[0])[0]:.2f}; "
        f"{len(counted)} of the 7 sites qualified for their recalibrated change, SIIM's {counted['site-siim']:.2f} for "
        f"{siim:+.2f} as it is; the bar before would have passed it too)"
    ) in page
    opposition = [(value, site, int(number)) for number, sites in consortium["opposition"].items()
                  for site, value in sites.items()]  # fmt: skip
    highest, site, number = max(opposition)
    assert (site, number) == ("site-padchest", 2)
    assert f"the highest running opposition {highest:.2f} (PadChest, round 2, where the limit is 0.5)" in page
    mean = np.mean([one["val_mean_auroc"] for one in figures[str(consortium["best_round"])].values()])
    assert consortium["best_round"] == 2
    assert f"round 2's model the best (the sites' mean validation AUROC {mean:.3f})" in page
    # the next draws
    drawn = {seed: list(clean_sweep.draw(seed).sites) for seed in range(724, 900)}
    one_finding = [seed for seed, sites in drawn.items()
                   if 2 * sum("siim" in site or "rsna" in site for site in sites) >= len(sites)]  # fmt: skip
    runs = {run["federation"]["seed"]: run for name, run in record.items() if name != clean_sweep.CONSORTIUM}
    assert sorted(runs) == one_finding[: len(runs)] and all(
        clean_sweep.out_of_sample(f"sweep-{s}", runs[s]) for s in runs
    )
    seconds = [run["seconds"] for run in runs.values()]
    two = " ".join(str(seed) for seed in sorted(runs) if len(drawn[seed]) == 2)
    more = " ".join(str(seed) for seed in sorted(runs) if len(drawn[seed]) > 2)
    assert (
        f"--seeds {more} --stop-starting-after 4200`, then `--seeds {two}`, the two-site draws of that span, which a "
        f"filter the rule does not have had left out at first; commit {STOP_105}, {min(seconds):.0f} to "
        f"{max(seconds):.0f} s each on this task's Intel Xeon" in page
    )
    highest = max(value for run in runs.values() for sites in run["opposition"].values() for value in sites.values())
    fresh = len(runs) + len(RECALIBRATED_BAR_SEEDS)
    assert (
        f"All {len(runs)} ran every round and published; none left a site out, none had a result refused, and the "
        f"highest running opposition was {highest:.2f}: 0 of {len(runs)} stopped (at most "
        f"{_bound_up(clean_sweep.upper_bound(0, len(runs)))}); with stop 104's four, 0 of {fresh} (at most "
        f"{_bound_up(clean_sweep.upper_bound(0, fresh))})" in page
    )
    stopped_before = [seed for seed, run in runs.items() if _first_past_the_bar(run, True) is None]
    moved = [seed for seed, run in runs.items()
             if _first_past_the_bar(run, True) != _first_past_the_bar(run, RECALIBRATED_BAR)]  # fmt: skip
    assert f"the bar before stop 104 would have stopped {len(stopped_before)} of them and, against today's," in page
    assert f"would have moved the first model past the bar in {len(moved)}" in page
    # the one it rescued: a two-site draw whose one-finding site's loss rose as its AUROC did
    assert stopped_before == moved == [772] and runs[772]["best_round"] == 0 == _first_past_the_bar(
        runs[772], RECALIBRATED_BAR
    )
    run, rsna, nih = runs[772], "site-1-rsna", "site-2-nih"
    start, first = run["validations"]["-1"], run["validations"]["0"]
    counted = recalibrated_changes(first, first, start)
    plain = changes_against_the_bar(_judging_losses(run, 0), start, START_TIE, vetoes=True)
    weighed = changes_against_the_bar(_judging_losses(run, 0), start, START_TIE, vetoes=True, recalibrated=counted)
    sizes = run["federation"]["sites"]
    assert (
        f"seed 772, an RSNA site of {sizes[rsna]['patients']} patients and a NIH site of {sizes[nih]['patients']}, "
        f"whose RSNA site's loss rose from {start[rsna]['val_loss']:.2f} to {first[rsna]['val_loss']:.2f} in round 0 "
        f"while its AUROC rose from {start[rsna]['val_mean_auroc']:.2f} to {first[rsna]['val_mean_auroc']:.2f}, so "
        f"that the mean of the two sites' changes was {judged_loss(plain[0])[0]:+.4f}; recalibrated, the RSNA site's "
        f"change is {counted[rsna]:+.3f}, the mean {judged_loss(weighed[0])[0]:+.3f}, and round 0's model passed and "
        f"was published (the RSNA site still finds it worse than the start, recalibrated too: the NIH site's "
        f"{plain[0][nih]:+.2f} carries the mean). It is the first draw the rule rescued that did not choose it" in page
    )
    assert counted[rsna] > 0 > plain[0][nih]
    assert judged_loss(plain[0])[0] > 0 > judged_loss(weighed[0])[0]
    unpaired = {seed: _best_round(run, False, True) for seed, run in runs.items()}
    other = {
        seed: (run["best_round"], unpaired[seed]) for seed, run in runs.items() if unpaired[seed] != run["best_round"]
    }
    assert (
        f"on the losses as they are it would have picked another round in {len(other)} of them ("
        + "; ".join(
            f"seed {seed}: the paired rule round {chosen}, the losses round {theirs}"
            for seed, (chosen, theirs) in other.items()
        )
        + ")"
    ) in page

    def median_loss(run: dict, number: int) -> float:
        return float(np.median([one["val_loss"] for one in run["validations"][str(number)].values()]))

    def mean_auroc(run: dict, number: int) -> float:
        return float(np.mean([one["val_mean_auroc"] for one in run["validations"][str(number)].values()]))

    rise = [
        median_loss(runs[seed], chosen) - median_loss(runs[seed], theirs) for seed, (chosen, theirs) in other.items()
    ]
    gap = [mean_auroc(runs[seed], chosen) - mean_auroc(runs[seed], theirs) for seed, (chosen, theirs) in other.items()]
    assert min(rise) > 0
    assert (
        f"higher median validation loss than the one the losses pick (by {min(rise):.4f} to {max(rise):.4f}), and "
        f"its sites' mean validation AUROC differs by {min(gap):+.3f} to {max(gap):+.3f}, lower in "
        f"{sum(value < 0 for value in gap)} of the {len(gap)}."
    ) in page


def _site_counts(sites: list[int]) -> str:
    """How many federations had each number of sites, as the page writes it ("4 of two sites, 4 of three and 12 of
    four")."""
    words = {2: "two sites", 3: "three", 4: "four", 7: "seven"}
    counts = [f"{sites.count(k)} of {words[k]}" for k in load_benchmark("clean_sweep").SITE_COUNTS if k in sites]
    return ", ".join(counts[:-1]) + f" and {counts[-1]}" if len(counts) > 1 else counts[0]


UNSELECTED_RECORD = "stand-in-unselected.json"  # stop 110: the draws from seed 900 on, in order, under today's rules
STOP_110 = "6c091da"
FIRST_UNSELECTED = 900  # the first seed after the last any sweep had used (866)
STOP_111 = "815563f"  # stop 110's server and rules: only the benchmark's reading of records changed since 6c091da
FIRST_OF_STOP_111 = 915  # stop 111 ran on, in order, from the seed after stop 110's last
HELD_BACK_FIRST_MODEL = "sweep-928"  # the one draw whose round 0 model the initial model's bar held back


def test_todays_rules_on_unselected_draws_are_their_record():
    """docs/server-checks.md's stop 110-111 section: the draws from seed 900 on, in order, none left out, each as drawn,
    whole and published, nothing refused or left out; their count by sites and scheme, the exact bounds (with stop
    105's draws), the consortium job's largest differences from stop 105's run, each rule's closest approach as the
    page gives it, the one first model the bar held back, the table, the plot and the README's sentence."""
    clean_sweep = load_benchmark("clean_sweep")
    record = json.loads((REPOSITORY / "docs" / "clean-sweep" / UNSELECTED_RECORD).read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert _marked_block(REPOSITORY / "docs" / "server-checks.md", "clean-sweep-unselected") == "\n".join(
        clean_sweep.table(record)
    )
    runs = {run["federation"]["seed"]: run for name, run in record.items() if name != clean_sweep.CONSORTIUM}
    assert sorted(runs) == list(range(FIRST_UNSELECTED, FIRST_UNSELECTED + len(runs)))  # in order, none left out
    for seed, run in runs.items():
        drawn = clean_sweep.replace(clean_sweep.draw(seed), start="stand-in")
        assert run["federation"] == json.loads(json.dumps(clean_sweep.asdict(drawn)))
        assert clean_sweep.out_of_sample(f"sweep-{seed}", run)
    for name, run in record.items():
        later = name != clean_sweep.CONSORTIUM and run["federation"]["seed"] >= FIRST_OF_STOP_111
        ran_at = STOP_111 if later else STOP_110
        assert run["commit"].startswith(ran_at) and run["federation"]["start"] == "stand-in"
        assert run["exit_code"] == 0 and run["published"] and not run["rejected"] and not any(run["excluded"].values())
        assert len(run["validations"]) == run["federation"]["rounds"] + 1
        assert sorted(run["validation_sizes"]) == sorted(run["federation"]["sites"])  # read again from the logs
        assert run["best_round"] == _best_round(run, True, True)
    consortium = record[clean_sweep.CONSORTIUM]
    stop_105 = json.loads((REPOSITORY / "docs" / "clean-sweep" / ONE_FINDING_RECORD).read_text())
    before = stop_105[clean_sweep.CONSORTIUM]  # another CPU: the same figures, summed in another order
    assert consortium["best_round"] == before["best_round"] == 2
    assert not clean_sweep.out_of_sample(clean_sweep.CONSORTIUM, consortium)
    seconds = [run["seconds"] for seed, run in runs.items() if seed < FIRST_OF_STOP_111]
    seconds_on = [run["seconds"] for seed, run in runs.items() if seed >= FIRST_OF_STOP_111]
    assert seconds and seconds_on
    sites = [len(run["federation"]["sites"]) for run in runs.values()]
    public = sum(run["federation"]["scheme"] == "public" for run in runs.values())
    counts = _site_counts(sites)
    chosen = [run for name, run in stop_105.items() if name != clean_sweep.CONSORTIUM]  # stop 105's draws
    assert all(run["commit"].startswith(STOP_105) for run in chosen)
    total = len(runs) + len(chosen)
    earlier = [run["federation"]["seed"] for path in (REPOSITORY / "docs" / "clean-sweep").glob("*.json")
               if path.name not in (UNSELECTED_RECORD, TWELVE_ROUNDS_RECORD, WARMUP_SPLIT_RECORD)  # later draws
               for run in json.loads(path.read_text()).values()
               if isinstance(run, dict) and "federation" in run]  # fmt: skip
    assert max(earlier) == 866 and "after the last seed any sweep had used (866), from seed 900 on" in page
    assert "the last draws taken in order ran at stop 101 (seeds 589-596, the 7 of three or more sites" in page
    assert (
        f"commit {STOP_110}, {min(seconds):.0f} to {max(seconds):.0f} s a federation on this task's 2-core AMD EPYC"
        in page
    )
    assert (
        f"which skips the seeds stored; commit {STOP_111}, whose server, jobs and rules are {STOP_110}'s), "
        f"{min(seconds_on):.0f} to {max(seconds_on):.0f} s a federation on the same machine: seeds "
        f"{FIRST_OF_STOP_111}-{max(runs)}" in page
    )
    assert (
        f"In all, {len(runs)} federations: {counts}; {public} of public label schemes, "
        f"{len(runs) - public} dealt from NIH's findings. All {len(runs)} ran every round and published; none stopped, "
        f"left a site out or had a result refused: **0 of {len(runs)} (at most "
        f"{_bound_up(clean_sweep.upper_bound(0, len(runs)))}, exact one-sided 95 %)**; with stop 105's {len(chosen)} "
        f"draws of half their sites of one finding, chosen for that case, under the same rules: 0 of {total} (at most "
        f"{_bound_up(clean_sweep.upper_bound(0, total))}, a bound on that mixture" in page
    )
    approaches = {name: clean_sweep.closest_approaches(run) for name, run in record.items()}

    def values(key: str) -> list[float]:
        return [one[key] for one in approaches.values() if one[key] is not None]

    bars = values("bar")
    assert len(bars) == len(record) and all(run["bars"] and min(run["bars"], key=int) == "0" for run in record.values())
    assert (
        f"the lowest cosine of a judged site's backbone update with its round's consensus was "
        f"{min(values('direction')):.2f} (refused at 0 or below); the lowest mean cosine of a site's five or more "
        f"shared rows in the warm-up round {min(values('warmup_rows')):.2f} (left out at 0 or below); the highest "
        f"running opposition {max(values('opposition')):.2f} (refused above 0.5); the two-site federations' "
        f"first-round backbone cosines {min(values('two_site_backbone')):.3f} to {max(values('two_site_backbone')):.3f}"
        f" (stopped at -0.5 or below) and, where they share five or more rows ({len(values('two_site_rows'))} of the "
        f"{len(values('two_site_backbone'))}), their shared rows' mean cosine {min(values('two_site_rows')):.3f} to "
        f"{max(values('two_site_rows')):.3f} (stopped at 0 or below); the harm test's highest z "
        f"{-max(values('harm')):.1f} below the z a flag needs" in page
    )
    crossed = {(name, rule) for name, one in approaches.items() for rule, (_, threshold, side) in
               clean_sweep.APPROACHES.items() if one[rule] is not None
               and (one[rule] <= threshold if side == "below" else one[rule] > threshold)}  # fmt: skip
    assert crossed == {(HELD_BACK_FIRST_MODEL, "bar")}  # the only rule any draw crossed
    held_back = {name for name, _ in crossed}
    passed = [one["bar"] for name, one in approaches.items() if name not in held_back]
    assert (
        f"the initial model's bar passed in round 0 in every federation but one, by a judged change of "
        f"{min(passed):.2f} to {max(passed):.2f} (its model passes at 0 or below)" in page
    )
    assert all(one["harm"] < 0 for one in approaches.values())
    held = record[HELD_BACK_FIRST_MODEL]  # two sites: the bar is the mean of their changes against the initial model
    first, start = held["validations"]["0"], held["validations"]["-1"]
    siim, padchest = first["site-2-siim"], first["site-1-padchest"]
    assert sorted(first) == sorted(held["federation"]["sites"]) == ["site-1-padchest", "site-2-siim"]
    assert held["bars"]["0"] == pytest.approx((siim["val_loss_minus_start"] + padchest["val_loss_minus_start"]) / 2)
    assert siim["val_mean_auroc"] < start["site-2-siim"]["local_val_mean_auroc"]  # so its recalibrated change is out
    assert siim["val_recalibrated_loss_minus_start"] < 0
    assert -siim["val_auroc_minus_own"] < siim["val_auroc_minus_own_se"]  # within its noise
    assert held["best_round"] == 1 and held["published"] and held["bars"]["1"] < 0
    losses = {number: judged_loss({site: one["val_loss"] for site, one in sites.items()})[0]
              for number, sites in held["validations"].items() if number != "-1"}  # fmt: skip
    assert min(losses, key=losses.get) == "1"
    assert (
        f"the bar held back its round 0's model at +{held['bars']['0']:.3f}, the mean of PadChest's change of loss "
        f"against the initial model ({padchest['val_loss_minus_start']:.3f}) and SIIM's "
        f"(+{siim['val_loss_minus_start']:.3f}: a loss of {siim['val_loss']:.2f} against the start's "
        f"{start['site-2-siim']['val_loss']:.2f}, while its AUROC rose from "
        f"{start['site-2-siim']['val_mean_auroc']:.2f} to {siim['val_mean_auroc']:.2f}). SIIM's recalibrated change "
        f"({siim['val_recalibrated_loss_minus_start']:.3f}) did not count" in page
    )
    assert (
        f"and {siim['val_mean_auroc']:.3f} was {-siim['val_auroc_minus_own']:.3f} below its own "
        f"{start['site-2-siim']['local_val_mean_auroc']:.3f}, within one standard error of that difference "
        f"({siim['val_auroc_minus_own_se']:.3f}). The job went on; round 1 passed the bar ({held['bars']['1']:.2f}) "
        f"and was published, the round whose judged loss (the mean of the two sites') is lowest of the three "
        f"({losses['1']:.2f} against {losses['0']:.2f} and {losses['2']:.2f})" in page
    )
    assert (
        f"So the bar held back an honest first model in 1 of the {len(runs)} draws nobody chose (at most "
        f"{_bound_up(clean_sweep.upper_bound(1, len(runs)))}, exact one-sided 95 %), the only rule any draw crossed"
        in page
    )
    assert f"On the {len(runs)} draws nobody chose, today's rules stopped, refused and left out no honest site" in page
    lowest, seed = min((one["direction"], name) for name, one in approaches.items() if one["direction"] is not None)
    among_draws = min((one["direction"], run) for run, one in approaches.items() if one["direction"] is not None
                      and run != clean_sweep.CONSORTIUM)  # fmt: skip
    assert seed == clean_sweep.CONSORTIUM and consortium["directions"]["0"]["site-rsna"] == lowest
    assert (
        f"the smallest cosine margin was the in-sample consortium job's RSNA site's first-round direction "
        f"({lowest:.2f}, where 0 refuses; "
        f"among the unselected draws {among_draws[0]:.2f}, seed {among_draws[1].removeprefix('sweep-')})" in page
    )
    auroc = max(abs(consortium["validations"][number][site]["val_mean_auroc"] - one["val_mean_auroc"])
                for number, sites in before["validations"].items() for site, one in sites.items())  # fmt: skip
    cosine = max(abs(consortium["directions"][number][site] - value)
                 for number, sites in before["directions"].items() for site, value in sites.items())  # fmt: skip
    assert (
        f"every site's mean validation AUROC within {_rounded_up(auroc, 4)} of stop 105's run and every direction "
        f"cosine within {_rounded_up(cosine, 4)}, on another CPU" in page
    )
    assert (REPOSITORY / "docs" / "clean-sweep" / "stand-in-unselected.png").is_file()
    assert "](clean-sweep/stand-in-unselected.png)" in page
    assert (
        "Under [today's rules](docs/server-checks.md#todays-rules-on-unselected-draws), from the stand-in: 0 of "
        f"{len(runs)} new draws taken in order stopped, left a site out or "
        f"refused a result (at most {_bound_up(clean_sweep.upper_bound(0, len(runs)))}, exact one-sided 95 %)"
        in " ".join(_readme().split())
    )


TWELVE_ROUNDS_RECORD = "stand-in-twelve-rounds.json"  # stop 112: the same draws, each run for the main job's 12 rounds
STOP_112 = "75ae0eb"  # 6c091da's server, jobs and rules; the benchmark's --rounds added


def test_todays_rules_at_the_main_jobs_length_are_their_record():
    """docs/server-checks.md's stop 112 section: the draws from seed 900 on, in order, none left out, each as drawn
    but for its 12 rounds (the main job's length), every round run, whole and published, nothing refused or left
    out; each one's first 3 or 5 rounds the same to the bit as its run of that length (stop 110-111's record), so
    what is new is the rounds after; the counts, the bound, the rounds whose model was published, the rules met
    every round, round by round, as the page gives them, the table, both plots and the README's sentence."""
    clean_sweep = load_benchmark("clean_sweep")
    record = json.loads((REPOSITORY / "docs" / "clean-sweep" / TWELVE_ROUNDS_RECORD).read_text())
    shorter = json.loads((REPOSITORY / "docs" / "clean-sweep" / UNSELECTED_RECORD).read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert _marked_block(REPOSITORY / "docs" / "server-checks.md", "clean-sweep-twelve-rounds") == "\n".join(
        clean_sweep.table(record)
    )
    runs = {run["federation"]["seed"]: run for run in record.values()}
    assert sorted(runs) == list(range(FIRST_UNSELECTED, FIRST_UNSELECTED + len(runs)))  # in order, none left out
    length = clean_sweep.DEMO.rounds
    assert length == 12  # the main job's, nih_chexpert's
    drawn_rounds = {}
    for seed, run in runs.items():
        drawn = clean_sweep.draw(seed)
        assert run["federation"] == json.loads(
            json.dumps(clean_sweep.asdict(clean_sweep.replace(drawn, start="stand-in", rounds=length)))
        )
        assert clean_sweep.out_of_sample(f"sweep-{seed}", run)
        assert run["commit"].startswith(STOP_112)
        assert run["exit_code"] == 0 and run["published"] and not run["rejected"] and not any(run["excluded"].values())
        assert len(run["validations"]) == length + 1  # every round, and the initial model's
        assert sorted(run["validation_sizes"]) == sorted(run["federation"]["sites"])
        assert run["best_round"] == _best_round(run, True, True)
        before = shorter[f"sweep-{seed}"]  # the same federation, run for its drawn 3 or 5 rounds
        drawn_rounds[seed] = drawn.rounds
        for number in range(-1, drawn.rounds):  # to the bit: every figure of every site
            assert run["validations"][str(number)] == before["validations"][str(number)]
        for number in range(drawn.rounds):
            assert run["directions"][str(number)] == before["directions"][str(number)]
    seconds = [run["seconds"] for run in runs.values()]
    sites = [len(run["federation"]["sites"]) for run in runs.values()]
    public = sum(run["federation"]["scheme"] == "public" for run in runs.values())
    counts = _site_counts(sites)
    assert (
        f"--stop-starting-after 5700`, commit {STOP_112}, whose server, jobs and rules are {STOP_110}'s; "
        f"{min(seconds):.0f} to {max(seconds):.0f} s a federation on this task's 2-core AMD EPYC" in page
    )
    assert f"its time allowed seeds {min(runs)}-{max(runs)}" in page
    bound = _bound_up(clean_sweep.upper_bound(0, len(runs)))
    assert (
        f"In all, {len(runs)} federations: {counts}; {public} of public label schemes, {len(runs) - public} dealt "
        f"from NIH's findings. All {len(runs)} ran their {length} rounds and published; none stopped, left a site out "
        f"or had a result refused: **0 of {len(runs)} (at most {bound}, exact one-sided 95 %)**" in page
    )
    listed = "; ".join(
        f"seed {seed}: round {run['best_round']}, where its {drawn_rounds[seed]} drawn rounds published round "
        f"{shorter[f'sweep-{seed}']['best_round']}"
        for seed, run in runs.items()
    )
    later_best = [seed for seed, run in runs.items() if run["best_round"] >= drawn_rounds[seed]]
    assert (
        f"judged a round after the drawn length better in {len(later_best)} of the {len(runs)} ({listed}); by the "
        "sites' mean validation AUROC the later best was within" in page
    )

    def mean_auroc(run: dict, number: int) -> float:
        return float(np.mean([one["val_mean_auroc"] for one in run["validations"][str(number)].values()]))

    gaps = {seed: mean_auroc(run, run["best_round"]) - mean_auroc(run, shorter[f"sweep-{seed}"]["best_round"])
            for seed, run in runs.items()}  # fmt: skip
    lowered = [str(seed) for seed, gap in gaps.items() if gap < 0]
    assert (
        f"the later best was within {_rounded_up(max(map(abs, gaps.values())), 3)} of the drawn one, lower in "
        f"{len(lowered)} (seeds {' and '.join(lowered)})" in page
    )
    for run in runs.values():  # the best flags as the server raised them: the last is the published model's round
        assert run["best_rounds"] == sorted(run["best_rounds"]) and run["best_rounds"][-1] == run["best_round"]
    patience = clean_sweep.DEMO.patience
    early = {seed: end for seed, run in runs.items() if (end := clean_sweep.ends_early(run, patience)) is not None}
    then = {seed: max(best for best in runs[seed]["best_rounds"] if best <= end) for seed, end in early.items()}
    ended = "; ".join(f"seed {seed} after round {end}, publishing round {then[seed]}" for seed, end in early.items())
    still_later = len(runs) - sum(then[seed] < drawn_rounds[seed] for seed in early)
    assert (
        f"Under the main job's patience ({patience} judged rounds in a row without a new best, replayed on each "
        f"record by `clean_sweep.ends_early`) {len(early)} of the {len(runs)} would have ended early ({ended}), the "
        f"others run every round, so a round after the drawn length would be published in {still_later} of the "
        f"{len(runs)}" in page
    )
    for seed, run in runs.items():  # the first-round rules: the shorter runs' to the digit
        again, before = clean_sweep.closest_approaches(run), clean_sweep.closest_approaches(shorter[f"sweep-{seed}"])
        assert all(again[rule] == before[rule] for rule in ("direction", "warmup_rows", "bar"))
    flat = clean_sweep.approaches_by_round(runs[903])["harm"]
    floor = [number for number, value in flat.items() if value == min(flat.values())]
    rsna = runs[903]["validation_sizes"]["site-4-rsna"]
    for number in floor:
        found = judging.auroc_harm_of(runs[903]["validations"][str(number)]["site-4-rsna"], rsna)
        assert found.z == -4.0 and found.error == judging.AUROC_SE_FLOOR_SD / math.sqrt(rsna)
    assert len(floor) >= 5 and f"{min(flat.values()):.1f}".startswith("-7.8")
    assert (
        f"seed 903's flat stretch near -7.8 is its RSNA site's ranking test, the same z (-4.0) in each of those "
        f"rounds: its {rsna} validation images put its standard error at the floor the server allows" in page
    )
    by_round = {seed: clean_sweep.approaches_by_round(run) for seed, run in runs.items()}

    def highest(rule: str, later: bool) -> float:
        return max(value for seed, rules in by_round.items() for number, value in rules[rule].items()
                   if (number >= drawn_rounds[seed]) == later)  # fmt: skip

    # with three or more sites one flag is kept on record, not acted on: a published run may cross; the page says below
    assert highest("harm", True) < 0 and highest("harm", False) < 0  # no flag at either length
    assert (
        "at either length no test flagged a site or left one out), so what is new is the "
        f"{sum(length - drawn for drawn in drawn_rounds.values())} rounds after the drawn lengths" in page
    )
    assert (
        f"the harm test's highest z in the rounds after the drawn length was {-highest('harm', True):.1f} below the z "
        f"a flag needs ({-highest('harm', False):.1f} in the drawn rounds, both at the level of a 12-round job)" in page
    )
    nearer = highest("harm", True) - highest("harm", False)
    assert (
        f"the highest running opposition {highest('opposition', True):.2f} after the drawn length "
        f"({highest('opposition', False):.2f} before; refused above {clean_sweep.OPPOSITION_LIMIT}): the later rounds "
        + (
            f"came {nearer:.1f} nearer a flag than the drawn ones"
            if nearer >= 0.05
            else "came as near a flag as the drawn ones, to a tenth of a z"
            if nearer > -0.05
            else "came no nearer a flag"
        )
        + (", and no site's opposition rose in them" if highest("opposition", True) == 0 else ", and a site's")
        in page
    )
    for plot in ("stand-in-twelve-rounds.png", "stand-in-twelve-rounds-by-round.png"):
        assert (REPOSITORY / "docs" / "clean-sweep" / plot).is_file() and f"](clean-sweep/{plot})" in page


TWO_FLIPPERS_COMMIT = "78748f2"  # stop 114: two label flippers of seven under the warm-up rows rule in passes
TWO_FLIPPERS_RAN = ("label_flip",)  # in docs/attack-suite/two-flippers.json
WARMUP_SPLIT_RECORD = "warmup-rounds-split.json"  # stop 114: clean federations' first round under today's rule
WARMUP_SPLIT_COMMIT = "59ba3a8"
STOP_113_RAN = 6  # of the two-attacker gaps, those stop 113's time ran (stop 114 ran the rest: the same commit)
STOP_113_GAPS = {  # the catalogue's attacks the stand-in's rows lacked before stop 113: (sites, attackers) -> attacks
    (4, 1): ("ipm", "inf", "gaussian", "mimic", "label_flip_quiet", "bn_inflate"),
    (7, 1): ("backdoor_boosted", "bn_inflate", "gaussian", "inf", "label_flip_quiet", "mimic"),
    (7, 2): ("alie", "mimic_noised", "label_flip_late", "label_flip", "opt_alie", "opt_ipm", "backdoor", "mimic",
             "label_flip_quiet", "inf", "gaussian", "backdoor_boosted", "bn_inflate"),
}  # fmt: skip


def test_the_rest_of_the_catalogue_from_the_stand_in_is_its_record():
    """docs/server-checks.md's stop 113 paragraphs: the catalogue's attacks the stand-in's rows lacked, run under
    today's rules into the table (two attackers of seven: those the session's time ran, in the order given); the
    references run again (four sites: their records to the bit; seven: the final model to the bit and the best a later
    round, every verdict the same against it); each run's figures as the page quotes them."""
    suite = load_benchmark("attack_suite")
    folder = REPOSITORY / "docs" / "attack-suite"
    runs = json.loads((folder / "results.json").read_text())
    rerun = json.loads((folder / REFERENCES_RERUN_RECORD).read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    made = {name: run for name, run in runs.items() if run.get("commit", "").startswith(STOP_113)}
    assert all(run["start"] == "stand-in" and run["seed"] == 1 and suite._size(run)[:2] == (100, 3)
               and run["machine"].startswith("AMD EPYC") for run in [*made.values(), *rerun.values()])  # fmt: skip
    ran = {setting: [run["attack"] for run in made.values() if suite.setting_of(run) == setting] for setting in
           ("4 (1; from the stand-in)", "7 (1; from the stand-in)", "7 (2; from the stand-in)")}  # fmt: skip
    assert ran["4 (1; from the stand-in)"] == [suite.PLACEBO, *STOP_113_GAPS[(4, 1)]]
    assert ran["7 (1; from the stand-in)"] == [suite.PLACEBO, *STOP_113_GAPS[(7, 1)]]
    pairs = ran["7 (2; from the stand-in)"]
    assert pairs == list(STOP_113_GAPS[(7, 2)][: len(pairs)]) and len(made) == 14 + len(pairs)  # in the order given
    for sites in (3, 4, 7):  # the whole catalogue from the stand-in, one attacker, 100 patients, 3 rounds
        present = {run["attack"] for run in runs.values() if run.get("start") == "stand-in" and run["sites"] == sites
                   and run["attackers"] == 1 and suite._size(run)[:2] == (100, 3)}  # fmt: skip
        assert set(suite.ATTACKS) <= present, sites
    # the references again: four sites to the bit; seven sites' final model to the bit, its best another round
    four = ("clean-4sites-0attackers-seed1-stand-in", "honest_alone-4sites-1attackers-seed1-stand-in")
    seven = "clean-7sites-0attackers-seed1-stand-in"
    assert set(rerun) == {*four, seven} and all(run["commit"].startswith(STOP_113) for run in rerun.values())
    final = ("final_auroc", "final_backdoor_success", "exit_code", "rejected", "excluded", "rounds", "published")
    for name in four:
        assert all(rerun[name][key] == runs[name][key] for key in (*final, "best_auroc", "best_backdoor_success"))
    assert all(rerun[seven][key] == runs[seven][key] for key in final)
    assert rerun[seven]["best_auroc"] == rerun[seven]["final_auroc"] != runs[seven]["best_auroc"]
    assert (
        f"the honest sites' lowest best AUROC {min(rerun[seven]['best_auroc'].values()):.3f} against the record's "
        f"{min(runs[seven]['best_auroc'].values()):.3f}" in page
    )
    today = {**runs, seven: rerun[seven]}
    moved, shift = 0.0, 0.0  # the largest change of an AUROC margin, of a backdoor's success above the reference's
    for run in made.values():
        assert suite.verdict(run, suite.clean_of(today, run)) == suite.verdict(run, suite.clean_of(runs, run))
        moved = max(moved, abs(suite.lowest_margin(run, suite.clean_of(today, run))
                               - suite.lowest_margin(run, suite.clean_of(runs, run))))  # fmt: skip
        if run["attack"].startswith("backdoor"):
            shift = max(shift, abs(suite.backdoor_above(run, suite.clean_of(today, run))
                                   - suite.backdoor_above(run, suite.clean_of(runs, run))))  # fmt: skip
    assert (
        f"no AUROC margin moves by more than {math.ceil(moved * 1e4) / 1e4:.4f} and no backdoor's success above the "
        f"clean model's by more than {math.ceil(shift * 1e3) / 1e3:.3f}" in page
    )
    gaps = [", ".join(f"`{attack}`" for attack in STOP_113_GAPS[setting]) for setting in ((4, 1), (7, 1))]
    assert f"six attacks of the catalogue at four sites ({gaps[0]}), six at seven ({gaps[1]})" in page
    earlier = sorted(run["attack"] for name, run in runs.items() if run.get("start") == "stand-in"
                     and suite.setting_of(run) == "7 (2; from the stand-in)" and name not in made
                     and run["attack"] not in (*suite.REFERENCES, suite.PLACEBO))  # fmt: skip
    assert f"with two attackers of seven, all but {' and '.join(f'`{attack}`' for attack in earlier)}." in page
    assert f"(commit {STOP_113}, on this task's 2-core AMD EPYC beside nothing else;" in page
    assert (
        "--settings 4:1 --start stand-in --attacks " + " ".join(STOP_113_GAPS[(4, 1)]) + "` with the clean run"
    ) in page
    assert (
        "--settings 7:1 --start stand-in --references placebo --attacks "
        + " ".join(STOP_113_GAPS[(7, 1)])
        + "` with the clean run"
    ) in page
    # the commands and their seconds
    for setting, quoted in (("4 (1; from the stand-in)", "with the clean run, the honest sites alone and a placebo"),
                            ("7 (1; from the stand-in)", "with the clean run and a placebo")):  # fmt: skip
        seconds = [run["seconds"] for run in made.values() if suite.setting_of(run) == setting]
        seconds += [run["seconds"] for run in rerun.values() if f"{run['sites']} (1" in setting]
        assert f"{quoted} ({round(min(seconds))} to {round(max(seconds))} s a run)" in page
    for run in made.values():  # with one attacker: each holds against both references, or did not take
        if run["attackers"] == 1:
            expected = "did not take" if run["attack"] == "backdoor_boosted" else "holds"
            assert suite.verdict(run, suite.clean_of(runs, run)) == expected
            assert suite.verdict(run, suite.alone_of(runs, run)) == expected

    def of(sites: int, attack: str) -> dict:
        return runs[f"{attack}-{sites}sites-1attackers-seed1-stand-in"]

    def margin(run: dict, find=suite.clean_of, references: dict = runs) -> str:
        return f"{suite.lowest_margin(run, find(references, run)):+.3f}"

    def rounds(run: dict) -> list[str]:  # the rounds that refused the attacker
        return [number for number, found in run["rejections"].items() if found]

    left_out = ("ipm", "inf", "gaussian", "label_flip_quiet")  # refused every round or left out in the first
    for sites in (4, 7):
        for attack in [attack for attack in left_out if attack in STOP_113_GAPS[(sites, 1)]]:
            run, alone = of(sites, attack), suite.alone_of(runs, of(sites, attack))
            assert run["best_auroc"] == alone["best_auroc"] and run["final_auroc"] == alone["final_auroc"]
            assert rounds(run) == (["0"] if attack == "label_flip_quiet" else ["0", "1", "2"])
            assert run["excluded"] == (run["attacking_sites"] if attack == "label_flip_quiet" else [])
        assert len({margin(of(sites, attack)) for attack in left_out if attack in STOP_113_GAPS[(sites, 1)]}) == 1
    assert f"each ends at the honest sites alone to the bit, {margin(of(4, 'ipm'))} from the clean run" in page
    assert f"and end at the honest sites alone to the bit, {margin(of(7, 'inf'))} from the clean run" in page
    said = [why for found in of(4, "ipm")["rejections"].values() for why in found.values()]
    cosine = re.search(r"cosine (-?[\d.]+) with the robust aggregate\)", said[0]).group(1)
    opposed = [re.search(r"running opposition ([\d.]+) above", why).group(1) for why in said[1:]]
    assert f"cosine {cosine} with the robust aggregate, then by its running opposition, {' and '.join(opposed)})" in (
        page
    )
    sizes = {re.search(r"backbone weights is ([\d.]+) times their size; this federation accepts at most (\d+)",
                       why).group(1, 2)
             for found in of(4, "gaussian")["rejections"].values() for why in found.values()}  # fmt: skip
    assert len(sizes) == 1  # the same every round
    ((size, bound),) = sizes
    assert f"its backbone update {size} times their size, where one round may bring at most {bound}" in page
    shared = [re.search(r"updates of the (\d+) head rows .*mean cosine (-?[\d.]+)", why).group(1, 2)
              for sites in (4, 7) for why in of(sites, "label_flip_quiet")["rejections"]["0"].values()]  # fmt: skip
    assert f"its {shared[0][0]} shared head rows' mean cosine {shared[0][1]} with their consensus" in page
    assert f"(`label_flip_quiet`'s {shared[1][0]} shared rows at {shared[1][1]})" in page
    copied = of(4, "mimic")
    assert rounds(copied) == [] and copied["excluded"] == []  # never refused
    assert f"cost {margin(copied)} ({margin(copied, suite.alone_of)} against the honest sites alone)" in page
    assert f"`mimic` cost {margin(of(7, 'mimic'))};" in page
    for references, sites in ((runs, 4), (today, 7)):  # FedBN+: the sites keep their BatchNorm statistics
        inflated, clean = of(sites, "bn_inflate"), suite.clean_of(references, of(sites, "bn_inflate"))
        assert all(inflated[kind][site] == clean[kind][site] for kind in ("best_auroc", "final_auroc")
                   for site in inflated["best_auroc"])  # fmt: skip
    assert (
        f"`bn_inflate` is today's clean run to the bit ({margin(of(7, 'bn_inflate'))} against the record, whose best "
        "model is another round's)" in page
    )
    placebos = [runs[f"placebo-{sites}sites-1attackers-seed1-stand-in"] for sites in (4, 7)]
    assert f"the placebo moved the honest sites by {margin(placebos[0])}." in page
    assert f"the placebo moved them by {margin(placebos[1])}." in page
    boosted, clean = of(7, "backdoor_boosted"), runs[seven]

    assert boosted["best_backdoor_success"] == boosted["final_backdoor_success"] and rounds(boosted) == ["2"]
    assert (
        "its attacker's own model scored the trigger at "
        f"{_percent(boosted['attackers_own_backdoor_success']['site-nih-4'])} and the global models at "
        f"{_percent(boosted['best_backdoor_success'])}, against the clean model's "
        f"{_percent(clean['best_backdoor_success'])} (best) and {_percent(clean['final_backdoor_success'])} (final)"
        in page
    )
    rows = re.findall(r"head row of '([^']+)'", boosted["rejections"]["2"]["site-nih-4"])
    bound = re.search(r"update_bound \((\d+)\)", boosted["rejections"]["2"]["site-nih-4"]).group(1)
    assert (
        f"its results were refused in round {rounds(boosted)[0]} (its {' and '.join(rows)} head rows more than {bound} "
        "times the typical accepted update)" in page
    )
    triggered = 426  # the test set's Pneumothorax negatives, as the page counts them
    assert f"of {triggered} triggered negatives;" in page
    for value in (*boosted["attackers_own_backdoor_success"].values(), boosted["best_backdoor_success"],
                  clean["best_backdoor_success"], clean["final_backdoor_success"]):  # fmt: skip
        assert abs(value * triggered - round(value * triggered)) < 1e-9  # a count of those images
    # two attackers of seven: those the time ran, in the order given
    two = [run for run in made.values() if run["attackers"] == 2]
    verdicts = [(suite.verdict(run, suite.clean_of(runs, run)), suite.verdict(run, suite.alone_of(runs, run)))
                for run in two]  # fmt: skip
    held = sum(found == ("holds", "holds") for found in verdicts)
    assert all(set(run["rejected"]) | set(run["excluded"]) <= set(run["attacking_sites"]) for run in two)

    def span(part: list[dict]) -> str:
        seconds = [run["seconds"] for run in part]
        return f"{round(min(seconds))} to {round(max(seconds))} s a run"

    assert len(two) == len(STOP_113_GAPS[(7, 2)])  # every one ran: stop 113 the first ones, stop 114 the rest
    assert (
        f"of which stop 113's time ran the first {STOP_113_RAN} ({span(two[:STOP_113_RAN])}) and stop 114 the other "
        f"{len(two) - STOP_113_RAN} (the same command, code and machine, beside light work: a NumPy experiment at low "
        f"priority and unit tests; {span(two[STOP_113_RAN:])})." in page
    )
    untaken = [run for run, found in zip(two, verdicts, strict=True) if found == ("did not take", "did not take")]
    assert held + len(untaken) == len(two) and all(run["attack"].startswith("backdoor") for run in untaken)
    margins = "; ".join(f"`{run['attack']}` {margin(run)}, {margin(run, suite.alone_of)}" for run in two)
    assert (
        f"Of the {len(two)} run, {held} hold against the clean run and against the honest sites alone and the "
        f"{len(untaken)} backdoors did not take (the honest sites' largest loss against each: {margins}; against the "
        "clean run's record, as the table), and no honest site's result was refused or left out" in page
    )
    by_attack = {run["attack"]: run for run in two}
    never = ("alie", "mimic_noised", "label_flip_late", "mimic", "backdoor", "bn_inflate")
    assert all(rounds(by_attack[attack]) == [] for attack in never)
    assert f"{', '.join(f'`{attack}`' for attack in never[:-1])} and `{never[-1]}` were never refused" in page
    for attack in ("opt_alie", "opt_ipm", "inf", "gaussian"):  # both attackers refused every round
        found = by_attack[attack]["rejections"]
        assert all(set(found[number]) == set(by_attack[attack]["attacking_sites"]) for number in ("0", "1", "2"))
    assert all("times their size" in why for why in by_attack["opt_alie"]["rejections"]["1"].values())
    assert all("non-finite" in why for found in by_attack["inf"]["rejections"].values() for why in found.values())
    assert all(f"backbone weights is {size} times their size" in why
               for found in by_attack["gaussian"]["rejections"].values() for why in found.values())  # fmt: skip
    assert f"and `gaussian` every round (its backbone update {size} times their size)" in page
    inflated = by_attack["bn_inflate"]
    assert all(inflated[kind][site] == today[seven][kind][site] for kind in ("best_auroc", "final_auroc")
               for site in inflated["best_auroc"])  # fmt: skip
    assert "`bn_inflate` is today's clean run to the bit." in page
    quiet = by_attack["label_flip_quiet"]
    assert all(quiet[kind] == by_attack["label_flip"][kind] for kind in ("best_auroc", "final_auroc", "excluded"))
    backdoor, boosted_two = by_attack["backdoor"], by_attack["backdoor_boosted"]
    assert rounds(boosted_two) == ["2"] and set(boosted_two["rejections"]["2"]) == set(boosted_two["attacking_sites"])
    assert all("update_bound" in why for why in boosted_two["rejections"]["2"].values())
    assert boosted_two["best_backdoor_success"] == boosted_two["final_backdoor_success"]

    def own(run: dict) -> str:
        return " and ".join(_percent(run["attackers_own_backdoor_success"][site]) for site in run["attacking_sites"])

    assert (
        f"`backdoor`'s attackers' own models scored the trigger at {own(backdoor)} and the global models at "
        f"{_percent(backdoor['best_backdoor_success'])} (best) and {_percent(backdoor['final_backdoor_success'])} "
        f"(final), `backdoor_boosted`'s at {own(boosted_two)} and {_percent(boosted_two['best_backdoor_success'])} "
        f"(both attackers refused in round 2 by the update bound), against the clean model's "
        f"{_percent(clean['best_backdoor_success'])} and {_percent(clean['final_backdoor_success'])}, of {triggered} "
        "triggered negatives" in page
    )
    flipped = by_attack["label_flip"]
    assert rounds(flipped) == ["0"] and len(flipped["excluded"]) == 1 and flipped["rejected"] == flipped["excluded"]
    cosine = re.search(r"mean cosine (-?[\d.]+)", flipped["rejections"]["0"][flipped["excluded"][0]]).group(1)
    assert (
        f"(its shared rows' mean cosine {cosine}, just past the rule's line of 0, where `label_flip_quiet`, one "
        in page
    )
    assert f"flipper, read {shared[1][1]} at seven)" in page
    assert "Not run for want of time" not in page


def test_two_label_flippers_of_seven_on_synthetic_rows_are_the_record():
    """docs/server-checks.md's two label flippers of seven (stop 114), on synthetic rows: the table is its record's
    (docs/attack-suite/warmup-passes.json), its hardest setting computed again gives the record, and the sentences
    after it read the table."""
    passes = load_benchmark("warmup_passes")
    records = json.loads((REPOSITORY / "docs" / "attack-suite" / "warmup-passes.json").read_text())
    page = (REPOSITORY / "docs" / "server-checks.md").read_text()
    assert marked_block(page, passes.MARKER) == "\n".join(passes.table(records))
    assert [tuple(record[key] for key in ("flippers", "mode", "scale", "noise")) for record in records] == (
        passes.SETTINGS
    )
    assert records[-1] == passes.judged(*passes.SETTINGS[-1])  # colluding, twice the size, the noisier rows
    text = " ".join(page.split())
    before, today = passes.RULES
    assert all(record[today]["right"] == record["federations"] == 100 for record in records)
    assert all(record[before]["right"] == 100 for record in records if record["flippers"] == 1)
    apart = [record for record in records if record["flippers"] == 2 and record["mode"] == "apart"]
    assert all(record[before]["honest"] == 0 for record in apart)  # so a federation not right missed a flipper
    worst = min(apart, key=lambda record: record[before]["right"])
    assert worst["scale"] == 2 and (
        f"With two apart, stop 113's missed a flipper in up to {100 - worst[before]['right']} % of federations "
        "(flippers twice an honest site's size), today's in none" in text
    )
    colluding = [record for record in records if record["mode"] == "colluding"]
    caught = max(record[before]["flippers"] for record in colluding)
    honest = max(record[before]["honest"] for record in colluding)
    assert (
        f"colluding, stop 113's caught at most {caught} flippers of 200 and rejected up to {honest} honest sites of "
        "500, today's caught every flipper and no honest site" in text
    )


def test_two_label_flippers_of_seven_through_flare_are_the_record():
    """docs/server-checks.md's two label flippers of seven (stop 114) through FLARE: under today's warm-up rows rule
    both flippers go in round 0, the second in the second pass (no row splits in these runs), and the honest sites
    end at the honest sites alone, where stop 113's rule left one flipper in (docs/attack-suite/two-flippers.json);
    and stop 113's run as the section opens with it."""
    suite = load_benchmark("attack_suite")
    runs = json.loads((REPOSITORY / "docs" / "attack-suite" / "two-flippers.json").read_text())
    table = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    assert sorted(runs) == [f"{attack}-7sites-2attackers-seed1-stand-in" for attack in TWO_FLIPPERS_RAN]
    flipped = runs["label_flip-7sites-2attackers-seed1-stand-in"]
    before = table["label_flip-7sites-2attackers-seed1-stand-in"]  # stop 113's rule, the same federation and seeds
    for run in runs.values():
        assert run["commit"].startswith(TWO_FLIPPERS_COMMIT) and run["machine"].startswith("AMD EPYC")
        assert (run["sites"], run["attackers"], run["start"], run["seed"]) == (7, 2, "stand-in", 1)
        assert run["excluded"] == run["rejected"] == run["attacking_sites"] == ["site-nih-3", "site-nih-4"]
        assert [number for number, found in run["rejections"].items() if found] == ["0"]
        assert run["shared_rows"]["0"] == before["shared_rows"]["0"]  # the same updates, read alike
        assert all("split" not in figures for figures in run["shared_rows"]["0"].values())  # no row split
        assert run["exit_code"] == 0 and run["published"]
    first, second = (flipped["rejections"]["0"][site] for site in ("site-nih-3", "site-nih-4"))
    assert "judged again" not in first and "(judged again without the 1 site rejected before it)" in second
    cosines = [re.search(r"mean cosine (-?[\d.]+)", why).group(1) for why in (first, second)]
    read = before["shared_rows"]["0"]
    clean, alone = suite.clean_of(table, flipped), suite.alone_of(table, flipped)
    margins = [
        f"{suite.lowest_margin(run, reference):+.3f}" for run in (flipped, before) for reference in (clean, alone)
    ]
    assert (
        f"both flippers were left out in round 0: site-nih-3 in the first pass (mean cosine {cosines[0]}, as before), "
        f"site-nih-4 in the second, judged again without it ({cosines[1]}, where the first pass read it at "
        f"{read['site-nih-4']['mean_cosine']:+.2f})" in page
    )
    assert (
        f"The honest sites end {margins[0]} against the clean run and {margins[1]} against the honest sites alone, "
        f"where under stop 113's rule they ended {margins[2]} and {margins[3]}" in page
    )
    assert f"exit 0, published, {round(flipped['seconds'])} s" in page
    # stop 113's run, as the section opens: one flipper left out in round 0, the other accepted every round
    assert before["excluded"] == before["rejected"] == ["site-nih-3"]
    assert all(set(found) <= {"site-nih-3"} for found in before["rejections"].values())
    honest_nih = [read[site]["mean_cosine"] for site in ("site-nih-1", "site-nih-2")]
    one = table["label_flip-7sites-1attackers-seed1-stand-in"]["shared_rows"]["0"]  # one flipper of seven
    alike = sorted(one[site]["mean_cosine"] for site in one if site.startswith("site-nih") and site != "site-nih-4")
    assert (
        f"in the warm-up round one read {read['site-nih-3']['mean_cosine']:.2f} and was left out, the other "
        f"{read['site-nih-4']['mean_cosine']:+.2f} and was accepted every round; the honest sites held ({margins[2]} "
        f"against the clean run)" in page
    )
    assert (
        f"the honest NIH sites read {honest_nih[0]:.2f} and {honest_nih[1]:.2f}, where with one flipper of seven they "
        f"read {alike[0]:.2f} to {alike[-1]:.2f} and the flipper {one['site-nih-4']['mean_cosine']:.2f}" in page
    )


def test_the_warm_up_rows_rule_on_clean_federations_since_stop_114_is_its_record():
    """docs/server-checks.md's error rate of today's warm-up rows rule on clean federations: the first round of the
    first clean federations of three or more sites drawn from seed 1000 on (none drawn before, none skipped), from the
    stand-in under the rule with split rows and passes; every figure of the paragraph from its record."""
    sweep = load_benchmark("clean_sweep")
    record = json.loads((REPOSITORY / "docs" / "clean-sweep" / WARMUP_SPLIT_RECORD).read_text())
    page = " ".join((REPOSITORY / "docs" / "server-checks.md").read_text().split())
    seeds = [run["federation"]["seed"] for run in record.values()]
    drawn = [seed for seed in range(1000, 1100) if len(sweep.draw(seed).sites) >= 3]
    assert seeds == drawn[: len(seeds)]  # the first ones, in order: unselected
    earlier = {
        name
        for path in (REPOSITORY / "docs" / "clean-sweep").glob("*.json")
        if path.name != WARMUP_SPLIT_RECORD and isinstance(stored := json.loads(path.read_text()), dict)
        for name in stored
    }
    assert not earlier & set(record)  # none drawn before
    for run in record.values():
        assert run["commit"].startswith(WARMUP_SPLIT_COMMIT) and run["machine"].startswith("AMD EPYC")
        assert run["exit_code"] == 0 and run["rejected"] == [] and not any(run["excluded"].values())
        assert run["direction_check"] == "first_round"  # the stand-in's settings (FedBN+, a site judged once)
    shared = [figures for run in record.values() for figures in run["shared_rows"].get("0", {}).values()]
    judged = [figures["mean_cosine"] for figures in shared if figures["rows"] >= 5]
    split = sum(bool(figures.get("split")) for figures in shared)
    seconds = [run["seconds"] for run in record.values()]
    bound = sweep.upper_bound(0, len(judged))
    assert min(judged) > 0
    assert (
        f"The first round of the first {len(record)} clean federations of three or more sites drawn from seed 1000 on "
        f"(seeds {seeds[0]} to {seeds[-1]}" in page
    )
    assert f"commit {WARMUP_SPLIT_COMMIT}, {round(min(seconds))} to {round(max(seconds))} s each" in page
    assert (
        f"{len(judged)} honest site-rounds judged (five or more rows), their mean cosines {min(judged):.2f} to "
        f"{max(judged):.2f}, none at 0 or below; no site rejected or left out; rows split at {split} of the "
        f"{len(shared)} sites with shared rows. From these alone, at most {_bound_up(bound)} per judged honest site"
        in page
    )
    assert f"a federation's sites share its consensus; by federation, 0 of {len(record)})" in page
    assert split == 0 or "no row split in any of them" not in page
