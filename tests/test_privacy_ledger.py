"""A site's privacy ledger (training.privacy_ledger.LedgerFile): one budget across the site's jobs, resumed runs and
continued federations, in its workspace's local/ folder; refused, never reset, when it cannot be trusted."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pandas as pd
import pytest
from nvflare.app_common.abstract.fl_model import FLModel
from opacus.accountants import RDPAccountant

from surgical_aggregation.core.errors import PrivacyLedgerError, SiteConfigError
from surgical_aggregation.core.head import numpy_state
from surgical_aggregation.core.methods import SiteMethod, method_meta
from surgical_aggregation.flare.client import ClientSession
from surgical_aggregation.flare.protocol import META_CLASS_NAMES, META_METHOD, META_PRIVACY, META_WARMUP, TASK_TRAIN
from surgical_aggregation.images.names import SMOKE_DENSENET
from surgical_aggregation.training import privacy_ledger
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.privacy import DifferentialPrivacy
from surgical_aggregation.training.privacy_ledger import LEDGER_FILE, SPENT_FILE, LedgerFile

SITE = "site-dp"
FEDBN_PLUS = SiteMethod(backbone_strategy="fedbn_plus", identity_batchnorm=True)
BUDGET = {"epsilon": 4.0, "planned_rounds": 2, "delta": 1e-5}  # two rounds of one local epoch each


def _session(
    nih_data,
    workspace: Path,
    job: str,
    split_seed: int = 0,
    budget: dict | None = None,
    location: Path | None = None,
    site: str = SITE,
) -> ClientSession:
    """The site as FLARE runs it: its workspace, a job folder ``<workspace>/<job>/app_<site>``."""
    labels = ["Mass", "Effusion", "Atelectasis"]
    root = location or nih_data.root
    config = site_config_from_dict(
        {
            "data": {"kind": "nih", "location": str(root), "labels": labels, "split_seed": split_seed},
            "image_size": 32,
            "batch_size": 8,
            "max_batches_per_epoch": 2,
            "warmup_epochs": 0,
            "optimizer": "sgd",
            "learning_rate": 0.1,
            "cache_dir": str(workspace.parent / "cache"),
            "cpu_threads": 2,
            "network": SMOKE_DENSENET,
            "differential_privacy": budget or BUDGET,
        },
        "site config",
    )
    return ClientSession(site, config, workspace / job / f"app_{site}", logging.getLogger("test"))


def _train(session: ClientSession, round_number: int) -> FLModel:
    trainer = session.trainer
    meta = {META_CLASS_NAMES: trainer.head_classes, META_METHOD: method_meta(FEDBN_PLUS), META_WARMUP: False}
    received = FLModel(params=numpy_state(trainer.state_dict()), meta=meta)
    received.current_round = round_number
    return session.handle(TASK_TRAIN, received)


def _ledger_entries(workspace: Path) -> list[dict]:
    return json.loads((workspace / "local" / LEDGER_FILE).read_text())["entries"]


@pytest.mark.slow
def test_two_jobs_and_a_resubmitted_one_spend_one_budget(nih_data, tmp_path):
    """Job 1 trains a round, its process restarts (a resumed run) and trains the second; job 2 (a continued
    federation) and job 3 (job 2 resubmitted: a new job id) find the budget spent and send nothing. The epsilon
    reported is an Opacus accountant's over the ledger's steps, per patient."""
    workspace = tmp_path / SITE
    sent = [_train(_session(nih_data, workspace, "job-1"), 0)]
    sent.append(_train(_session(nih_data, workspace, "job-1"), 1))  # a new process for the same job
    for job in ("job-2", "job-3"):
        sent.append(_train(_session(nih_data, workspace, job), 0))
    reports = [answer.meta[META_PRIVACY] for answer in sent]
    assert [report["stopped"] for report in reports] == [False, False, True, True]
    assert [bool(answer.params) for answer in sent] == [True, True, False, False]  # a stopped site sends no update
    (entry,) = _ledger_entries(workspace)
    session = _session(nih_data, workspace, "job-4")
    patients = session.trainer.data.train.table.n_patients
    assert entry["unit"] == "patient" and entry["delta"] == BUDGET["delta"]
    assert entry["history"] == [[entry["noise_multiplier"], 8 / patients, 2]] * 2  # each round's steps, appended
    reference = RDPAccountant()
    for _ in range(4):
        reference.step(noise_multiplier=entry["noise_multiplier"], sample_rate=8 / patients)
    assert reports[1]["epsilon"] == reports[3]["epsilon"] == reference.get_epsilon(1e-5) <= BUDGET["epsilon"]
    assert reports[1]["unit"] == "patient" and reports[1]["steps"] == 4
    spent = json.loads((workspace / "job-1" / f"app_{SITE}" / SPENT_FILE).read_text())
    assert spent["steps"] == 4 and spent["fingerprint"] == entry["fingerprint"]


@pytest.mark.slow
def test_an_unreadable_ledger_is_refused_not_reset(nih_data, tmp_path):
    workspace = tmp_path / SITE
    _train(_session(nih_data, workspace, "job-1"), 0)
    ledger = workspace / "local" / LEDGER_FILE
    kept = ledger.read_text()
    for broken in (kept[: len(kept) // 2], "{}", json.dumps({**json.loads(kept), "entries": [{"site": SITE}]})):
        ledger.write_text(broken)
        with pytest.raises(PrivacyLedgerError, match=f"privacy ledger {ledger}: cannot be read .*refusing to train"):
            _session(nih_data, workspace, "job-2").trainer  # noqa: B018 - the trainer is built on first use
    assert ledger.read_text() == broken  # left as found, for whoever restores it


@pytest.mark.slow
def test_an_edited_noise_multiplier_is_refused_by_the_job_records(nih_data, tmp_path):
    """The ledger's recorded noise multiplier raised after a job (its steps would then look cheap: the issue measured
    1.438 reported against 1.757 truly spent): the job's record holds a digest of the steps it saw, and the next job
    refuses the ledger, naming what was changed."""
    workspace = tmp_path / SITE
    _train(_session(nih_data, workspace, "job-1"), 0)
    ledger = workspace / "local" / LEDGER_FILE
    values = json.loads(ledger.read_text())
    for entry in values["entries"]:
        entry["history"] = [[noise * 50, rate, steps] for noise, rate, steps in entry["history"]]
    ledger.write_text(json.dumps(values))
    with pytest.raises(PrivacyLedgerError, match=r"a noise multiplier, sample rate, step count, delta, unit or "):
        _session(nih_data, workspace, "job-2").trainer  # noqa: B018
    record = json.loads((workspace / "job-1" / f"app_{SITE}" / SPENT_FILE).read_text())
    assert record["items"] == 1 and len(record["digest"]) == 64


@pytest.mark.slow
def test_a_budget_keeps_its_delta(nih_data, tmp_path):
    """A later job asking for a larger delta would recompute a smaller epsilon for the same steps: refused, naming
    the delta the budget was set at."""
    workspace = tmp_path / SITE
    _train(_session(nih_data, workspace, "job-1"), 0)
    with pytest.raises(SiteConfigError, match=r"its budget was set at delta 1e-05 .*set delta to that value"):
        _session(nih_data, workspace, "job-2", budget={**BUDGET, "delta": 1e-3}).trainer  # noqa: B018


@pytest.mark.slow
def test_the_same_images_exported_again_under_new_patient_ids_inherit_the_spend(nih_data, tmp_path):
    """The images copied to another folder with every patient id changed (a re-pseudonymised export): the training
    split is another set of patients by id, but its images' content is the same, so it inherits the steps spent."""
    workspace = tmp_path / SITE
    _train(_session(nih_data, workspace, "job-1"), 0)
    spent = _ledger_entries(workspace)[0]["history"]
    copy = tmp_path / "exported-again"
    shutil.copytree(nih_data.root, copy)
    table = copy / "Data_Entry_2017.csv"
    frame = pd.read_csv(table)
    frame["Patient ID"] = frame["Patient ID"] + 1000
    frame.to_csv(table, index=False)
    trainer = _session(nih_data, workspace, "job-2", location=copy).trainer
    assert trainer.ledger_file.fingerprint != _ledger_entries(workspace)[0]["fingerprint"]  # other ids
    assert trainer.ledger.inherited == [tuple(item) for item in spent]
    assert trainer.ledger.epsilon(trainer.delta) > 0


@pytest.mark.slow
def test_a_missing_or_rolled_back_ledger_is_refused_when_a_job_took_steps(nih_data, tmp_path):
    """Rolled back, deleted, deleted for a job on a re-split of the data or under a new site name, or deleted in the
    middle of a job: each is refused by the job records of the site's workspace, never read as a fresh budget."""
    workspace = tmp_path / SITE
    _train(_session(nih_data, workspace, "job-1"), 0)
    ledger = workspace / "local" / LEDGER_FILE
    after_one_round = ledger.read_text()
    _train(_session(nih_data, workspace, "job-1"), 1)
    ledger.write_text(after_one_round)  # an old backup put back: 2 steps where job-1 took 4
    with pytest.raises(PrivacyLedgerError, match=r"holds 2 DP-SGD steps for that data, but job record .* says 4"):
        _session(nih_data, workspace, "job-2").trainer  # noqa: B018
    ledger.unlink()
    with pytest.raises(PrivacyLedgerError, match=r"is missing, but job record .*job-1.* says 4 were taken"):
        _session(nih_data, workspace, "job-2").trainer  # noqa: B018
    with pytest.raises(PrivacyLedgerError, match=r"is missing, but job record .*job-1.* says 4 were taken"):
        _session(nih_data, workspace, "job-2", split_seed=1).trainer  # noqa: B018 - other patients, same refusal
    with pytest.raises(PrivacyLedgerError, match=r"is missing, but job record .*job-1.* says 4 were taken"):
        _session(nih_data, workspace, "job-2", site="site-renamed").trainer  # noqa: B018 - the site renamed too
    (workspace / "job-1" / f"app_{SITE}" / SPENT_FILE).unlink()  # a workspace with no record: a fresh start
    running = _session(nih_data, workspace, "job-3")
    _train(running, 0)
    ledger.unlink()  # in the middle of job-3
    with pytest.raises(PrivacyLedgerError, match=r"is missing, but job record .*job-3.* says 2 were taken"):
        _train(running, 1)


def test_training_data_sharing_patients_with_earlier_data_inherits_its_steps(tmp_path):
    """A re-split (or a grown dataset) is a new fingerprint, but its patients already spent budget: their steps
    count. Disjoint data starts afresh; a unit that cannot be derived from the earlier one is refused."""
    settings = DifferentialPrivacy(epsilon=8.0, noise_multiplier=1.0)
    path = tmp_path / "local" / LEDGER_FILE
    first = LedgerFile(path, SITE, [f"p{index}" for index in range(10)], settings)
    with first.transaction() as ledger:
        ledger.record(1.0, 0.1, 100)
    overlapping = LedgerFile(path, SITE, [f"p{index}" for index in range(5, 15)], settings).read()
    assert overlapping.history == [] and overlapping.inherited == [(1.0, 0.1, 100)]
    assert overlapping.epsilon(1e-5) == first.read().epsilon(1e-5) > 0
    disjoint = LedgerFile(path, SITE, [f"q{index}" for index in range(10)], settings).read()
    assert disjoint.inherited == [] and disjoint.epsilon(1e-5) == 0.0
    per_image = DifferentialPrivacy(epsilon=8.0, noise_multiplier=1.0, unit="image")
    with pytest.raises(SiteConfigError, match=r"spent budget per patient .* keep unit 'patient'"):
        LedgerFile(path, SITE, [f"p{index}" for index in range(5, 15)], per_image).read()
    assert "p3" not in path.read_text()  # the ledger holds salted hashes, not the patients' ids
    renamed = LedgerFile(path, "nih-hospital", [f"p{index}" for index in range(5, 15)], settings).read()
    assert renamed.inherited == [(1.0, 0.1, 100)]  # the workspace's budget, whatever the site is called now


def test_a_re_split_cannot_count_inherited_steps_at_a_larger_delta(tmp_path):
    """Steps a site's patients spent at delta 1e-5 count at 1e-5 or below on a re-split of them: dropping one patient
    and asking 1e-3 (11.0 -> 8.2 for the same steps) is refused, a smaller delta is not."""
    settings = DifferentialPrivacy(epsilon=20.0, noise_multiplier=1.0)
    path = tmp_path / "local" / LEDGER_FILE
    patients = [f"p{index}" for index in range(100)]
    with LedgerFile(path, SITE, patients, settings, delta=1e-5).transaction() as ledger:
        ledger.record(1.0, 0.1, 200)
    with pytest.raises(SiteConfigError, match=r"spent budget set at delta 1e-05 .* set delta to at most that value"):
        LedgerFile(path, SITE, patients[1:], settings, delta=1e-3).read()
    stricter = LedgerFile(path, SITE, patients[1:], settings, delta=1e-6).read()
    assert stricter.inherited == [(1.0, 0.1, 200)] and stricter.epsilon(1e-6) > stricter.epsilon(1e-5)


def test_the_ledger_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    settings = DifferentialPrivacy(epsilon=8.0, noise_multiplier=1.0)
    path = tmp_path / "local" / LEDGER_FILE
    ledger_file = LedgerFile(path, SITE, ["p1", "p2"], settings)
    with ledger_file.transaction() as ledger:
        ledger.record(1.0, 0.5, 10)
    before = path.read_text()

    def fail_midway(values, handle, **options):
        handle.write(json.dumps(values)[:20])
        raise OSError("disk full")

    monkeypatch.setattr(privacy_ledger.json, "dump", fail_midway)
    with pytest.raises(OSError, match="disk full"), ledger_file.transaction() as ledger:
        ledger.record(1.0, 0.5, 10)
    monkeypatch.undo()
    assert path.read_text() == before and ledger_file.read().steps == 10


def test_the_readme_states_the_unit_the_ledger_and_what_leaves_un_noised():
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert DifferentialPrivacy().unit == "patient" and "protects each **patient**" in readme
    assert f"`<site workspace>/local/{LEDGER_FILE}`" in readme
    assert "Un-noised, only its validation metrics and handshake leave; its training loss stays home" in readme


def test_the_patient_unit_is_refused_where_each_image_stands_for_its_patient(tmp_path):
    from surgical_aggregation.images.csv_table import load_csv_table
    from surgical_aggregation.training.privacy import refuse_made_up_patients

    (tmp_path / "labels.csv").write_text("path,patient_id,Mass\na.png,p1,1\nb.png,p1,0\n")
    (tmp_path / "no_patients.csv").write_text("path,Mass\na.png,1\nb.png,0\n")
    with_ids = load_csv_table(tmp_path / "labels.csv")
    without = load_csv_table(tmp_path / "no_patients.csv", patient_column=None)
    patient = DifferentialPrivacy(epsilon=3.0, noise_multiplier=1.0)
    image = DifferentialPrivacy(epsilon=3.0, noise_multiplier=1.0, unit="image")
    refuse_made_up_patients(with_ids, patient, "site x")
    refuse_made_up_patients(without, image, "site x")
    with pytest.raises(SiteConfigError, match=r"site x: differential_privacy.unit 'patient' needs patient ids"):
        refuse_made_up_patients(without, patient, "site x")
    assert with_ids.patients_known and not without.patients_known


def test_a_dp_site_does_not_send_exact_label_counts(nih_data, tmp_path):
    session = _session(nih_data, tmp_path / SITE, "job-1")
    with pytest.raises(SiteConfigError, match="exact per-class counts of the training split, which DP-SGD cannot"):
        session.describe(with_label_counts=True)
    assert session.describe().meta  # names and sizes, as every site sends
