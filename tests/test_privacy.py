"""DP-SGD at a site (training.privacy): the epsilon it reports is Opacus's accountant's for the steps it took, its
per-image clipping bounds what an update can carry, it stops at its budget, and it refuses BatchNorm that trains."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel
from opacus.accountants import PRVAccountant, RDPAccountant

from surgical_aggregation.core.errors import SiteConfigError
from surgical_aggregation.core.head import NAMED_HEAD, numpy_state
from surgical_aggregation.core.methods import SiteMethod, method_meta
from surgical_aggregation.flare.client import ClientSession
from surgical_aggregation.flare.protocol import (
    META_CLASS_NAMES,
    META_METHOD,
    META_WARMUP,
    TASK_DESCRIBE,
    TASK_TRAIN,
    TASK_VALIDATE,
)
from surgical_aggregation.images.names import SMOKE_DENSENET
from surgical_aggregation.training import privacy_accounting
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.privacy import (
    NOISE_SEARCH_STEPS,
    DifferentialPrivacy,
    PoissonBatches,
    SecureRandom,
    released_validation,
    sampling_groups,
    secure_dp_optimizer,
)
from surgical_aggregation.training.privacy_accounting import PrivacyLedger
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import SiteTrainer

from helpers import load_benchmark

LABELS = ["Mass", "Effusion", "Atelectasis"]
FEDBN_PLUS = SiteMethod(backbone_strategy="fedbn_plus", identity_batchnorm=True)  # BatchNorm frozen, in eval mode


def _config(nih_data, cache, privacy: dict | None, **fields):
    values = {
        "data": {"kind": "nih", "location": str(nih_data.root), "labels": LABELS},
        "image_size": 32,
        "batch_size": 8,
        "max_batches_per_epoch": 2,
        "warmup_epochs": 1,
        "optimizer": "sgd",
        "learning_rate": 0.1,
        "warmup_learning_rate": 0.1,
        "cache_dir": str(cache),
        "cpu_threads": 2,
        "network": SMOKE_DENSENET,  # DP-SGD keeps a gradient per image: on DenseNet121, minutes
        **fields,
    }
    if privacy is not None:
        values["differential_privacy"] = privacy
    return site_config_from_dict(values, "site config")


def _trainer(nih_data, tmp_path, privacy, method=FEDBN_PLUS, **fields) -> SiteTrainer:
    config = _config(nih_data, tmp_path / "cache", privacy, **fields)
    trainer = SiteTrainer(config, prepare_site_data(config), "site-dp")
    trainer.set_method(method)
    return trainer


def test_the_ledgers_epsilon_is_opacus_rdp_accountants_to_the_last_bit():
    """Each noise multiplier and sample rate's one-step RDP is computed once and kept: the epsilon of any history is
    still exactly what Opacus's accountant gives (random histories and deltas, asked twice)."""
    rng = np.random.default_rng(3)
    for _ in range(4):
        history = [
            (float(rng.uniform(0.5, 4.0)), float(rng.uniform(0.001, 0.5)), int(rng.integers(1, 400)))
            for _ in range(int(rng.integers(1, 4)))
        ]
        delta = float(10 ** rng.uniform(-7, -3))
        reference = RDPAccountant()
        reference.history = list(history)
        for _ in range(2):
            assert PrivacyLedger("rdp", history).epsilon(delta) == reference.get_epsilon(delta), (history, delta)


def test_the_ledger_is_opacus_accountant_step_by_step():
    ledger = PrivacyLedger("rdp")
    reference = RDPAccountant()
    for noise, rate, steps in ((1.1, 0.05, 30), (1.1, 0.05, 20), (0.9, 0.1, 10)):
        ledger.record(noise, rate, steps)
        for _ in range(steps):
            reference.step(noise_multiplier=noise, sample_rate=rate)
    # the ledger appends each call (its history only grows: a job's record holds a digest of what it saw of it);
    # Opacus's accountant merges consecutive steps alike: the same steps, the same epsilon
    assert ledger.history == [(1.1, 0.05, 30), (1.1, 0.05, 20), (0.9, 0.1, 10)]
    assert reference.history == [(1.1, 0.05, 50), (0.9, 0.1, 10)]
    assert ledger.epsilon(1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    restored = PrivacyLedger.from_dict(ledger.to_dict(), "rdp")
    assert restored.epsilon(1e-5) == ledger.epsilon(1e-5) and restored.steps == 60
    prv = PrivacyLedger("prv", [(1.1, 0.05, 50)])
    reference = PRVAccountant()
    reference.history = [(1.1, 0.05, 50)]
    assert prv.epsilon(1e-5) == pytest.approx(reference.get_epsilon(1e-5))
    with pytest.raises(SiteConfigError, match="keep the accountant for the whole federation"):
        PrivacyLedger.from_dict(ledger.to_dict(), "prv")


def test_poisson_batches_include_each_image_independently():
    groups = [[index] for index in range(1000)]
    batches = list(PoissonBatches(groups, 0.05, 200, SecureRandom()))
    sizes = [len(batch) for batch in batches]
    assert len(batches) == 200 and sum(sizes) / 200 == pytest.approx(50, rel=0.05)
    assert min(sizes) < 45 < 55 < max(sizes)  # the batch size varies, as Poisson sampling has it
    assert list(PoissonBatches([[0], [1]], 1e-9, 3, SecureRandom())) == [[], [], []]


def test_poisson_batches_over_patients_take_each_patient_at_its_rate_and_one_of_its_images():
    """Patient-level sampling: 300 patients with 1 to 3 images each; a patient is in a batch with probability 0.1
    whatever its number of images, never with two of them, and its images are picked alike."""
    patients = [f"p{index}" for index in range(300) for _ in range(1 + index % 3)]
    groups = sampling_groups(patients, len(patients), "patient", "site x")
    assert len(groups) == 300 and sorted(index for group in groups for index in group) == list(range(len(patients)))
    seen = np.zeros(len(patients))
    steps = 2000
    for batch in PoissonBatches(groups, 0.1, steps, SecureRandom()):
        owners = [patients[index] for index in batch]
        assert len(owners) == len(set(owners))  # one image per sampled patient
        np.add.at(seen, batch, 1)
    per_patient = np.array([seen[group].sum() for group in groups]) / steps
    for images in (1, 2, 3):  # a patient's rate does not grow with its images (an image-level sampler's would)
        rates = per_patient[[len(group) == images for group in groups]]
        assert rates.mean() == pytest.approx(0.1, abs=0.005)
    threes = np.array([seen[group] for group in groups if len(group) == 3])
    assert threes.sum(axis=0) / threes.sum() == pytest.approx([1 / 3] * 3, abs=0.02)
    assert len(sampling_groups(patients, len(patients), "image", "site x")) == len(patients)
    with pytest.raises(SiteConfigError, match="unit 'patient' needs patient ids"):
        sampling_groups(None, 3, "patient", "site x")


def test_the_noise_is_gaussian_from_a_source_no_seed_reaches():
    """200,000 draws at std 2: mean, spread and shape of N(0, 4); torch's generator is neither used nor able to
    replay them (the same torch seed before two draws gives two different noises)."""
    from scipy import stats

    reference = torch.zeros(200_000)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    first = SecureRandom().noise(reference, 2.0)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(0)
    second = SecureRandom().noise(reference, 2.0)
    assert first.dtype == torch.float32 and first.shape == reference.shape
    assert not torch.equal(first, second) and float((first - second).abs().min()) >= 0
    assert abs(float(first.mean())) < 0.02 and float(first.std()) == pytest.approx(2.0, rel=0.01)
    assert stats.kstest(first.double().numpy() / 2.0, "norm").pvalue > 1e-4
    extremes = SecureRandom()
    extremes._words = lambda count: np.array([2**64 - 1, 0], dtype=np.uint64)  # the largest and smallest words
    assert extremes.uniform(2).min() > 0 and extremes.uniform(2).max() < 1
    uniform = SecureRandom().uniform(100_000)
    assert uniform.min() > 0 and uniform.max() < 1 and stats.kstest(uniform, "uniform").pvalue > 1e-4


def test_the_dp_optimizer_adds_noise_no_seed_replays():
    """One DP-SGD step on a fixed batch, twice from the same weights and the same torch seed: the clipped sums are
    equal, so the gradients differ by the noise alone, whose spread is noise multiplier * clip / batch size."""
    from opacus import GradSampleModule

    grads = []
    for _ in range(2):
        torch.manual_seed(0)
        model = GradSampleModule(torch.nn.Linear(50, 40))
        optimizer = secure_dp_optimizer(torch.optim.SGD(model.parameters(), lr=0.0), 1.5, 1.0, 4, SecureRandom())
        loss = model(torch.ones(4, 50)).pow(2).mean()
        loss.backward()
        optimizer.step()
        grads.append(model._module.weight.grad.clone())
    difference = grads[0] - grads[1]  # the difference of two independent noises: std sqrt(2) * 1.5 * 1.0 / 4
    assert float(difference.abs().min()) > 0
    assert float(difference.std()) == pytest.approx(math.sqrt(2) * 1.5 / 4, rel=0.1)


@pytest.mark.slow
def test_two_runs_of_one_dp_site_send_different_updates_where_two_runs_without_dp_send_the_same(nih_data, tmp_path):
    """The replay test: the same site, config and seed, trained twice. Without DP-SGD the two updates are equal
    (so the runs are the same run); with it every trained tensor differs."""
    dp = {"epsilon": 50.0, "noise_multiplier": 1.0}
    for name, privacy in (("plain", None), ("dp", dp)):
        states = []
        for run in range(2):
            trainer = _trainer(nih_data, tmp_path / f"{name}{run}", privacy, warmup_epochs=0)
            trainer.fit(0, warmup=False)
            trained = [key for key, value in trainer.model.named_parameters() if value.requires_grad]
            states.append({key: trainer.model.state_dict()[key].clone() for key in trained})
        equal = [key for key in states[0] if torch.equal(states[0][key], states[1][key])]
        if privacy is None:
            assert equal == list(states[0])
        else:
            assert equal == [] and len(states[0]) > 20  # the smoke network's 22 trained tensors


@pytest.mark.slow
@pytest.mark.parametrize("privacy", [{"epsilon": 50.0, "noise_multiplier": 1.0}, None], ids=["dp", "no-dp"])
def test_a_dp_site_starts_its_output_biases_at_the_public_prior_in_its_first_round_only(nih_data, tmp_path, privacy):
    """Under DP-SGD the site's first round trains from output biases at logit(prior_prevalence), whatever it
    received (without it, noise leaves "lower every output" as the only signal, which ranks positives lowest);
    later rounds, and sites without DP-SGD, train from the biases they received."""
    trainer = _trainer(nih_data, tmp_path, privacy)
    received = torch.tensor([0.5, -0.25, 1.0])
    starts = []
    epoch = trainer._epoch

    def recording(*args, **kwargs):
        starts.append(trainer.model.class_layers.out.bias.detach().clone())
        return epoch(*args, **kwargs)

    trainer._epoch = recording
    for round_number in range(2):
        with torch.no_grad():
            trainer.model.class_layers.out.bias.copy_(received)
        trainer.fit(round_number, warmup=round_number == 0)
    first_round, second_round = starts[0], starts[-1]
    prior = torch.full((3,), math.log(0.05 / 0.95))
    assert torch.allclose(first_round, prior if privacy else received, atol=1e-7)
    assert torch.equal(second_round, received)


@pytest.mark.parametrize(
    ("privacy", "message"),
    [
        ({"epsilon": 3}, "give exactly one"),
        ({"epsilon": 3, "noise_multiplier": 1.0, "planned_rounds": 5}, "give exactly one"),
        ({"epsilon": -1, "noise_multiplier": 1.0}, r"site config: differential_privacy.epsilon must be a number from"),
        (
            {"epsilon": float("inf"), "noise_multiplier": 1.0},
            "differential_privacy.epsilon must be a number from 0.2 to",
        ),
        ({"epsilon": float("nan"), "noise_multiplier": 1.0}, "differential_privacy.epsilon must be a number from"),
        ({"epsilon": 1e300, "planned_rounds": 3}, r"differential_privacy.epsilon must be a number from 0.2 to 100.0"),
        ({"epsilon": 0.01, "noise_multiplier": 1.0}, "differential_privacy.epsilon must be a number from 0.2"),
        ({"epsilon": 3, "noise_multiplier": 1.0, "delta": 1.5}, "differential_privacy.delta must be between 0 and 1"),
        ({"epsilon": 3, "noise_multiplier": 1.0, "delta": 0.0}, "differential_privacy.delta must be between 0 and 1"),
        ({"epsilon": 3, "noise_multiplier": 1.0, "max_grad_norm": float("inf")}, "max_grad_norm must be a finite"),
        ({"epsilon": 3, "noise_multiplier": 1.0, "max_grad_norm": 0}, "max_grad_norm must be a finite positive"),
        ({"epsilon": 3, "noise_multiplier": float("inf")}, "noise_multiplier must be a number from 0.1 to 1000"),
        ({"epsilon": 3, "noise_multiplier": 1e-9}, "noise_multiplier must be a number from 0.1 to 1000"),
        ({"epsilon": 3, "noise_multiplier": 1.0, "accountant": "moments"}, "differential_privacy.accountant must"),
        ({"epsilon": 3, "noise_multiplier": 1.0, "unit": "visit"}, r"differential_privacy.unit must be one of"),
        ({"epsilon": 3, "noise": 1.0}, r"unknown field\(s\) \['differential_privacy.noise'\]"),
        ({"epsilon": 3, "noise_multiplier": 1.0, "prior_prevalence": 0.9}, "prior_prevalence must be a number from"),
        ({"epsilon": 3, "noise_multiplier": 1.0, "prior_prevalence": 0}, "prior_prevalence must be a number from"),
        # epsilon null turns DP off: a block that names any other DP field is refused, not trained without DP
        (
            {"epsilon": None, "noise_multiplier": 2.0},
            r"epsilon is null, so DP-SGD is off, but the block sets \['noise_m",
        ),
        ({"noise_multiplier": 2.0, "delta": 1e-6}, r"the block sets \['delta', 'noise_multiplier'\]"),
        # whatever the values: a field named at its default is still an intent to train with DP
        ({"max_grad_norm": 1.0}, r"the block sets \['max_grad_norm'\]"),
        ({"epsilon": None, "unit": "patient", "accountant": "rdp"}, r"the block sets \['accountant', 'unit'\]"),
        ({"release_validation": "loss"}, r"the block sets \['release_validation'\]"),
    ],
)
def test_privacy_settings_are_checked_with_the_field_named(nih_data, tmp_path, privacy, message):
    with pytest.raises(SiteConfigError, match=message):
        _config(nih_data, tmp_path, privacy)


@pytest.mark.slow
def test_delta_is_at_most_one_over_ten_times_the_protected_units_and_the_noise_search_is_bounded(
    nih_data, tmp_path, monkeypatch
):
    trainer = _trainer(nih_data, tmp_path, {"epsilon": 3.0, "noise_multiplier": 1.0})
    patients = trainer.data.train.table.n_patients
    assert trainer.delta == pytest.approx(1 / (10 * patients))  # no delta given: the bound the field advises
    bound = 1 / (10 * patients)
    with pytest.raises(
        SiteConfigError,
        match=rf"site site-dp: differential_privacy.delta must be at most 1 / \(10 x the training split's {patients} "
        rf"patients\) = {bound:.3g}, got",
    ):
        _trainer(nih_data, tmp_path, {"epsilon": 3.0, "noise_multiplier": 1.0, "delta": 1.01 * bound})
    assert (
        _trainer(nih_data, tmp_path, {"epsilon": 3.0, "noise_multiplier": 1.0, "delta": bound / 2}).delta == bound / 2
    )
    calls = []
    count_calls = privacy_accounting._rdp_epsilon  # each epsilon asked of the RDP accountant
    monkeypatch.setattr(privacy_accounting, "_rdp_epsilon", lambda *args: calls.append(1) or count_calls(*args))
    trainer = _trainer(nih_data, tmp_path, {"epsilon": 0.2, "planned_rounds": 1_000_000})
    with pytest.raises(SiteConfigError, match=r"differential_privacy.epsilon 0.2 cannot cover \d+ steps"):
        trainer.fit(0, warmup=False)
    assert len(calls) == 1  # the most noise allowed is not enough: said at once
    calls.clear()
    trainer = _trainer(nih_data, tmp_path, {"epsilon": 100.0, "planned_rounds": 1})
    report = trainer.fit(0, warmup=True).privacy  # the budget at its upper bound: a small noise, found in bounded time
    assert report["epsilon"] <= 100.0 and report["epsilon"] == pytest.approx(100.0, rel=0.01)
    assert 0.1 < report["noise_multiplier"] < 1 and len(calls) <= 2 + NOISE_SEARCH_STEPS + 4


@pytest.mark.slow
def test_the_epsilon_a_site_reports_is_opacus_accountant_for_the_steps_it_took(nih_data, tmp_path):
    privacy = {"epsilon": 50.0, "noise_multiplier": 1.2, "delta": 1e-4}
    trainer = _trainer(nih_data, tmp_path, privacy)
    report = trainer.fit(0, warmup=True)
    patients = trainer.data.train.table.n_patients
    assert patients < len(trainer.data.train)  # some patients have several images: the unit matters here
    rate, steps = 8 / patients, 2 * 2  # two epochs (warm-up and local) of two steps (max_batches_per_epoch)
    reference = RDPAccountant()
    for _ in range(steps):
        reference.step(noise_multiplier=1.2, sample_rate=rate)
    assert report.privacy["epsilon"] == reference.get_epsilon(1e-4) and report.privacy["steps"] == steps
    assert report.privacy["unit"] == "patient" and report.samples <= patients
    assert not report.privacy["stopped"] and report.privacy["budget"] == 50.0
    trainer.save(tmp_path / "local_model.pt")  # FLARE may restart the site's process: the ledger goes with the model
    again = _trainer(nih_data, tmp_path, privacy)
    assert again.restore(tmp_path / "local_model.pt") and again.ledger.steps == steps
    second = again.fit(1, warmup=False)
    for _ in range(2):
        reference.step(noise_multiplier=1.2, sample_rate=rate)
    assert second.privacy["epsilon"] == reference.get_epsilon(1e-4) and second.privacy["steps"] == steps + 2


@pytest.mark.slow
def test_per_image_clipping_bounds_what_an_update_carries(nih_data, tmp_path):
    """SGD at learning rate 0.1: without DP-SGD the weights move by far more than 1e-3; with per-image gradients
    clipped to 1e-7 (and noise of that size) no weight moves by more than steps * 0.1 * 1e-7 * (1 + noise)."""
    moved = {}
    for name, privacy in (
        ("plain", None),
        ("clipped", {"epsilon": 100.0, "noise_multiplier": 1.0, "max_grad_norm": 1e-7}),
    ):
        trainer = _trainer(nih_data, tmp_path / name, privacy, warmup_epochs=0)
        before = {key: value.clone() for key, value in trainer.model.state_dict().items()}
        trainer.fit(0, warmup=False)
        after = trainer.model.state_dict()
        moved[name] = max(float((after[key].float() - before[key].float()).abs().max()) for key in before)
    assert moved["plain"] > 1e-3
    assert moved["clipped"] < 2 * 0.1 * 1e-7 * 10  # two steps; noise of 1e-7 std stays within 9 sigma


def test_a_site_whose_budget_would_be_exceeded_stops_training_and_says_so(nih_data, tmp_path):
    trainer = _trainer(nih_data, tmp_path, {"epsilon": 2.0, "noise_multiplier": 1.0})
    rate = 8 / trainer.data.train.table.n_patients
    trainer.ledger.record(1.0, rate, 100_000)  # a site that has trained for a long time already
    spent = trainer.ledger.epsilon(trainer.delta)
    assert spent > 2.0
    before = {key: value.clone() for key, value in trainer.model.state_dict().items()}
    report = trainer.fit(3, warmup=False)
    assert report.privacy["stopped"] and report.privacy["epsilon"] == spent and report.train_losses == []
    assert all(torch.equal(value, before[key]) for key, value in trainer.model.state_dict().items())


@pytest.mark.slow
def test_the_budget_chooses_the_noise_for_the_planned_rounds(nih_data, tmp_path):
    trainer = _trainer(nih_data, tmp_path, {"epsilon": 4.0, "planned_rounds": 3})
    rates = 8 / trainer.data.train.table.n_patients  # patients, not images, are sampled and protected
    for round_number in range(3):
        report = trainer.fit(round_number, warmup=round_number == 0)
        assert not report.privacy["stopped"]
    assert report.privacy["epsilon"] <= 4.0 and report.privacy["epsilon"] == pytest.approx(4.0, rel=0.05)
    assert trainer.fit(3, warmup=False).privacy["stopped"]  # a fourth round would go over the budget
    assert trainer.ledger.history == [(trainer.ledger.noise_multiplier, rates, steps) for steps in (4, 2, 2)]
    assert math.isfinite(trainer.ledger.noise_multiplier) and trainer.ledger.noise_multiplier > 0


@pytest.mark.parametrize(
    ("method", "gpus", "compile_mode", "message"),
    [
        (SiteMethod(backbone_strategy="fedbn_plus", proximal_mu=0.01), 1, "off", "run without proximal_mu"),
        (FEDBN_PLUS, 2, "off", "trains on one process: set gpus to 1"),
        (FEDBN_PLUS, 1, "on", "needs the model uncompiled: set compile to off"),
        (
            SiteMethod(backbone_strategy="fedbn_plus", label_prior={"Mass": 0.1}),
            1,
            "off",
            "cannot be combined with FedSLD",
        ),
    ],
)
def test_dp_sgd_refuses_what_it_cannot_bound_per_image(method, gpus, compile_mode, message):
    from surgical_aggregation.images.model import NamedDenseNet
    from surgical_aggregation.reports.model import ReportMLP
    from surgical_aggregation.training.privacy import refuse_what_dp_sgd_cannot_bound

    with pytest.raises(SiteConfigError, match=message):
        refuse_what_dp_sgd_cannot_bound(NamedDenseNet(["Mass"]), method, gpus, compile_mode, "site x")
    refuse_what_dp_sgd_cannot_bound(NamedDenseNet(["Mass"]), FEDBN_PLUS, 1, "off", "site x")  # allowed
    refuse_what_dp_sgd_cannot_bound(ReportMLP(["Mass"]), SiteMethod(), 1, "off", "site x")  # no BatchNorm at all


def test_dp_sgd_is_refused_where_batchnorm_would_learn_from_batch_statistics(nih_data, tmp_path):
    trainer = _trainer(nih_data, tmp_path, {"epsilon": 3.0, "noise_multiplier": 1.0}, method=SiteMethod())
    with pytest.raises(SiteConfigError, match="run the job with backbone_strategy 'fedbn_plus'"):
        trainer.fit(0, warmup=False)


def test_the_utility_pages_chance_verdicts_claim_below_or_above_only_where_every_interval_does():
    """A cell whose seeds' interval lies under 0.5 while a seed's test interval holds 0.5 (epsilon 1 at site-nih,
    stop 63: 0.422-0.495, seeds 0.426-0.525, 0.410-0.505, 0.395-0.498) is no better than chance, not "above"."""
    benchmark = load_benchmark("privacy_utility")
    seeds_under = [[0.426, 0.525], [0.410, 0.505], [0.395, 0.498]]
    cells = {
        "chance": {"low": 0.422, "high": 0.495, "test_intervals": seeds_under},
        "below": {"low": 0.30, "high": 0.40, "test_intervals": [[0.25, 0.45], [0.30, 0.49]]},
        "above": {"low": 0.55, "high": 0.60, "test_intervals": [[0.52, 0.62], [0.48, 0.60]]},
    }
    assert {verdict: benchmark.chance_verdict(cell) for verdict, cell in cells.items()} == {
        verdict: verdict for verdict in cells
    }
    held = {"low": 0.55, "high": 0.60, "test_intervals": [[0.45, 0.62], [0.48, 0.60]]}
    assert benchmark.chance_verdict(held) == "chance"  # every seed's test interval holds 0.5


def test_the_utility_page_is_what_its_command_writes_from_its_results(tmp_path):
    """docs/privacy-utility/summary.md: its table is the benchmark's, from the results it saved."""
    import importlib.util
    import json
    import shutil
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "privacy-utility"
    spec = importlib.util.spec_from_file_location(
        "privacy_utility", page.parents[1] / "benchmarks" / "privacy_utility.py"
    )
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    shutil.copy(page / "results.json", tmp_path / "results.json")
    results = json.loads((page / "results.json").read_text())
    benchmark.write(results, tmp_path)
    assert (tmp_path / "summary.md").read_text() == (page / "summary.md").read_text()
    rows = benchmark.summarize(results)
    assert [row["epsilon"] for row in rows] == [1.0, 3.0, 8.0, None]
    assert all(len(row["seeds"]) >= 3 and row["seeds"] == rows[-1]["seeds"] for row in rows)  # same seeds, each row
    seeds = {3: "three", 4: "four", 5: "five"}[len(rows[-1]["seeds"])]
    # provisioning/README.md's summary of the table
    readme = " ".join((page.parents[1] / "provisioning" / "README.md").read_text().split())
    private, plain = [row for row in rows if row["epsilon"] is not None], rows[-1]["sites"]
    chexpert = [row["sites"]["site-chexpert"]["mean"] for row in private]
    assert (
        f"site-chexpert reaches a mean AUROC of {min(chexpert):.2f} to {max(chexpert):.2f} at epsilon 1 to 8 against "
        f"{plain['site-chexpert']['mean']:.2f} without" in readme
    )
    assert [benchmark.chance_verdict(row["sites"]["site-nih"]) for row in private] == ["chance"] * 3
    assert f"site-nih is no better than chance at any of them ({plain['site-nih']['mean']:.2f} without)" in readme
    assert f"at epsilon 1, 3 and 8 per patient and without, over {seeds} seeds" in readme
    # and its ablation of DP-SGD's parts (benchmarks/dp_ablation.py), figure for figure
    ablation = json.loads((page / "dp_ablation.json").read_text())["aurocs"]
    last = {arm: f"{values[-1]:.3f}" for arm, values in ablation.items()}
    assert (
        f"(validation AUROC {ablation['no_dp'][0]:.3f} before training, after 2 rounds): without DP {last['no_dp']}, "
        f"clipping alone {last['clipping_only']}, noise alone {last['noise_only']}, DP-SGD without the prior "
        f"{last['dp_sgd_no_prior']}, with it {last['dp_sgd']}." in readme
    )
    assert float(last["dp_sgd_no_prior"]) < 0.45 < 0.5 <= float(last["dp_sgd"])  # the prior is what lifts it
    for result in results:  # every site spent at most its budget, and nearly all of it over the planned rounds
        if result["epsilon"] is not None:
            assert len(result["spent"]) == 2
        for spent in result["spent"].values():
            assert result["epsilon"] * 0.95 <= spent <= result["epsilon"]


@pytest.mark.slow
@pytest.mark.parametrize("privacy", [{"epsilon": 50.0, "noise_multiplier": 1.2}, None], ids=["dp", "no-dp"])
def test_no_training_statistic_leaves_a_dp_site_in_any_message_or_tracked_curve(nih_data, tmp_path, privacy):
    """Every message a site sends (handshake, two training rounds, a validation) and every value it hands to
    experiment tracking: under DP-SGD nothing computed on the training split leaves un-noised (no training loss, no
    per-epoch training curve); without DP the same run sends them, so the test can tell."""
    config = _config(nih_data, tmp_path / "cache", privacy)
    tracked: list[str] = []
    session = ClientSession(
        "site-dp",
        config,
        tmp_path / "site-dp" / "job" / "app_site-dp",
        logging.getLogger("test"),
        tracker=lambda tag, *_: tracked.append(tag),
    )
    classes = session.trainer.head_classes
    meta = {META_CLASS_NAMES: classes, META_METHOD: method_meta(FEDBN_PLUS), META_WARMUP: False}
    sent = [session.handle(TASK_DESCRIBE, FLModel(params={}, meta={}))]
    for round_number in range(2):
        received = FLModel(params=numpy_state(session.trainer.state_dict()), meta=dict(meta))
        received.current_round = round_number
        sent.append(session.handle(TASK_TRAIN, received))
    sent.append(session.handle(TASK_VALIDATE, FLModel(params=numpy_state(session.trainer.state_dict()), meta=meta)))
    keys = {key for answer in sent for key in (answer.metrics or {})}
    training_keys = {key for key in keys if key.startswith("train")}
    training_tags = {tag for tag in tracked if tag.startswith("train")}
    # the validation each training answer carries is released as a validation task's is (release_validation)
    validation_keys = {key for answer in sent[1:] for key in answer.metrics or {} if "val" in key}
    if privacy is None:
        assert "train_loss" in training_keys and training_tags == {"train/loss", "train/epoch_loss"}
        assert any(key.startswith("val_auroc/") for key in validation_keys), sorted(validation_keys)
    else:
        assert training_keys == set() and training_tags == set()
        assert all(key.startswith(("val_", "local_val_", "num_")) for key in keys), sorted(keys)
        assert validation_keys == {"val_loss", "val_loss_se"}, sorted(validation_keys)


def _positive_counts_that_fit(auroc: float, images: int) -> list[int]:
    """The issue's count recovery: an AUROC over ``images`` is a Mann-Whitney statistic over positives x negatives
    pairs, a multiple of 1/2 divided by their product, so only some positive counts fit a reported AUROC."""
    return [
        positives
        for positives in range(1, images)
        if abs(2 * auroc * positives * (images - positives) - round(2 * auroc * positives * (images - positives)))
        < 1e-6
    ]


def test_the_released_validation_loss_is_each_images_loss_clipped_then_averaged_and_rounded():
    """What a DP site's validation sends, worked by hand: a loss above the clip counts as the clip (2.0), a NaN is
    dropped, and the mean and its standard error are rounded to 3 decimals."""
    losses = np.array([0.1, 0.3, 16.0, 0.2123456, np.nan])
    kept = np.array([0.1, 0.3, 2.0, 0.2123456])  # mean 0.6530864, standard error 0.4508329
    released = released_validation(
        SimpleNamespace(image_losses=losses), DifferentialPrivacy(epsilon=3.0, noise_multiplier=1.0)
    )
    assert released == {"val_loss": 0.653, "val_loss_se": round(float(kept.std(ddof=1) / 2), 3)}
    assert released["val_loss_se"] == 0.451
    assert released_validation(SimpleNamespace(image_losses=losses), DifferentialPrivacy()) is None  # no DP: all


def test_a_server_that_crafts_models_reads_each_classs_validation_prevalence_from_the_released_loss(nih_data, tmp_path):
    """The limit provisioning/README.md states: the released loss withholds counts from a curious server, not from
    one that crafts models. With the head's weights zeroed every image's logit is its class's bias; raising one
    class's bias from -1 to +1 changes the mean loss by (1 - 2 x prevalence) / classes (log(1 + e) - log(1 + 1/e)
    is exactly 1), so one validation task a class gives each class's validation prevalence to the rounding's."""
    config = _config(nih_data, tmp_path / "cache", {"epsilon": 50.0, "noise_multiplier": 1.2})
    session = ClientSession("site-dp", config, tmp_path / "site-dp" / "job" / "app_site-dp", logging.getLogger("t"))
    session.handle(TASK_DESCRIBE, FLModel(params={}, meta={}))
    classes = session.trainer.head_classes
    meta = {META_CLASS_NAMES: classes, META_METHOD: method_meta(FEDBN_PLUS), META_WARMUP: False}
    crafted = numpy_state(session.trainer.state_dict())
    crafted[NAMED_HEAD.weight_key] = np.zeros_like(crafted[NAMED_HEAD.weight_key])

    def released_loss(raised: int | None) -> float:
        crafted[NAMED_HEAD.bias_key] = np.where(np.arange(len(classes)) == raised, 1.0, -1.0).astype(np.float32)
        answer = session.handle(TASK_VALIDATE, FLModel(params=dict(crafted), meta=meta))
        assert set(answer.metrics) == {"val_loss", "val_loss_se"}  # all the server gets
        return answer.metrics["val_loss"]

    baseline = released_loss(None)
    dataset = session.trainer.val_loader.dataset
    for column in range(len(classes)):
        estimate = (1 - len(classes) * (released_loss(column) - baseline)) / 2
        truth = float(dataset.labels[:, column].mean())
        assert abs(estimate - truth) <= len(classes) * 1e-3, (classes[column], estimate, truth)


@pytest.mark.parametrize("release", ["loss", "full"])
def test_a_dp_sites_validation_sends_no_count_and_no_class_by_default(nih_data, tmp_path, release):
    """Under DP-SGD a site's validation sends only its clipped, rounded mean loss and standard error: the count
    recovery (per-class AUROC and the validation size) has nothing to work on. A site that opts in
    (``release_validation: "full"``) sends what a site without DP sends, and the recovery narrows every class's
    validation positives to a few counts, the true one among them: what the default withholds."""
    privacy = {"epsilon": 50.0, "noise_multiplier": 1.2, "release_validation": release}
    config = _config(nih_data, tmp_path / "cache", privacy)
    session = ClientSession("site-dp", config, tmp_path / "site-dp" / "job" / "app_site-dp", logging.getLogger("t"))
    described = session.handle(TASK_DESCRIBE, FLModel(params={}, meta={}))
    classes = session.trainer.head_classes
    meta = {META_CLASS_NAMES: classes, META_METHOD: method_meta(FEDBN_PLUS), META_WARMUP: False}
    validated = session.handle(TASK_VALIDATE, FLModel(params=numpy_state(session.trainer.state_dict()), meta=meta))
    if release == "loss":
        assert set(validated.metrics) == {"val_loss", "val_loss_se"}
        assert all(value == round(value, 3) for value in validated.metrics.values())
        assert "num_val" not in described.metrics and "num_val" not in described.meta
        return
    images = described.metrics["num_val"]
    dataset = session.trainer.val_loader.dataset
    recovered = 0
    for column, name in enumerate(classes):
        if f"val_auroc/{name}" not in validated.metrics:  # a class without a positive: no AUROC, nothing sent
            continue
        truth = int((dataset.labels[:, column] * dataset.mask[:, column]).sum())
        fitting = _positive_counts_that_fit(validated.metrics[f"val_auroc/{name}"], images)
        assert truth in fitting and len(fitting) <= 6, (name, truth, fitting)
        recovered += 1
    assert recovered >= 1
