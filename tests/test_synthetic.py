"""The embedded data generator: real layouts, deterministic, real label rows, learnable traces."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pandas as pd
import pytest
from scipy.signal import correlate2d
from sklearn.metrics import roc_auc_score

from surgical_aggregation.core.labels import CANONICAL_FINDINGS, CHEXPERT_LABELS
from surgical_aggregation.data.reference import CHEXPERT_LABEL_FILE, NIH_LABEL_FILE
from surgical_aggregation.images.decode import read_grayscale
from surgical_aggregation.images.layouts import load_table
from surgical_aggregation.images.synthetic import (
    MARKER_FILE,
    ensure_generated,
    finding_glyph,
    finding_glyphs,
    generate_chexpert,
    generate_nih,
)

from helpers import require_reference


def _digest(folder) -> str:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER_FILE)
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def test_generation_is_deterministic(tmp_path):
    for kind, generate in (("nih", generate_nih), ("chexpert", generate_chexpert)):
        first = generate(tmp_path / f"{kind}1", n_patients=12, image_size=32, seed=5, label_source="builtin")
        second = generate(tmp_path / f"{kind}2", n_patients=12, image_size=32, seed=5, label_source="builtin")
        other = generate(tmp_path / f"{kind}3", n_patients=12, image_size=32, seed=6, label_source="builtin")
        assert _digest(first.root) == _digest(second.root)
        assert _digest(first.root) != _digest(other.root)


def test_glyphs_are_distinct_even_mirrored():
    glyphs = finding_glyphs()
    assert list(glyphs) == list(CANONICAL_FINDINGS)
    shapes = list(glyphs.values())
    for i, first in enumerate(shapes):
        assert 9 <= first.sum() <= 16
        for second in shapes[i + 1 :]:
            assert np.abs(first - second).sum() >= 8
            assert np.abs(first - second[:, ::-1]).sum() >= 8


def test_a_finding_outside_the_table_gets_a_glyph_of_its_own_from_its_name():
    table = list(finding_glyphs().values())
    tuberculosis = finding_glyph("Tuberculosis")
    assert np.array_equal(tuberculosis, finding_glyph("Tuberculosis"))  # the name alone decides it
    assert not np.array_equal(tuberculosis, finding_glyph("Copd sign"))
    for glyph in (tuberculosis, finding_glyph("Copd sign")):
        assert 9 <= glyph.sum() <= 16
        assert all(np.abs(glyph - other).sum() >= 8 and np.abs(glyph - other[:, ::-1]).sum() >= 8 for other in table)
    assert finding_glyph("Mass") is finding_glyphs()["Mass"]


def test_every_finding_leaves_a_class_specific_trace(nih_data):
    """A matched filter for a finding's glyph detects that finding and not the others."""
    table = load_table("nih", nih_data.root)
    images = np.stack([read_grayscale(p).astype(float) / 255 for p in table.paths])
    images -= images.mean(axis=(1, 2), keepdims=True)
    cell = 32 // 16
    glyphs = finding_glyphs()
    scores = {}
    for name in table.classes:
        template = np.kron(glyphs[name], np.ones((cell, cell)))
        template -= template.mean()
        scores[name] = [
            max(correlate2d(x, template, mode="valid").max(), correlate2d(x, template[:, ::-1], mode="valid").max())
            for x in images
        ]
    own, others = [], []
    for name in table.classes:
        labels = table.frame[name].to_numpy()
        own.append(roc_auc_score(labels, scores[name]))
        others.append(np.mean([roc_auc_score(labels, scores[o]) for o in table.classes if o != name]))
    assert np.mean(own) > 0.85, dict(zip(table.classes, np.round(own, 2), strict=True))
    assert min(own) > 0.6
    assert np.mean(own) - np.mean(others) > 0.25


def test_nih_rows_are_real_rows_with_rare_findings_enriched(tmp_path):
    real = pd.read_csv(require_reference(NIH_LABEL_FILE)).set_index("Image Index")
    dataset = generate_nih(tmp_path, n_patients=80, image_size=16, seed=1, label_source="reference")
    written = pd.read_csv(tmp_path / "Data_Entry_2017.csv").set_index("Image Index")
    assert "real NIH label rows" in dataset.label_origin
    assert (written["Finding Labels"] == real.loc[written.index, "Finding Labels"]).all()
    assert (written["Patient ID"] == real.loc[written.index, "Patient ID"]).all()
    table = load_table("nih", tmp_path)
    per_patient = table.frame.groupby("patient_id")[table.classes].max().sum()
    assert (per_patient >= math.ceil(0.06 * 80)).all(), per_patient.to_dict()  # even Hernia (0.2% of images)


def test_chexpert_rows_are_real_and_valid_csv_is_clean(tmp_path):
    real = pd.read_csv(require_reference(CHEXPERT_LABEL_FILE)).set_index("Path")
    dataset = generate_chexpert(tmp_path, n_patients=40, image_size=16, label_source="reference")
    train = pd.read_csv(dataset.root / "train.csv").set_index("Path")
    valid = pd.read_csv(dataset.root / "valid.csv")
    pd.testing.assert_frame_equal(train, real.loc[train.index], check_dtype=False)
    assert (train[list(CHEXPERT_LABELS)] == -1).any().any()  # uncertain labels kept in train
    assert valid[list(CHEXPERT_LABELS)].isin([0.0, 1.0]).all().all()  # none in valid
    train_patients = set(train.index.str.extract(r"(patient\d+)")[0])
    valid_patients = set(valid["Path"].str.extract(r"(patient\d+)")[0])
    assert valid_patients and not train_patients & valid_patients


def test_ensure_generated_reuses_and_regenerates(tmp_path):
    first, created = ensure_generated("nih", tmp_path, n_patients=6, image_size=16, label_source="builtin")
    assert created and (tmp_path / MARKER_FILE).is_file()
    again, created = ensure_generated("nih", tmp_path, n_patients=6, image_size=16, label_source="builtin")
    assert not created and again == first
    bigger, created = ensure_generated("nih", tmp_path, n_patients=9, image_size=16, label_source="builtin")
    assert created and bigger.n_patients == 9
    assert "embedded nih dataset" in bigger.describe()
    with pytest.raises(ValueError, match="no generator for 'dicom'"):
        ensure_generated("dicom", tmp_path)
