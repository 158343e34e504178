"""The experiment runner: the summary's statistics against scipy on fixed inputs, and a real tiny grid
through the FLARE simulator (psi = 0: surgical aggregation, vanilla FL and partial loss agree)."""

from __future__ import annotations

import json
import math
import os
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from surgical_aggregation.experiments.choices import ABSENT, HEAD_ONLY, MISSING
from surgical_aggregation.experiments.grid_run import plan, refuse_other_starts, run_settings
from surgical_aggregation.experiments.grids import DataSources, grid_settings, simulated_nih
from surgical_aggregation.experiments.runner import METHOD_FIELDS, RunOptions
from surgical_aggregation.experiments.summary import (
    RESULT_FILE,
    _curves_markdown,
    _markdown,
    flags,
    seed_table,
    seeds_markdown,
    shared_vs_unique,
    specificity_gate,
    summary_table,
)
from surgical_aggregation.training.profiles import Profile

CLASSES = ["Mass", "Edema", "Hernia", "Nodule", "Fibrosis", "Emphysema"]
SURGICAL = [0.81, 0.74, 0.90, 0.66, 0.71, 0.79]
VANILLA = [0.70, 0.72, 0.61, 0.64, 0.52, 0.75]


def _fixed_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    base = {"setting": "s", "factor": "psi", "value": 0.5, "seed": 0, "test_set": "nih"}
    results = pd.DataFrame(
        [
            {
                **base,
                "method": m,
                "mean_auroc": float(np.mean(v)),
                "ci_low": 0.5,
                "ci_high": 0.9,
                "classes": 6,
                "images": 100,
            }
            for m, v in (("surgical", SURGICAL), ("vanilla", VANILLA))
        ]
    )
    per_class = pd.DataFrame(
        [
            {**base, "method": m, "class_name": c, "auroc": a, "shared": c in ("Mass", "Edema")}
            for m, values in (("surgical", SURGICAL), ("vanilla", VANILLA))
            for c, a in zip(CLASSES, values, strict=True)
        ]
    )
    return results, per_class


def differences_but_the_methods(records: dict[str, dict]) -> dict[str, dict]:
    """Per method, the fields of its training record (``result.json``'s ``training``) that are not the method's own
    and differ from the first method's: empty when every method trained alike."""
    shared = {m: {k: v for k, v in r.items() if k not in METHOD_FIELDS} for m, r in records.items()}
    first = next(iter(shared.values()))
    found = {m: {k: (v, first.get(k)) for k, v in fields.items() if v != first.get(k)} for m, fields in shared.items()}
    found = {m: fields for m, fields in found.items() if fields}
    missing = {m: set(first) - set(fields) for m, fields in shared.items() if set(first) - set(fields)}
    return {**found, **{m: {"missing": sorted(keys)} for m, keys in missing.items()}}


def test_the_tables_show_each_models_finding_specificity_where_it_was_measured():
    results, per_class = _fixed_frames()
    results = results.assign(model="selected", round=3, val_mean_auroc=0.8)
    assert "logit correlation" not in _markdown(summary_table(results, per_class), "surgical")  # a head-only grid
    measured = results.assign(logit_correlation=[0.75, 0.93], shared_score_auroc_loss=[0.104, 0.047])
    lines = _markdown(summary_table(measured, per_class), "surgical").splitlines()
    header = "| logit correlation / AUROC lost to one score (validation) | classes | p vs surgical | Shapiro-Wilk p |"
    assert lines[2].endswith(header)
    assert "| 0.75 / 0.104 | 6 |" in lines[4] and "| 0.93 / 0.047 | 6 |" in lines[5]
    seeds = seed_table(pd.concat([measured, measured.assign(seed=1, logit_correlation=[0.65, 0.91])]))
    rows = seeds_markdown(seeds, "surgical").splitlines()
    assert rows[2].endswith("| stopped early | logit correlation / AUROC lost to one score (validation) |")
    assert rows[4].endswith("| 0.70 / 0.104 |") and rows[5].endswith("| 0.92 / 0.047 |")  # means over the seeds


def test_a_full_network_comparison_counts_only_where_the_ceiling_is_finding_specific():
    results, _ = _fixed_frames()
    assert specificity_gate(results) == []  # nothing measured: no verdict
    ceiling = results.iloc[[0, 0]].assign(method="centralized_full", model="selected", seed=[0, 1])
    generic = pd.concat([results, ceiling.assign(logit_correlation=[0.75, 0.35], shared_score_auroc_loss=0.1)])
    assert specificity_gate(generic) == [
        "s, nih: centralized (all labels) has a mean logit correlation of 0.55 over 2 seed(s), above 0.3: the "
        "comparison does not count (its models may rank every finding by one generic score); ranking every finding "
        "by one shared score would cost them 0.100 of mean AUROC"
    ]
    specific = pd.concat([results, ceiling.assign(logit_correlation=[0.2, 0.3], shared_score_auroc_loss=[0.02, 0.05])])
    assert specificity_gate(specific)[0].endswith(
        "0.25 over 2 seed(s), at most 0.3: the comparison counts by this figure; ranking every finding by one shared "
        "score would cost them 0.035 of mean AUROC"
    )


def test_an_absent_control_that_leaves_nothing_out_is_not_run_twice():
    """At psi = 0 every site labels every class: the absent control leaves no finding out of any image, generates the
    missing setting's folder, and the plan runs it once; at psi = 12/14 it runs every method but centralized_full."""
    profile = Profile("tiny", "plan only", training={"image_size": 32}, rounds=1)
    sources = DataSources(embedded_patients=80, embedded_image_size=32, external_patients=40)
    settings = grid_settings("small", sources, profile, (MISSING, ABSENT))
    runs = plan(settings, ["surgical", "vanilla", "centralized_full"], [0, 1])
    counted = pd.Series([run.setting.name for run in runs]).value_counts().to_dict()
    assert counted == {"nih-K4-psi0of14-N1": 6, "nih-K4-psi12of14-N1": 6, "nih-K4-psi12of14-N1-absent": 4}
    absent_sites = next(r.setting for r in runs if r.setting.name.endswith("-absent")).sites.values()
    assert all(config["embedded"]["absent"] for config in absent_sites)  # each site's unlabelled classes left out


def test_a_grid_refuses_to_resume_over_runs_that_started_from_another_initial_model(tmp_path):
    """A rebuilt stand-in (another digest) does not resume a grid whose finished runs started from the old one; the
    same file at another path does; the refusal names the run and both starts."""
    from surgical_aggregation.core.errors import SiteConfigError

    profile = Profile("tiny", "plan only", training={"image_size": 32}, rounds=1)
    sources = DataSources(embedded_patients=80, embedded_image_size=32, external_patients=40)
    runs = plan(grid_settings("small", sources, profile, (MISSING,)), ["surgical"], [0])
    old = "pretrained here: ...: /root/.cache/a/pretrained/s.pt (sha256 aedbc874a485...)"
    finished = runs[1].folder(tmp_path)
    finished.mkdir(parents=True)
    (finished / "result.json").write_text(json.dumps({"training": {"initial_model": old}}))
    refuse_other_starts(runs, tmp_path, old.replace("/root/.cache/a", "/data/cache"))  # the same file elsewhere
    rebuilt = old.replace("aedbc874a485", "7e8e97942df3")
    with pytest.raises(SiteConfigError, match=r"1 finished run\(s\) started from another initial model") as refused:
        refuse_other_starts(runs, tmp_path, rebuilt)
    assert runs[1].title in str(refused.value) and "aedbc874a485" in str(refused.value)


def test_a_run_stopped_while_its_models_are_scored_resumes_at_the_scoring(tmp_path, monkeypatch):
    """A full-network run whose scoring was stopped keeps its trained models (``trained.json``): run again, it scores
    them without training, and its seconds still count the training; from another initial model it trains anew."""
    from surgical_aggregation.experiments import grid_run

    profile = Profile("tiny", "plan only", training={"image_size": 32}, rounds=1)
    sources = DataSources(embedded_patients=80, embedded_image_size=32, external_patients=40)
    run = plan(grid_settings("small", sources, profile, (MISSING,)), ["surgical"], [0])[0]
    start = "pretrained here: ...: /root/.cache/a/pretrained/s.pt (sha256 aedbc874a485...)"
    options = RunOptions(initial_model=start)
    trainings: list[str] = []

    def train(run, folder, profile, options):
        trainings.append(options.initial_model)
        (folder / "models").mkdir(exist_ok=True)
        for name in ("global.pt", "global-last.pt"):
            (folder / "models" / name).write_bytes(b"model")
        curve = [{"round": 2, "val_mean_auroc": 0.7}, {"round": 4, "val_mean_auroc": 0.8}]
        models = {"selected": {"*": [folder / "models/global.pt"]}, "last": {"*": [folder / "models/global-last.pt"]}}
        return models, {"training": {"initial_model": options.initial_model}, "curve": curve,
                        "rounds": {"selected": 4, "last": 2}}  # fmt: skip

    def stopped(run, models, options):
        raise KeyboardInterrupt

    def scored(run, models, options):
        assert [path.name for path in models["*"]] in (["global.pt"], ["global-last.pt"])
        return pd.DataFrame({"class": ["Mass"], "auroc": [0.8]}), {"nih": {"mean_auroc": 0.8}}

    monkeypatch.setattr(grid_run, "run_federated", train)
    monkeypatch.setattr(grid_run, "evaluate_run", stopped)
    with pytest.raises(KeyboardInterrupt):
        grid_run.execute(run, tmp_path, profile, options)
    folder = run.folder(tmp_path)
    assert not (folder / "result.json").is_file() and (folder / grid_run.TRAINED_FILE).is_file()
    train_seconds = json.loads((folder / grid_run.TRAINED_FILE).read_text())["train_seconds"]
    monkeypatch.setattr(grid_run, "evaluate_run", scored)
    moved = start.replace("/root/.cache/a", "/data/cache")  # the same weights at another path: the same start
    result = grid_run.execute(run, tmp_path, profile, RunOptions(initial_model=moved))
    assert trainings == [start]  # trained once
    assert not (folder / grid_run.TRAINED_FILE).exists()  # result.json holds it all now
    assert result["train_seconds"] == train_seconds and result["seconds"] >= train_seconds
    assert result["machine"] == grid_run.machine() and result["machine"].endswith(f"({os.cpu_count()} cores)")
    assert result["models"]["selected"]["round"] == 4 and result["models"]["last"]["round"] == 2
    assert result["models"]["selected"]["validation"] == {"round": 4, "val_mean_auroc": 0.8}
    (folder / "result.json").unlink()
    rebuilt = start.replace("aedbc874a485", "7e8e97942df3")
    grid_run.execute(run, tmp_path, profile, RunOptions(initial_model=rebuilt))
    assert trainings == [start, rebuilt]  # another start trains again
    (folder / "result.json").unlink()
    (folder / "models" / "global-last.pt").unlink()
    grid_run.execute(run, tmp_path, profile, RunOptions(initial_model=rebuilt))
    assert trainings == [start, rebuilt, rebuilt]  # a model file gone: trains again


def test_summary_statistics_match_scipy():
    results, per_class = _fixed_frames()
    table = summary_table(results, per_class).set_index("method")
    t_test = stats.ttest_rel(SURGICAL, VANILLA)
    differences = np.subtract(SURGICAL, VANILLA)
    assert table.loc["vanilla", "p_value"] == pytest.approx(t_test.pvalue, rel=1e-12)
    assert table.loc["vanilla", "shapiro_p"] == pytest.approx(stats.shapiro(differences).pvalue, rel=1e-12)
    assert table.loc["vanilla", "wilcoxon_p"] == pytest.approx(stats.wilcoxon(differences).pvalue, rel=1e-12)
    assert table.loc["vanilla", "mean_difference"] == pytest.approx(differences.mean(), abs=1e-12)
    assert math.isnan(table.loc["surgical", "p_value"])  # the reference itself
    assert table.loc["vanilla", "label"] == "vanilla FL"


def test_shared_vs_unique_by_hand():
    _, per_class = _fixed_frames()
    split = shared_vs_unique(per_class).set_index("method")
    assert split.loc["surgical", "shared_classes"] == pytest.approx((0.81 + 0.74) / 2)
    assert split.loc["surgical", "other_classes"] == pytest.approx(np.mean(SURGICAL[2:]))
    assert split.loc["vanilla", "other_classes"] == pytest.approx(np.mean(VANILLA[2:]))


def test_a_selected_model_below_chance_or_far_below_the_last_is_flagged_with_its_round():
    base = {"setting": "s", "seed": 0, "test_set": "nih"}
    rows = [
        {**base, "method": "vanilla", "model": "selected", "round": 1, "val_mean_auroc": 0.180},
        {**base, "method": "vanilla", "model": "last", "round": 4, "val_mean_auroc": 0.635},
        {**base, "method": "surgical", "model": "selected", "round": 3, "val_mean_auroc": 0.766},
        {**base, "method": "surgical", "model": "last", "round": 4, "val_mean_auroc": 0.800},  # 0.034 below: fine
    ]
    assert flags(pd.DataFrame(rows)) == [
        "s, vanilla FL, seed 0: the selected model (round 1) validates at mean AUROC 0.180, below chance",
        "s, vanilla FL, seed 0: the selected model (round 1) validates at mean AUROC 0.180, 0.455 below the last "
        "round's (round 4, 0.635)",
    ]


def test_the_per_round_table_shows_each_models_validation_auroc_and_the_loss_that_selects_it():
    curves = pd.DataFrame(
        [
            {"setting": "s", "method": "vanilla", "seed": 0, "round": r, "val_mean_auroc": a, "val_loss": loss}
            for r, a, loss in ((-1, 0.5, 0.7), (0, 0.861, 0.219), (1, 0.825, 0.269))
        ]
    )
    results = pd.DataFrame([{"setting": "s", "method": "vanilla", "seed": 0, "model": "selected", "round": 0}])
    assert _curves_markdown(curves, results).splitlines()[5:9] == [
        "| method | before | 0 | 1 |",
        "| --- | --- | --- | --- |",
        "| vanilla FL | 0.500 / 0.700 | 0.861 / 0.219* | 0.825 / 0.269 |",
    ]


@pytest.mark.slow
@pytest.mark.system
def test_tiny_grid_end_to_end_through_the_simulator(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SURGICAL_AGGREGATION_CACHE", str(cache))
    profile = Profile(
        "tiny",
        "tiny images, two batches per epoch: the grid's machinery, not its numbers",
        training={
            "image_size": 32,
            "batch_size": 8,
            "max_batches_per_epoch": 2,
            "warmup_epochs": 1,
            "local_epochs": 1,
            "learning_rate": 3e-4,
            "cache_threads": 2,
            "record_exchanges": "off",
        },
        rounds=2,
        split_fractions=(0.6, 0.2, 0.2),
        pretraining={"images": 40, "epochs": 1},
    )
    sources = DataSources(embedded_patients=40, embedded_image_size=32)
    setting = simulated_nih(2, Fraction(0), 1, sources, profile, "psi", 0.0)
    # one federated method through the simulator: every method's psi = 0 model is the same in
    # tests/test_falsification.py, and the in-process federation gives the simulator's in tests/test_flare_e2e.py
    methods = ["surgical", "centralized"]
    options = RunOptions(bootstrap=20, cpu_threads=1)
    summary = run_settings([setting], methods, [0], profile, tmp_path / "out", options)

    out = tmp_path / "out"
    results = {m: json.loads((out / "runs" / setting.name / m / "seed0" / RESULT_FILE).read_text()) for m in methods}
    assert all(r["test_sets"]["nih"]["classes"] >= 10 for r in results.values())  # the 14 NIH classes, tested
    assert set(results["surgical"]["test_sets"]) == {"nih", "mimic"}
    table = pd.read_csv(out / "summary.csv")
    assert set(table["method"]) == set(methods) and set(table["test_set"]) == {"nih", "mimic"}
    assert "FL + surgical aggregation" in summary.read_text()
    per_class = pd.read_csv(out / "per_class_auroc.csv")
    assert per_class["shared"].all()  # psi = 0: every class is held by both sites
    assert (out / "plots" / f"per_class_{setting.name}_nih.png").is_file()
    run_folder = out / "runs" / setting.name / "surgical" / "seed0"
    assert (run_folder / "models" / "global.pt").is_file() and not (run_folder / "workspace").exists()
    assert (run_folder / "round_history.json").is_file()

    # the selected and the last model of every run, tested, with their rounds and validation
    for method, result in results.items():
        assert set(result["models"]) == {"selected", "last"}, method
        assert result["models"]["last"]["round"] == 1 and result["models"]["selected"]["round"] in (0, 1)
        assert result["test_sets"] == result["models"]["selected"]["test_sets"]
        assert [point["round"] for point in result["curve"]][-2:] == [0, 1]
    assert set(per_class["model"]) == {"selected", "last"}
    # how finding-specific each model is: on its test dataset's validation images (an external set has none)
    for method, result in results.items():
        specificity = result["test_sets"]["nih"]["finding_specificity"]
        assert set(specificity) == {"logit_correlation", "shared_score_auroc_loss"}, method
        assert -1 <= specificity["logit_correlation"] <= 1 and "finding_specificity" not in result["test_sets"]["mimic"]
    assert "| logit correlation / AUROC lost to one score (validation) |" in summary.read_text()
    text = summary.read_text()
    assert text.startswith("Initial model of every method: pretrained here: DenseNet121 trained centrally for 1 epochs")
    assert "Per-round validation" in text and "| FL + surgical aggregation | 0 | last (1) |" in text
    assert (out / "plots" / f"validation_{setting.name}_seed0.png").is_file()

    # like-for-like: every method trained with the same initial model, BatchNorm handling, recipe and selection
    records = {m: r["training"] for m, r in results.items()}
    assert {record["batchnorm"] for record in records.values()} == {"frozen at the initial model's statistics"}
    assert differences_but_the_methods(records) == {}

    # resumable: a second call finds every run finished and trains nothing
    stamps = {m: (out / "runs" / setting.name / m / "seed0" / RESULT_FILE).stat().st_mtime_ns for m in methods}
    run_settings([setting], methods, [0], profile, out, options)
    assert stamps == {m: (out / "runs" / setting.name / m / "seed0" / RESULT_FILE).stat().st_mtime_ns for m in methods}


@pytest.mark.slow
@pytest.mark.system
def test_the_head_only_grid_runs_both_controls_over_seeds_and_tabulates_them(tmp_path, monkeypatch):
    """The benchmark's head-only variant through the runner: seeds that redraw the label sets, the absent control,
    the oracles, the seed table and the side-by-side plot."""
    monkeypatch.setenv("SURGICAL_AGGREGATION_CACHE", str(tmp_path / "cache"))
    profile = Profile(
        "tiny-head", "heads on glyph features", training={"image_size": 32}, rounds=3, patience=3,
        split_fractions=(0.5, 0.2, 0.3), head_only={"learning_rate": 1e-2},
    )  # fmt: skip
    sources = DataSources(embedded_patients=80, embedded_image_size=32, external_patients=40)
    settings = grid_settings("small", sources, profile, (MISSING, ABSENT))
    methods = ["surgical", "vanilla", "centralized_full", "individual"]
    options = RunOptions(bootstrap=20, variant=HEAD_ONLY)
    run_settings(settings, methods, [0, 1], profile, tmp_path / "out", options)

    runs = tmp_path / "out" / "runs"
    results = {
        (path.parent.parent.parent.name, path.parent.parent.name, path.parent.name): json.loads(path.read_text())
        for path in runs.glob("*/*/seed*/result.json")
    }
    # no centralized_full under absent (its findings are gone), and no absent control at psi = 0 (nothing left out)
    assert len(results) == 2 * 2 * 4 * 2 - 2 * 2 - 3 * 2
    heterogeneous, absent = "nih-K4-psi12of14-N1", "nih-K4-psi12of14-N1-absent"
    assert (
        results[heterogeneous, "surgical", "seed0"]["label_sets"]
        != results[heterogeneous, "surgical", "seed1"]["label_sets"]
    )  # each seed draws its own label subsets
    assert results[absent, "surgical", "seed0"]["control"] == ABSENT
    for seed in ("seed0", "seed1"):  # psi = 0: one model, whatever the method
        scores = {
            m: results["nih-K4-psi0of14-N1", m, seed]["test_sets"]["nih"]["mean_auroc"] for m in ("surgical", "vanilla")
        }
        assert scores["surgical"] == scores["vanilla"], scores
    assert "each site its own classes" in results[heterogeneous, "individual", "seed0"]["training"]["head"]
    seeds = pd.read_csv(tmp_path / "out" / "seeds.csv")
    row = seeds[
        (seeds.value > 0) & (seeds.control == MISSING) & (seeds.method == "vanilla") & (seeds.model == "selected")
    ]
    assert len(row) == 2 and (row["seeds"] == 2).all()  # the nih and mimic test sets
    assert {"seed_ci_low", "difference", "first_round_selected", "stopped_early"} <= set(seeds.columns)
    assert (tmp_path / "out" / "plots" / "mean_auroc_vs_psi_nih_controls.png").is_file()
    assert "| 12/14 | absent | vanilla FL | 2 |" in (tmp_path / "out" / "seeds.md").read_text()


def test_a_runs_machine_names_the_kernels_its_floats_came_from(monkeypatch, tmp_path):
    """Two VMs that both say "AMD EPYC" may run other kernels (a stand-in built on one of AVX512 differs in every
    weight from the shipped build): a run's machine names the CPU's family, model and torch's instruction set."""
    import torch

    from surgical_aggregation.experiments import grid_run

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n")
    real_path = grid_run.Path
    monkeypatch.setattr(grid_run, "Path", lambda name: cpuinfo if name == "/proc/cpuinfo" else real_path(name))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    kernels = torch.backends.cpu.get_cpu_capability()
    assert grid_run.machine() == f"AMD EPYC, family 25 model 17, {kernels} ({os.cpu_count()} cores)"


def test_a_record_names_the_commit_of_the_code_that_made_it(tmp_path):
    """Suite and sweep records name the commit they ran on, marked when the bundle's code differed from it, so that a
    table can say which rules made a row; a folder outside git names none."""
    import pathlib
    import subprocess

    from surgical_aggregation.experiments import grid_run

    def git(*arguments: str) -> str:
        done = subprocess.run(["git", "-C", str(tmp_path), *arguments], check=True, capture_output=True, text=True)
        return done.stdout

    assert grid_run.code_version(tmp_path) is None
    git("init", "-q")
    (tmp_path / "custom").mkdir()
    (tmp_path / "custom" / "rules.py").write_text("BOUND = 1\n")
    (tmp_path / "README.md").write_text("notes\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "rules")
    commit = git("rev-parse", "HEAD").strip()
    assert grid_run.code_version(tmp_path) == commit
    (tmp_path / "README.md").write_text("other notes\n")  # not code: the rules are the commit's
    assert grid_run.code_version(tmp_path) == commit
    (tmp_path / "custom" / "rules.py").write_text("BOUND = 2\n")
    assert grid_run.code_version(tmp_path) == f"{commit}+changes"
    assert grid_run.code_version() == grid_run.code_version(pathlib.Path(grid_run.__file__).resolve().parents[3])
