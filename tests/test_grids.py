"""Simulated federations: label subsets for a heterogeneity psi, IID patient partitions, subsampling."""

from __future__ import annotations

from fractions import Fraction

import pytest

from surgical_aggregation.core.errors import SiteConfigError
from surgical_aggregation.core.labels import NIH_LABELS
from surgical_aggregation.data.table import PATIENT_COLUMN
from surgical_aggregation.experiments.grids import (
    ABSENT,
    MISSING,
    PSI_VALUES,
    DataSources,
    assign_label_sets,
    dataset_identity,
    grid_settings,
    nih_chexpert,
    shared_labels,
)
from surgical_aggregation.experiments.planning import site_label_counts
from surgical_aggregation.images.synthetic_labels import MAIN_UNION
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.profiles import PROFILES
from surgical_aggregation.training.site_data import resolve_table, split_table


@pytest.mark.parametrize("n_sites", [2, 4, 10])
@pytest.mark.parametrize("psi", PSI_VALUES)
def test_label_sets_have_exactly_the_requested_shared_labels_and_cover_every_class(n_sites, psi):
    if psi == 1 and n_sites > 14:
        pytest.skip("not enough labels")
    label_sets = assign_label_sets(NIH_LABELS, n_sites, psi, seed=3)
    unique = psi * 14
    assert unique.denominator == 1
    assert len(shared_labels(label_sets)) == 14 - unique.numerator
    held = [name for labels in label_sets for name in labels]
    assert set(held) == set(NIH_LABELS)  # every class is held somewhere
    for name in set(NIH_LABELS) - set(shared_labels(label_sets)):
        assert held.count(name) == 1  # a non-shared label has exactly one holder
    for labels in label_sets:
        assert labels and labels == [name for name in NIH_LABELS if name in labels]  # dataset order
    assert assign_label_sets(NIH_LABELS, n_sites, psi, seed=3) == label_sets  # deterministic


def test_label_set_errors():
    with pytest.raises(ValueError, match="not a whole number of the 14 labels"):
        assign_label_sets(NIH_LABELS, 4, Fraction(1, 3))
    with pytest.raises(ValueError, match="some site would have none"):
        assign_label_sets(NIH_LABELS, 15, 1)
    with pytest.raises(ValueError, match="needs at least two sites"):
        assign_label_sets(NIH_LABELS, 1, Fraction(2, 14))


def _sites(nih_data, n_sites: int, fraction: float = 1.0, labels=None):
    return [
        site_config_from_dict(
            {
                "data": {
                    "kind": "nih",
                    "location": str(nih_data.root),
                    "labels": labels[index] if labels else None,
                    "partition_count": n_sites,
                    "partition_index": index,
                    "train_subsample": fraction,
                }
            }
        )
        for index in range(n_sites)
    ]


def _patients(table) -> set[str]:
    return set(table.frame[PATIENT_COLUMN])


def test_partitions_are_disjoint_iid_parts_with_a_common_test_set(nih_data):
    whole = site_config_from_dict({"data": {"kind": "nih", "location": str(nih_data.root)}})
    full = split_table(resolve_table(whole), whole)
    label_sets = assign_label_sets(NIH_LABELS, 3, Fraction(12, 14))
    parts = [split_table(resolve_table(config), config) for config in _sites(nih_data, 3, labels=label_sets)]
    for split in ("train", "val"):
        patients = [_patients(part[split]) for part in parts]
        assert set().union(*patients) == _patients(full[split])  # together: the whole split
        assert sum(len(p) for p in patients) == len(_patients(full[split]))  # no patient at two sites
        assert max(len(p) for p in patients) - min(len(p) for p in patients) <= 2  # equal shares
    for part in parts:  # the label subsets do not move any patient: one common held-out test set
        assert _patients(part["test"]) == _patients(full["test"])
    halves = [split_table(resolve_table(c), c) for c in _sites(nih_data, 3, fraction=0.5, labels=label_sets)]
    for half, part in zip(halves, parts, strict=True):
        assert _patients(half["train"]) < _patients(part["train"])
        assert abs(len(_patients(half["train"])) - len(_patients(part["train"])) / 2) <= 1
        assert _patients(half["val"]) == _patients(part["val"])


def test_partition_fields_are_validated():
    with pytest.raises(ValueError, match=r"data.partition_index must be in \[0, partition_count=2\), got 2"):
        site_config_from_dict({"data": {"partition_count": 2, "partition_index": 2}})
    with pytest.raises(ValueError, match=r"data.train_subsample must be in \(0, 1\]"):
        site_config_from_dict({"data": {"train_subsample": 0}})


def test_grids_follow_the_papers_with_a_psi_0_control():
    sources, profile = DataSources(), PROFILES["demo"]
    k_grid = grid_settings("K", sources, profile)
    assert [(s.factor, len(s.sites)) for s in k_grid] == [("K", k) for k in (2, 3, 4, 5, 6, 8, 10)] + [("psi", 4)]
    assert [len(s.shared_classes) for s in k_grid] == [10] * 7 + [14]
    psi_grid = grid_settings("psi", sources, profile)
    assert [len(s.shared_classes) for s in psi_grid] == [14, 12, 8, 4, 2, 1, 0]
    assert all(len(s.sites) == 4 for s in psi_grid)
    n_grid = grid_settings("N", sources, profile)
    fractions = [s.sites["site-1"]["data"]["train_subsample"] for s in n_grid]
    assert fractions == [1 / 10, 1 / 8, 1 / 6, 1 / 4, 1 / 3, 1 / 2, 1]
    assert [len(s.shared_classes) for s in n_grid] == [10] * 6 + [14] and all(len(s.sites) == 2 for s in n_grid)
    both = grid_settings("psi", sources, profile, (MISSING, ABSENT))
    assert [s.control for s in both] == [MISSING] * 7 + [ABSENT] * 7
    assert [s.name for s in both[7:]] == [f"{s.name}-absent" for s in psi_grid]
    for setting in psi_grid:
        for config in setting.sites.values():
            site_config_from_dict(config)  # every generated config is valid
        assert [t.name for t in setting.test_sets] == ["nih", "mimic"]
    seven = nih_chexpert(True, sources, profile)
    assert seven.label_sets["site-nih"] == seven.shared_classes and len(seven.shared_classes) == 7
    twenty = nih_chexpert(False, sources, profile)
    assert len(set().union(*map(set, twenty.label_sets.values()))) == 20 and len(twenty.shared_classes) == 7


def test_the_paper_profiles_sites_train_the_papers_recipe():
    """Adam at 5e-5 after a 15-epoch head warm-up at 5e-3 (the papers'; their public code's 1e-3 is the site
    config's default), 1 local epoch, batch 64, 224 px, 70/10/20 by patient."""
    config = site_config_from_dict(PROFILES["paper"].site_config({"kind": "nih"}))
    assert (config.learning_rate, config.warmup_epochs, config.warmup_learning_rate) == (5e-5, 15, 5e-3)
    assert (config.local_epochs, config.batch_size, config.settings.image_size) == (1, 64, 224)
    assert list(config.data.split_fractions) == [0.7, 0.1, 0.2]
    assert site_config_from_dict({}).warmup_learning_rate == 1e-3


def test_each_seed_draws_the_label_sets_split_and_partition_anew():
    base = grid_settings("small", DataSources(), PROFILES["demo"])[1]  # psi = 12/14
    seeds = [base.for_seed(seed) for seed in range(4)]
    drawn = [list(setting.label_sets.values()) for setting in seeds]
    assert drawn == [assign_label_sets(NIH_LABELS, 4, Fraction(12, 14), seed) for seed in range(4)]
    assert len({str(labels) for labels in drawn}) == 4  # four draws, four label assignments
    for seed, setting in enumerate(seeds):
        assert [config["data"]["labels"] for config in setting.sites.values()] == drawn[seed]
        assert {config["data"]["split_seed"] for config in setting.sites.values()} == {seed}
        assert {test.config["data"].get("split_seed") for test in setting.test_sets if test.split == "test"} == {seed}
        assert len(setting.shared_classes) == 2
        assert not any(config["embedded"].get("absent") for config in setting.sites.values())  # missing: nothing out
    assert base.sites["site-1"]["data"]["labels"] == base.label_sets["site-1"]  # the base itself is untouched
    identities = {dataset_identity(config) for config in base.sites.values()}
    assert identities == {"nih:embedded-400p-64px-s0"}  # one dataset, dealt to the sites (and tested on its split)


def test_the_absent_control_leaves_each_sites_unlabelled_findings_out_of_its_images():
    absent = grid_settings("small", DataSources(), PROFILES["demo"], (ABSENT,))[1].for_seed(2)
    for site, config in absent.sites.items():  # the federation's classes it does not label (NIH's 14, at psi 12/14)
        assert config["embedded"]["absent"] == sorted(set(NIH_LABELS) - set(absent.label_sets[site]))
        assert not set(config["embedded"]["absent"]) & set(MAIN_UNION[len(NIH_LABELS) :])  # CheXpert's stay
    everyone = grid_settings("small", DataSources(), PROFILES["demo"], (ABSENT,))[0].for_seed(2)  # psi = 0
    assert all(config["embedded"]["absent"] == [] for config in everyone.sites.values())  # the same as missing
    real = grid_settings("small", DataSources(nih="/data/nih"), PROFILES["demo"], (ABSENT,))[1]
    with pytest.raises(SiteConfigError, match="absent control needs embedded data"):
        real.for_seed(0)


def test_site_label_counts(nih_data):
    sources = DataSources(nih=str(nih_data.root))
    setting = grid_settings("psi", sources, PROFILES["demo"])[4]  # psi = 12/14
    table = resolve_table(site_config_from_dict({"data": {"kind": "nih", "location": str(nih_data.root)}}))
    counts = site_label_counts(setting, table)
    train = counts[counts.split == "train"]
    assert set(train.site) == set(setting.sites)
    for site, labels in setting.label_sets.items():
        assert list(train[train.site == site].class_name) == labels
    whole = site_config_from_dict(
        {"data": {"kind": "nih", "location": str(nih_data.root), "split_fractions": [0.6, 0.2, 0.2]}}
    )
    assert train.groupby("site")["images"].first().sum() == len(split_table(table, whole)["train"])
