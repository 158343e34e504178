"""The training-throughput benchmark runs end to end (a smoke test: no speed thresholds, see benchmarks/)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_train_throughput_measures_the_three_paths_and_writes_them(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    arguments = ["--size", "32", "--batch", "4", "--batches", "2", "--repeats", "2", "--device", "cpu"]
    results = _load("train_throughput").main([*arguments, "--out", str(out)])

    assert json.loads(out.read_text()) == results
    assert (results["image_size"], results["batch_size"], results["repeats"]) == (32, 4, 2)
    assert (results["precision"], results["loader_workers"], results["compile"]) == ("float32", 0, "off")
    for path in ("ceiling_images_per_s", "train_images_per_s", "validation_images_per_s"):
        assert 0 < results[path]["median"] <= results[path]["best"]
    assert results["train_over_ceiling"] == pytest.approx(
        results["train_images_per_s"]["median"] / results["ceiling_images_per_s"]["median"]
    )


def test_the_poc_benchmark_reads_each_sites_local_epochs_once_from_its_logs(tmp_path: Path) -> None:
    """benchmarks/poc_speed.py's rate: every local epoch once (a POC writes a line to the site's and the job's
    log), the head warm-up left out, images over seconds summed per site."""
    line = (
        "2026-11-26 11:15:51,976 - {0} - INFO - {0} round {1} {2} epoch 1/1: loss 0.4854 on {3} images in {4} s (x/s)"
    )
    site_log = "\n".join(
        [
            line.format("site-nih", 0, "head warm-up", 500, "1.0"),
            line.format("site-nih", 0, "training", 240, "20.0"),
            line.format("site-nih", 1, "training", 260, "30.0"),
            line.format("site-chexpert", 0, "training", 100, "4.0"),
        ]
    )
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "log.txt").write_text(site_log)
    (tmp_path / "site" / "job").mkdir()
    (tmp_path / "site" / "job" / "log.txt").write_text(site_log)  # the same epochs in the job's log
    assert _load("poc_speed").site_rates(tmp_path) == {"site-chexpert": 25.0, "site-nih": 10.0}


def test_the_attack_suite_runs_a_larger_federation_against_its_own_references() -> None:
    """``--patients``/``--rounds``: each case and its clean and honest-alone references carry the size in their names
    (so a larger federation is never measured against the 100-patient runs), the sites get that many patients and the
    job that many rounds; the default size keeps the names the recorded runs have."""
    from helpers import load_benchmark

    suite = load_benchmark("attack_suite")
    assert suite.Case("clean", 3, 0, 1).name == "clean-3sites-0attackers-seed1"
    planned = suite.cases([1], ["mimic"], [(3, 1)], patients=400, rounds=5)
    assert [case.name for case in planned] == [
        "clean-3sites-0attackers-seed1-400p5r",
        "honest_alone-3sites-1attackers-seed1-400p5r",
        "placebo-3sites-1attackers-seed1-400p5r",
        "mimic-3sites-1attackers-seed1-400p5r",
    ]
    quick = suite.cases([1], ["backdoor"], [(3, 1)], patients=400, rounds=5, references=[])  # a defence's first look
    assert [case.name for case in quick] == [
        "clean-3sites-0attackers-seed1-400p5r",
        "backdoor-3sites-1attackers-seed1-400p5r",
    ]
    # "rounds": those the job ran (here a stopped one), "job_rounds": those it planned
    runs = {case.name: {"attack": case.attack, "sites": 3, "attackers": case.attackers, "seed": 1, "patients": 400,
                        "job_rounds": 5, "rounds": 2} for case in planned}  # fmt: skip
    runs["clean-3sites-0attackers-seed1"] = {"attack": "clean", "patients": 100, "rounds": 3}
    attack = runs["mimic-3sites-1attackers-seed1-400p5r"]
    assert suite.clean_of(runs, attack) is runs["clean-3sites-0attackers-seed1-400p5r"]
    assert suite.alone_of(runs, attack) is runs["honest_alone-3sites-1attackers-seed1-400p5r"]
    assert suite.setting_of(attack) == "3 (1; 400 patients, 5 rounds)"
    assert suite.setting_of({"sites": 3, "attackers": 0, "rounds": 3}) == "3 (0)"
    configs = suite.site_configs(3, 1, patients=400)
    attackers = suite.attackers_of(planned[1], configs)
    assert attackers == ["site-nih-2"]
    assert sorted(suite.taking_part(planned[1], configs, attackers)) == ["site-chexpert-1", "site-nih-1"]
    assert sorted(suite.taking_part(planned[3], configs, attackers)) == sorted(configs)
    assert {site: config["embedded"]["patients"] for site, config in configs.items()} == {
        "site-chexpert-1": 400, "site-nih-1": 800, "site-nih-2": 800,
    }  # fmt: skip
    assert {site: config["data"]["partition_count"] for site, config in configs.items()} == {
        "site-chexpert-1": 1, "site-nih-1": 2, "site-nih-2": 2,
    }  # fmt: skip


def test_the_attack_suite_from_the_stand_in_is_measured_against_its_own_references(tmp_path) -> None:
    """``--start stand-in``: the sites fine-tune the stand-in with FedBN+ at the papers' rates, as the main job does,
    and each case and its references carry the start in their names, so that no run from the stand-in is measured
    against a run from scratch."""
    from surgical_aggregation.training.profiles import PAPERS_FINE_TUNING, STAND_IN

    from helpers import load_benchmark

    suite = load_benchmark("attack_suite")
    planned = suite.cases([1], ["sign_flip"], [(3, 1)], references=[suite.ALONE], start=STAND_IN)
    assert [case.name for case in planned] == [
        "clean-3sites-0attackers-seed1-stand-in",
        "honest_alone-3sites-1attackers-seed1-stand-in",
        "sign_flip-3sites-1attackers-seed1-stand-in",
    ]
    runs = {case.name: {"attack": case.attack, "sites": 3, "attackers": case.attackers, "seed": 1, "patients": 100,
                        "job_rounds": 3, "start": case.start} for case in planned}  # fmt: skip
    runs["clean-3sites-0attackers-seed1"] = {"attack": "clean", "patients": 100, "job_rounds": 3}  # from scratch
    attack = runs["sign_flip-3sites-1attackers-seed1-stand-in"]
    assert suite.clean_of(runs, attack) is runs["clean-3sites-0attackers-seed1-stand-in"]
    assert suite.alone_of(runs, attack) is runs["honest_alone-3sites-1attackers-seed1-stand-in"]
    assert suite.setting_of(attack) == "3 (1; from the stand-in)"
    configs = suite.site_configs(3, 1, start=STAND_IN)
    for config in configs.values():
        assert {name: config[name] for name in PAPERS_FINE_TUNING} == dict(PAPERS_FINE_TUNING)
    scratch = suite.site_configs(3, 1).values()  # the demo's rates
    assert all(config["learning_rate"] == suite.DEMO.training["learning_rate"] for config in scratch)
    assert suite.DEMO.training["learning_rate"] != PAPERS_FINE_TUNING["learning_rate"]
    job, attackers = suite.write_case_job(planned[2], tmp_path / "job", tmp_path / "cache", tmp_path / "exchange", {})
    server = json.loads(next(job.glob("app_server/config/config_fed_server.json")).read_text())
    arguments = json.dumps(server)
    assert '"pretrained_weights": "stand-in"' in arguments and '"backbone_strategy": "fedbn_plus"' in arguments
    assert attackers == ["site-nih-2"]
    # the record names the direction check that judged the run: the first round only from the stand-in, as the jobs do
    hostile_site = load_benchmark("hostile_site")
    assert hostile_site.direction_check(job / "app_server") == "first_round"
    scratch = suite.Case("sign_flip", 3, 1, 1)  # from scratch: the controller's default, every round
    scratch_job, _ = suite.write_case_job(scratch, tmp_path / "scratch", tmp_path / "cache", tmp_path / "exchange", {})
    assert hostile_site.direction_check(scratch_job / "app_server") is True
    assert hostile_site.direction_check(tmp_path / "no-such-app") is None


def test_the_tuned_backdoor_trains_at_its_own_rates_and_the_honest_sites_at_the_papers(tmp_path) -> None:
    """``backdoor_tuned`` from the stand-in: the attacker's site config carries the demo's rates and two local epochs
    (the rates at which its own model learns the trigger), every honest site keeps the papers' fine-tuning rates;
    the plain ``backdoor`` changes no site's training."""
    from surgical_aggregation.training.profiles import PAPERS_FINE_TUNING, STAND_IN

    from helpers import load_benchmark

    suite = load_benchmark("attack_suite")
    for attack, attacker_training in (("backdoor_tuned", suite.ATTACKER_TRAINING["backdoor_tuned"]), ("backdoor", {})):
        case = suite.Case(attack, 3, 1, 1, start=STAND_IN)
        job, attackers = suite.write_case_job(case, tmp_path / attack, tmp_path / "cache", tmp_path / "exchange", {})
        configs = {
            path.stem: json.loads(path.read_text()) for path in job.glob("app_site-*/config/site_configs/*.json")
        }
        assert sorted(configs) == ["site-chexpert-1", "site-nih-1", "site-nih-2"] and attackers == ["site-nih-2"]
        for site, config in configs.items():
            expected = {**PAPERS_FINE_TUNING, "local_epochs": 1, **(attacker_training if site in attackers else {})}
            assert {name: config.get(name, 1) for name in expected} == expected, (attack, site)
    assert suite.ATTACKER_TRAINING["backdoor_tuned"]["learning_rate"] == pytest.approx(
        6 * PAPERS_FINE_TUNING["learning_rate"]
    )


def test_a_backdoor_its_attacker_never_learned_did_not_take_and_counts_as_no_hold() -> None:
    """The verdict reads the attacker's own last local model: within 5 points of the reference's success the attack
    failed at its source ("did not take"), beyond them a kept model is a hold; a global model that learned the trigger
    breaks through whatever the attacker's own reads; runs recorded before it was measured stay holds."""
    from helpers import load_benchmark

    suite = load_benchmark("attack_suite")
    reference = {"best_auroc": {"site-a": 0.70}, "final_auroc": {"site-a": 0.70}, "best_backdoor_success": 0.04,
                 "final_backdoor_success": 0.04}  # fmt: skip

    def run(own: dict | None, success: float = 0.05) -> dict:
        found = {"attack": "backdoor", "exit_code": 0, "best_auroc": {"site-a": 0.69}, "final_auroc": {"site-a": 0.69},
                 "best_backdoor_success": success, "final_backdoor_success": success}  # fmt: skip
        return found if own is None else {**found, "attackers_own_backdoor_success": own}

    assert suite.verdict(run({"site-b": 0.09}), reference) == "did not take"  # 5 points above the reference's
    assert suite.verdict(run({"site-b": 0.0901}), reference) == "holds"
    assert suite.verdict(run({"site-b": 0.05, "site-c": 0.60}), reference) == "holds"  # the most any attacker learned
    assert suite.verdict(run({"site-b": 0.05}, success=0.10), reference) == "breaks through"
    assert suite.verdict(run(None), reference) == "holds"
    assert (
        suite.verdict({**run(None), "final_backdoor_success": 0.10}, reference) == "breaks through"
    )  # its final model
    assert suite.verdict(run({"site-b": float("nan")}), reference) == "holds"  # no local model: counted as taken
    assert suite.verdict({**run({"site-b": 0.05}), "attack": "label_flip"}, reference) == "holds"


def test_the_glyph_backdoor_stamps_the_stand_ins_first_shape_and_is_judged_by_its_own_trigger() -> None:
    """``backdoor_glyph``'s trigger is the stand-in pretraining's first 5x5 shape, cells of width // 16 pixels,
    brightened (saturating) one cell in from the bottom-right corner, the same on an array and a tensor; its runs are
    judged by that trigger's success, and a reference never scored with it judges nothing."""
    import torch

    from surgical_aggregation.images.synthetic_pixels import pattern_glyphs

    from helpers import load_benchmark

    suite = load_benchmark("attack_suite")
    site = load_benchmark("suite_site")
    images = np.full((2, 1, 64, 64), 200, np.uint8)
    tensor = torch.from_numpy(images.copy())
    site.stamp_glyph(images), site.stamp_glyph(tensor)
    assert np.array_equal(images, tensor.numpy())
    assert site.TRIGGERS[site.TRIGGER_OF["backdoor_glyph"]] is site.stamp_glyph  # what its poisoned images carry
    expected = np.full((64, 64), 200)
    shape = np.kron(pattern_glyphs()[site.GLYPH_TRIGGER], np.ones((4, 4))) > 0
    expected[40:60, 40:60][shape] = 255  # 200 + 115, saturated
    assert np.array_equal(images[0, 0], expected) and np.array_equal(images[1, 0], expected)
    dark = np.zeros((64, 64), np.uint8)
    assert site.stamp_glyph(dark)[40:60, 40:60].max() == site.GLYPH_BRIGHTNESS
    reference = {"best_auroc": {"a": 0.7}, "final_auroc": {"a": 0.7}, "best_backdoor_success": 0.04,
                 "best_backdoor_success_by_trigger": {"square": 0.04, "glyph": 0.05},
                 "final_backdoor_success_by_trigger": {"square": 0.04, "glyph": 0.05}}  # fmt: skip
    run = {"attack": "backdoor_glyph", "exit_code": 0, "best_auroc": {"a": 0.7}, "final_auroc": {"a": 0.7},
           "best_backdoor_success": 0.04,
           "best_backdoor_success_by_trigger": {"square": 0.04, "glyph": 0.60},
           "final_backdoor_success_by_trigger": {"square": 0.04, "glyph": 0.06}}  # fmt: skip
    assert suite.success_of(run, "backdoor_glyph") == 0.60 and suite.success_of(run, "backdoor") == 0.04
    assert suite.verdict(run, reference) == "breaks through"  # the square's success would call it a hold
    assert suite.verdict(run, {**reference, "best_backdoor_success_by_trigger": {}}) == "no reference run"


def test_sign_flip_inside_cancels_the_other_sites_update_just_inside_the_two_site_bounds() -> None:
    """The reader of stop 93's later-round two-site bounds: its update projects onto the honest one as exactly its
    negation (the mean of the two moves nowhere along it) and stands at the bound's cosine plus the margin, honest in
    its warm-up round and reporting no validation."""

    from helpers import load_benchmark

    site = load_benchmark("suite_site")
    honest = np.random.default_rng(3).normal(size=(1, 40))
    for bound in site.STOP_93_BOUNDS.values():
        vector, _ = site.attack_rows("sign_flip_inside", honest, 2, 1, "mean", cosine=bound + site.INSIDE_MARGIN)
        mean = honest[0]
        assert vector @ mean == pytest.approx(-(mean @ mean))
        assert vector @ mean / np.linalg.norm(vector) / np.linalg.norm(mean) == pytest.approx(bound + 0.05)
    assert "sign_flip_inside" in site.LATE and site.QUIET["sign_flip_inside"] == "sign_flip_inside"


def test_sign_flip_persistent_aims_just_inside_the_running_oppositions_reference_with_the_honest_mean() -> None:
    """The reader of the running opposition aims its backbone update at a cosine with the honest sites' mean the margin
    inside the CUSUM's reference value (a round at that cosine would leave the running opposition at 0; the server
    reads it against the consensus of every update, its own included, which its size drags its way); honest in its
    warm-up round and reporting no validation."""

    from surgical_aggregation.core.checks.update import OPPOSITION_REFERENCE, persistently_opposed

    from helpers import load_benchmark

    site = load_benchmark("suite_site")
    honest = np.random.default_rng(4).normal(size=(2, 40))
    cosine = -OPPOSITION_REFERENCE + site.INSIDE_MARGIN
    vector, _ = site.attack_rows("sign_flip_inside", honest, 3, 1, "mean", cosine=cosine)
    mean = honest.mean(axis=0)
    reached = float(vector @ mean / np.linalg.norm(vector) / np.linalg.norm(mean))
    assert reached == pytest.approx(-0.20)
    assert persistently_opposed({"x": reached}, {"x": 0.0}) == ({"x": 0.0}, {})
    assert "sign_flip_persistent" in site.LATE and site.QUIET["sign_flip_persistent"] == "sign_flip_persistent"


def test_the_running_opposition_replayed_on_recorded_cosines_follows_the_rule() -> None:
    """Judged in the first round with its cosine and a consensus that is someone's, then Page's CUSUM; a round whose
    consensus is no one's (here two of three opposed) is skipped and carries each site's value."""
    from helpers import load_benchmark

    sweep = load_benchmark("clean_sweep")
    directions = {
        "0": {"a": 0.5, "b": 0.5},  # x misses round 0
        "1": {"a": 0.5, "b": 0.1, "x": -0.9},  # x judged now
        "2": {"a": 0.4, "b": 0.2, "x": -0.9},
        "3": {"a": -0.2, "b": 0.3, "x": -0.9},  # two of three opposed: no one's
        "4": {"a": 0.5, "b": 0.5, "x": -0.4},
    }
    replayed = sweep.replayed_opposition(directions)
    assert list(replayed) == ["0", "1", "2", "4"]
    assert replayed["0"] == {} and replayed["1"] == {"a": 0.0, "b": 0.0}
    assert replayed["2"] == {"a": 0.0, "b": 0.0, "x": pytest.approx(0.65)}
    assert replayed["4"] == {"a": 0.0, "b": 0.0, "x": pytest.approx(0.8)}


def test_a_job_with_patience_ends_where_the_controller_would_end_it() -> None:
    """``clean_sweep.ends_early``: the round after which a job of that patience ends, counted as the controller counts
    trained rounds in a row without a new best (the best resets the count)."""
    from helpers import load_benchmark

    sweep = load_benchmark("clean_sweep")
    run = {"federation": {"rounds": 8}, "best_rounds": [0, 1, 5]}
    assert sweep.ends_early(run, 4) is None  # rounds 2-4 are three, then 5 is a best, 6-7 two
    assert sweep.ends_early(run, 3) == 4
    assert sweep.ends_early(run, 1) == 2
    assert sweep.ends_early({"federation": {"rounds": 5}, "best_rounds": []}, 4) == 3  # no best: rounds 0-3
    unjudged = {**run, "validations": {str(number): {} for number in (-1, 0, 1, 3, 5, 6, 7)}}  # 2 and 4 made none
    assert sweep.ends_early(run, 2) == 3 and sweep.ends_early(unjudged, 2) == 7  # rounds 6 and 7, not 2 and 3


def test_a_runs_closest_approach_to_each_rule_is_read_as_the_rule_reads_it() -> None:
    """Direction: each site's first judged round under the first-round check (every round with three or more under
    the check on), a round whose consensus is no one's skipped; warm-up rows and two sites: round 0, with the check
    on; the harm test: each round's highest z (a loss test's the lower of its two halves) less the z Holm's first step
    needs at half the round's level over the sites tested, those left out earlier not among them (the loss alone in
    round 0), each standard error floored by the site's validation size."""
    from scipy.stats import norm

    from helpers import load_benchmark

    sweep = load_benchmark("clean_sweep")
    level = 0.01 / 2  # two rounds
    loss_only = {"val_loss_minus_own": 0.1, "val_loss_minus_own_se": 0.01, "val_loss_minus_start": 0.1,
                 "val_loss_minus_start_se": 0.05, "val_loss": 0.5}  # fmt: skip  # no gain: margin 0.3 x 0.4, z -2
    recalibrated = {"val_recalibrated_loss_minus_own": 0.05, "val_recalibrated_loss_minus_own_se": 0.01,
                    "val_recalibrated_loss_minus_start": 0.05, "val_recalibrated_loss_minus_start_se": 0.05,
                    "val_recalibrated_loss": 0.45}  # fmt: skip  # margin 0.3 x 0.4, z -7
    gained = {"val_loss_minus_own": 0.05, "val_loss_minus_own_se": 0.01, "val_loss_minus_start": -0.05,
              "val_loss_minus_start_se": 0.02, "val_loss": 0.5}  # fmt: skip  # margin 0.1 + 0.3 x 0.45, z -9.25

    def ranking(better_by: float) -> dict[str, float]:  # no start: margin 0.05, error 0.02
        return {"val_auroc_minus_own": better_by, "val_auroc_minus_own_se": 0.02}

    shared = {"a": {"rows": 5, "mean_cosine": 0.7}, "b": {"rows": 4, "mean_cosine": -0.5},
              "c": {"rows": 6, "mean_cosine": 0.9}}  # fmt: skip
    result = {
        "federation": {"rounds": 2, "sites": {"a": {}, "b": {}, "c": {}}},
        "direction_check": "first_round",
        "directions": {
            "0": {"a": 0.4, "b": -0.3, "c": -0.2},  # two of three opposed: no one's, nobody judged
            "1": {"a": -0.1, "b": 0.2, "c": 0.6},
        },
        "shared_rows": {"0": shared, "1": {"a": {"rows": 5, "mean_cosine": -0.9}}},  # round 1 is not judged
        "opposition": {"0": {}, "1": {"a": 0.0, "b": 0.15}},
        "two_sites": {"0": {}, "1": {"backbone_cosine": -0.9}},
        "validations": {
            "0": {"a": {**gained, **ranking(-0.11)}, "b": {**loss_only, **recalibrated}, "c": {}},  # a's z 3 unread
            "1": {"a": ranking(0.03), "b": ranking(0.35)},  # z -4 and -20
        },
        "excluded": {"0": [], "1": []},
    }
    approaches = sweep.closest_approaches(result)
    harm_0 = -7 - norm.isf(level / 2 / 2)  # b's recalibrated half decides (as it is: z -2); two sites tested
    harm_1 = -4 - norm.isf(level / 2 / 2)  # the ranking test of a and b
    assert approaches == {
        "direction": -0.1,
        "warmup_rows": 0.7,
        "opposition": 0.15,
        "two_site_backbone": None,
        "two_site_rows": None,
        "harm": pytest.approx(max(harm_0, harm_1), abs=1e-9),
        "bar": None,
    }
    assert approaches["harm"] == pytest.approx(-7.0233, abs=1e-4)
    by_round = sweep.approaches_by_round(result)  # round 0's opposition judged no one: no point
    assert by_round["opposition"] == {1: 0.15}
    assert by_round["harm"] == {0: pytest.approx(harm_0, abs=1e-9), 1: pytest.approx(harm_1, abs=1e-9)}
    both = {
        **result,
        "validations": {**result["validations"], "1": {"a": {**ranking(0.03), **loss_only}, "b": ranking(0.35)}},
    }
    loss_1 = -2 - norm.isf(level / 2)  # a's loss test, z -2, the only one of its kind: above the ranking tests'
    assert loss_1 > harm_1 and sweep.approaches_by_round(both)["harm"][1] == pytest.approx(loss_1, abs=1e-9)
    # b left out in round 0: round 1's family is a alone
    excluded = sweep.closest_approaches({**result, "excluded": {"0": ["b"], "1": []}})
    assert excluded["harm"] == pytest.approx(-4 - norm.isf(level / 2), abs=1e-9)
    # a declared 4 validation images: its AUROC error floored at 0.05 / 2, z -3.2
    floored = sweep.closest_approaches({**result, "validation_sizes": {"a": 4, "b": 10_000}})
    assert floored["harm"] == pytest.approx(-3.2 - norm.isf(level / 2 / 2), abs=1e-9)
    assert sweep.closest_approaches({**result, "direction_check": True})["direction"] == -0.1
    later = {**result, "directions": {"0": {"a": 0.4, "b": 0.3, "c": 0.2}, "1": {"a": -0.1, "b": 0.2, "c": 0.6}}}
    assert sweep.closest_approaches(later)["direction"] == 0.2  # each judged in round 0 only
    assert sweep.closest_approaches({**later, "direction_check": True})["direction"] == -0.1
    unjudged = sweep.closest_approaches({**later, "direction_check": False})
    assert unjudged["direction"] is None and unjudged["warmup_rows"] is None
    pair = {"backbone_cosine": -0.2, "shared_rows": 5, "shared_rows_mean_cosine": 0.9}
    two = {"federation": {"rounds": 1, "sites": {"a": {}, "b": {}}}, "two_sites": {"0": pair, "1": {}},
           "direction_check": True}  # fmt: skip
    assert sweep.closest_approaches(two) == {
        "direction": None, "warmup_rows": None, "opposition": None, "two_site_backbone": -0.2, "two_site_rows": 0.9,
        "harm": None, "bar": None,
    }  # fmt: skip
    assert sweep.closest_approaches({**two, "bars": {"1": -0.2, "0": 0.1}})["bar"] == 0.1  # the first round's
    fewer = sweep.closest_approaches({**two, "two_sites": {"0": {**pair, "shared_rows": 4}}})
    assert fewer["two_site_rows"] is None and fewer["two_site_backbone"] == -0.2
    assert sweep.closest_approaches({**two, "direction_check": False})["two_site_backbone"] is None
    log = (
        "2026-12-07 10:34:36,291 - site-1-nih - INFO - site-1-nih data ready: 14 classes; 749 train / 266 validation "
        "/ 272 test images\n... - site-4-siim data ready: 1 classes; 101 train / 40 validation / 38 test images\n"
    )
    assert sweep.validation_sizes(log) == {"site-1-nih": 266, "site-4-siim": 40}


def test_a_defence_the_honest_sites_run_reaches_them_and_not_the_attacker(tmp_path) -> None:
    """``--honest-sites`` settings (here a weight decay; stop 91 ran its patch hardening so) go into every honest
    site's config and not the attacker's, which trains as it likes; in a clean run every site is honest."""
    from helpers import load_benchmark

    suite = load_benchmark("attack_suite")
    defence = {"weight_decay": 1e-4}
    for attack, expected_attackers in (("backdoor_glyph", ["site-nih-2"]), (suite.CLEAN, [])):
        case = suite.Case(attack, 3, 1 if attack != suite.CLEAN else 0, seed=1, start="stand-in")
        job, attackers = suite.write_case_job(
            case, tmp_path / attack, tmp_path / "cache", tmp_path / "exchange", {}, defence
        )
        configs = {
            path.stem: json.loads(path.read_text()) for path in job.glob("app_site-*/config/site_configs/*.json")
        }
        assert sorted(configs) == ["site-chexpert-1", "site-nih-1", "site-nih-2"]
        assert attackers == expected_attackers
        for site, config in configs.items():
            assert config["weight_decay"] == (0.0 if site in attackers else 1e-4), (attack, site)


def test_a_run_whose_site_flare_never_started_is_made_again_once_and_only_once(tmp_path, monkeypatch) -> None:
    """FLARE's simulator that lost a site at its start (its thread's error line) ran a smaller federation than the job
    asks for: the run is made again in a fresh workspace, the lost one kept beside it; a run that loses a site twice
    is returned as it ended, and a run that lost none is never repeated."""
    hostile_site = _load("hostile_site")
    job = tmp_path / "job"
    (job / "app_site-1").mkdir(parents=True)
    lost = (
        "2026-12-05 15:18:30,001 - ERROR - run_client_thread error: Failed to create connection to the child process "
        "in SimulatorClientRunner, timeout: 60"
    )
    other = "2026-12-05 15:30:00,001 - ERROR - run_client_thread error: a site's END_RUN failed"  # not a lost start
    cases = (([lost, "fine"], 2, True), ([lost, lost], 2, True), (["fine"], 1, False), ([other], 1, False))
    for outputs, runs, kept in cases:
        workspace = tmp_path / f"ws-{len(outputs)}-{runs}-{outputs[-1][:4]}"
        (workspace.with_name(f"{workspace.name}.client-start-failed") / "an earlier run's").mkdir(parents=True)
        made: list[str] = []

        def simulate(command, outputs=outputs, made=made, workspace=workspace, **options):
            assert command[command.index("-w") + 1] == str(workspace)
            workspace.mkdir()
            (workspace / f"attempt-{len(made)}").touch()
            made.append(outputs[len(made)])
            return subprocess.CompletedProcess(command, 0, made[-1], "")

        monkeypatch.setattr(hostile_site.subprocess, "run", simulate)
        code, output = hostile_site.run_simulator(job, workspace)
        assert (code, output, len(made)) == (0, outputs[runs - 1], runs)
        lost_one = workspace.with_name(f"{workspace.name}.client-start-failed")
        assert (lost_one / "an earlier run's").exists() is not kept  # replaced by this run's lost workspace
        assert (lost_one / "attempt-0").exists() is kept and (workspace / f"attempt-{runs - 1}").exists()


def test_a_row_projected_on_the_clean_features_directions_keeps_their_scores_and_drops_the_rest() -> None:
    """backdoor_projection.py: clean features that vary along the first two channels only; a row reading all four
    keeps its first two weights, and its bias takes the other two's part of the mean image, so every clean image
    scores as before to 1e-12 while a shift along the third channel (a trigger clean images never show) moves the
    score no more."""

    from helpers import load_benchmark

    projection = load_benchmark("backdoor_projection")
    rng = np.random.default_rng(0)
    clean = np.column_stack([rng.normal(0, 3, 50), rng.normal(0, 1, 50), np.full(50, 0.5), np.full(50, 2.0)])
    weight, bias = np.array([[1.0, 2.0, 3.0, 4.0]]), np.array([0.25])
    heads = projection.projected_heads(weight, bias, clean, (0, 2))
    assert heads[0][0] is weight and heads[0][1] is bias
    kept, moved = heads[2]
    np.testing.assert_allclose(kept, [[1.0, 2.0, 0.0, 0.0]], atol=1e-12)
    np.testing.assert_allclose(moved, [0.25 + 3.0 * 0.5 + 4.0 * 2.0], atol=1e-12)
    np.testing.assert_allclose(clean @ kept.T + moved, clean @ weight.T + bias, atol=1e-12)
    trigger = np.array([0.0, 0.0, 5.0, 0.0])
    np.testing.assert_allclose((clean + trigger) @ kept.T + moved, clean @ kept.T + moved, atol=1e-12)


def test_the_null_rates_under_students_t_reject_a_subset_of_the_normals():
    """``recalibrated_null.py --student-t``: the same draws' z-scores read under Student's t with n - 1 degrees of
    freedom, whose tail is heavier than the normal's, so at every level each test rejects no draw the normal did not
    (rates at most the normal's) and, at ten images, fewer; a setting's text is read as the record names it."""
    from helpers import load_benchmark

    null = load_benchmark("recalibrated_null")
    assert null.setting_of("10x7@0.15") == (10, 7, 0.15)
    with pytest.raises(argparse.ArgumentTypeError, match="IMAGESxFINDINGS@PREVALENCE"):
        null.setting_of("10x7")
    rates = null.null_rates(10, 1, 0.1, 400, np.random.default_rng(0), "same", student_t=True)
    names = ("as they are", "recalibrated", "both (the server's)")
    assert list(rates) == [*names, *(f"{name} (t)" for name in names)]
    for name in names:
        for level in ("0.05", "0.01", "0.001"):
            assert rates[f"{name} (t)"][level] <= rates[name][level], (name, level)
    for suffix in ("", " (t)"):  # the server's test rejects only where both halves do
        for level in ("0.05", "0.01", "0.001"):
            halves = min(rates[f"as they are{suffix}"][level], rates[f"recalibrated{suffix}"][level])
            assert rates[f"both (the server's){suffix}"][level] <= halves
    assert rates["as they are (t)"]["0.05"] < rates["as they are"]["0.05"]
    z = np.array([-1.0, 0.5, 2.0, 4.0])
    read = null.tails(10, student_t=True)
    assert np.allclose(read[" (t)"](z), stats.t.sf(z, 9)) and np.allclose(read[""](z), stats.norm.sf(z))
    assert list(null.tails(10, student_t=False)) == [""]
    assert list(null.null_rates(10, 1, 0.1, 20, np.random.default_rng(0), "same")) == list(names)
