"""The embedded data generator: real layouts, deterministic, real label rows, learnable traces."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from surgical_aggregation.core.labels import (
    BUILTIN_VOCABULARY,
    CANONICAL_FINDINGS,
    CHEXPERT_LABELS,
    NIH_LABELS,
    NIH_RAW_LABELS,
)
from surgical_aggregation.data.reference import CHEXPERT_LABEL_FILE, NIH_LABEL_FILE
from surgical_aggregation.experiments.pretraining import Pretraining, shipped_stand_in
from surgical_aggregation.images.decode import read_grayscale
from surgical_aggregation.images.glyph_features import raw_glyph_features
from surgical_aggregation.images.layouts import load_table
from surgical_aggregation.images.names import PADCHEST_ROWS, SHARED_ROWS
from surgical_aggregation.images.public import PUBLIC_DATASETS, read_public_labels
from surgical_aggregation.images.synthetic import (
    MARKER_FILE,
    PATTERN_STRENGTH,
    ensure_generated,
    generate_chexpert,
    generate_nih,
    generate_patterns,
    read_shown,
)
from surgical_aggregation.images.synthetic_labels import (
    MAIN_UNION,
    STREAM_CODES,
    DonorRows,
    finding_donors,
    nih_label_rows,
    padchest_rows,
    shown_findings,
)
from surgical_aggregation.images.synthetic_pixels import PATTERN_COUNT, finding_glyph, finding_glyphs, pattern_glyphs
from surgical_aggregation.training.profiles import STAND_IN_PRETRAINING

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


def test_every_finding_leaves_a_class_specific_trace(tmp_path):
    """Each finding's glyph detector (normalised correlation at its best place) finds that finding and not the
    others, through the clutter: the images carry what a network can learn (not perfectly: glyphs overlap one
    another, the heart shadow and the clutter)."""
    dataset = generate_nih(tmp_path, n_patients=150, image_size=64, label_source="builtin")
    table = load_table("nih", dataset.root)
    images = torch.from_numpy(np.stack([read_grayscale(path) for path in table.paths])).unsqueeze(1)
    scores = raw_glyph_features(images).numpy()
    column = {name: index for index, name in enumerate(finding_glyphs())}
    own, others = [], []
    for name in table.classes:
        labels = table.frame[name].to_numpy()
        own.append(roc_auc_score(labels, scores[:, column[name]]))
        others.append(np.mean([roc_auc_score(labels, scores[:, column[o]]) for o in table.classes if o != name]))
    assert np.mean(own) > 0.75, dict(zip(table.classes, np.round(own, 2), strict=True))
    assert min(own) > 0.5
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


NIH_ONLY = [name for name in MAIN_UNION if name not in CHEXPERT_LABELS]
CHEXPERT_ONLY = [name for name in MAIN_UNION if name not in NIH_LABELS]


def test_images_show_the_findings_their_layout_does_not_label(tmp_path):
    """Missing, not absent: NIH-layout images show CheXpert-only findings its label file has no column for, and
    CheXpert-layout images NIH-only ones; the findings a layout labels are drawn exactly as labelled."""
    require_reference(NIH_LABEL_FILE)
    nih = generate_nih(tmp_path / "nih", n_patients=150, image_size=16, seed=2)
    shown, table = read_shown(nih.root), load_table("nih", nih.root)
    assert (shown[CHEXPERT_ONLY] > 0).any(axis=1).mean() > 0.3
    assert not set(CHEXPERT_ONLY) & set(table.classes)
    by_path = shown.set_index("path")
    for name in NIH_LABELS:  # labelled findings: the glyph is there exactly when the label says so
        drawn = by_path.loc[[str(Path(p).relative_to(nih.root)) for p in table.paths], name] > 0
        assert (drawn.to_numpy() == (table.frame[name] == 1).to_numpy()).all(), name
    chexpert = generate_chexpert(tmp_path / "chexpert", n_patients=150, image_size=16, seed=2)
    assert (read_shown(chexpert.root)[NIH_ONLY] > 0).any(axis=1).mean() > 0.1


def test_the_external_set_labels_all_20_findings_of_the_main_job(mimic_data):
    table = load_table("mimic", mimic_data.root)
    assert set(table.classes) == set(MAIN_UNION)
    assert (table.frame[NIH_ONLY] == 1).any().sum() >= 3  # the NIH-only columns hold positives


def test_a_donor_row_agrees_with_the_shared_findings_it_is_given():
    rng = np.random.default_rng(0)
    shared = ["Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Pleural Effusion", "Pneumonia", "Pneumothorax"]
    values = np.zeros((4, len(NIH_LABELS)), np.float32)
    columns = {name: NIH_LABELS.index(name) for name in NIH_LABELS}
    values[0, columns["Edema"]] = values[0, columns["Mass"]] = 1  # the only row with Edema
    values[1:, columns["Nodule"]] = 1
    donors = DonorRows(NIH_LABELS, values)
    for _ in range(20):
        assert donors.draw({"Edema": 1.0}, ["Mass", "Nodule"], rng) == {"Mass": 1.0, "Nodule": 0.0}
        assert donors.draw({"Edema": 0.0, "Atelectasis": 0.0}, ["Mass", "Nodule"], rng) == {"Mass": 0.0, "Nodule": 1.0}
    # no row has Edema and Pneumothorax: the rarer positive is let go, and a row with Edema is copied
    assert donors.draw({"Edema": 1.0, "Pneumothorax": 1.0}, ["Mass"], rng) == {"Mass": 1.0}
    assert set(shared) <= set(NIH_LABELS)


def test_a_donor_row_can_condition_on_findings_other_than_the_shared_ones():
    """PadChest's rows condition on every finding they label: a row must agree with the image on Mass too."""
    rng = np.random.default_rng(0)
    labels = ["Mass", "Nodule", "Lung Lesion"]
    values = np.array([[1, 0, 1], [0, 1, 1], [0, 0, 0]], np.float32)
    donors = DonorRows(labels, values, conditioning=labels)
    for _ in range(20):
        assert donors.draw({"Mass": 1.0, "Nodule": 0.0}, ["Lung Lesion"], rng) == {"Lung Lesion": 1.0}
        assert donors.draw({"Mass": 0.0, "Nodule": 0.0}, ["Lung Lesion"], rng) == {"Lung Lesion": 0.0}
    # no row has Mass and Nodule: the rarer positive (Mass and Nodule tie: the first in order) is let go
    assert donors.draw({"Mass": 1.0, "Nodule": 1.0}, ["Lung Lesion"], rng) == {"Lung Lesion": 1.0}


def test_padchest_rows_draw_findings_that_co_occur_across_the_two_vocabularies():
    """With co_occurrence "padchest" a NIH-layout image with Mass always shows Lung Lesion (every PadChest name with
    "mass" is a lung lesion by the CheXpert labeler's phrases), a CheXpert-layout image without Lung Lesion never
    shows Mass, and one with Lung Opacity shows Infiltration far more often than one without; drawn given the shared
    findings only (the default), the two vocabularies are independent. Enlarged Cardiomediastinum, which no PadChest
    name says, stays with CheXpert's rows."""
    require_reference(NIH_LABEL_FILE)
    require_reference(PUBLIC_DATASETS["padchest"].reference)
    joint, shared = finding_donors(True, PADCHEST_ROWS), finding_donors(True, SHARED_ROWS)
    assert len(padchest_rows().strengths) == 109_581  # docs/data.md: PadChest's frontal images its loader keeps
    assert set(MAIN_UNION) - {name for name, donor in joint.items() if donor is padchest_rows()} == {
        "Enlarged Cardiomediastinum"
    }
    rng = np.random.default_rng(0)
    nih_mass = {name: float(name == "Mass") for name in NIH_LABELS}
    lesion = [shown_findings(nih_mass, NIH_LABELS, joint, rng).get("Lung Lesion", 0) for _ in range(200)]
    assert all(value == 1 for value in lesion)
    lesion = [shown_findings(nih_mass, NIH_LABELS, shared, rng).get("Lung Lesion", 0) for _ in range(200)]
    assert np.mean(lesion) < 0.2
    quiet = {name: 0.0 for name in CHEXPERT_LABELS}
    opacity = {**quiet, "Lung Opacity": 1.0}
    assert all("Mass" not in shown_findings(quiet, CHEXPERT_LABELS, joint, rng) for _ in range(200))
    with_opacity = np.mean(
        [shown_findings(opacity, CHEXPERT_LABELS, joint, rng).get("Infiltration", 0) for _ in range(200)]
    )
    without = np.mean([shown_findings(quiet, CHEXPERT_LABELS, joint, rng).get("Infiltration", 0) for _ in range(200)])
    assert with_opacity > 0.5 > 0.05 > without


def _benchmark_nih_draws(co_occurrence: str) -> pd.DataFrame:
    """What each image of the benchmark's NIH-layout dataset (1,600 patients, seed 0) shows, 0/1, drawn as
    ``generate_nih`` draws it (its label rows, its donor stream) without rendering the images."""
    rows, _ = nih_label_rows(1600, 0)
    donors, rng = finding_donors(True, co_occurrence), np.random.default_rng([0, STREAM_CODES["nih"], 2])
    raw_to_name = dict(zip(NIH_RAW_LABELS, NIH_LABELS, strict=True))
    shown = []
    for findings in rows["Finding Labels"]:
        labelled = {name: float(raw in findings.split("|")) for raw, name in raw_to_name.items()}
        drawn = shown_findings(labelled, NIH_LABELS, donors, rng)
        shown.append({name: float(drawn.get(name, 0) > 0) for name in MAIN_UNION})
    return pd.DataFrame(shown)


def test_the_data_pages_co_occurrence_figures_are_the_benchmark_datasets_draws():
    """docs/data.md's figures for the two ways of drawing unlabelled findings, recomputed here."""
    require_reference(NIH_LABEL_FILE)
    require_reference(PUBLIC_DATASETS["padchest"].reference)
    page = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    page = " ".join(page.split())
    figures = {}
    for rule in (PADCHEST_ROWS, SHARED_ROWS):
        shown = _benchmark_nih_draws(rule)
        figures[rule] = {
            "lesion": shown.loc[shown["Mass"] == 1, "Lung Lesion"].mean(),
            "opacity": shown.loc[shown["Infiltration"] == 1, "Lung Opacity"].mean(),
            "devices": shown["Support Devices"].mean(),
            "any opacity": shown["Lung Opacity"].mean(),
        }
    joint, shared = figures[PADCHEST_ROWS], figures[SHARED_ROWS]
    table, rows = padchest_rows(), nih_label_rows(1600, 0)[0]
    bits = {raw: 1 << table.conditioning.index(name) for raw, name in zip(NIH_RAW_LABELS, NIH_LABELS, strict=True)}
    nih_mask = sum(bits.values())
    keys = [sum(bits[raw] for raw in found.split("|") if raw in bits) for found in rows["Finding Labels"]]
    agreeing = set((table.codes & nih_mask).tolist())
    unmatched = sum(key not in agreeing for key in keys) / len(keys)
    expected = (
        f"with Mass shows Lung Lesion {joint['lesion']:.0%} of the time ({shared['lesion']:.0%} given the shared "
        f"findings) and one with Infiltration Lung Opacity {joint['opacity']:.0%} ({shared['opacity']:.0%})",
        f"(Support Devices {joint['devices']:.0%} instead of CheXpert's {shared['devices']:.0%}, Lung Opacity "
        f"{joint['any opacity']:.0%} instead of {shared['any opacity']:.0%}). {unmatched:.1%} of those images have no "
        "PadChest row agreeing on all 14 findings",
    )
    for sentence in expected:
        assert sentence.replace("%", " %") in page, sentence


def test_a_generated_dataset_says_how_its_unlabelled_findings_were_drawn(tmp_path):
    require_reference(PUBLIC_DATASETS["padchest"].reference)
    dataset = generate_nih(tmp_path / "nih", n_patients=20, image_size=16, seed=1, co_occurrence=PADCHEST_ROWS)
    assert "unlabelled findings drawn from PadChest's rows" in dataset.describe()
    with pytest.raises(ValueError, match="unknown co_occurrence 'pairs'"):
        generate_nih(tmp_path / "bad", n_patients=20, image_size=16, seed=1, co_occurrence="pairs")
    with pytest.raises(ValueError, match="'padchest' draws from real label rows, not with label_source 'builtin'"):
        generate_nih(tmp_path / "builtin", 20, 16, 1, label_source="builtin", co_occurrence=PADCHEST_ROWS)


def test_the_absent_control_leaves_out_exactly_the_named_findings(tmp_path):
    missing = generate_nih(tmp_path / "missing", n_patients=60, image_size=32, seed=4, label_source="builtin")
    absent = generate_nih(
        tmp_path / "absent",
        n_patients=60,
        image_size=32,
        seed=4,
        label_source="builtin",
        absent=["Mass", "Lung Opacity"],
    )
    before, after = read_shown(missing.root).set_index("path"), read_shown(absent.root).set_index("path")
    assert after.get("Mass", pd.Series(0)).eq(0).all() and after.get("Lung Opacity", pd.Series(0)).eq(0).all()
    untouched = before[(before.get("Mass", 0) == 0) & (before.get("Lung Opacity", 0) == 0)].index
    assert 0 < len(untouched) < len(before)
    for path in before.index:  # the same draws: an image without those findings is the same image
        same = np.array_equal(read_grayscale(missing.root / path), read_grayscale(absent.root / path))
        assert same == (path in untouched), path
    assert load_table("nih", absent.root).frame["Mass"].sum() == 0  # and the label file says so
    assert load_table("nih", missing.root).frame["Mass"].sum() > 0


def test_the_stand_ins_patterns_are_no_findings_drawing():
    """The stand-in's vocabulary: glyph-like 5x5 shapes (so that its features transfer), 8 cells or more from every
    built-in finding's glyph (as findings of the table lie from each other) and its mirror image; the public
    datasets' own findings (glyphs derived from their names) are none of them either."""
    patterns = list(pattern_glyphs().values())
    assert len(patterns) == PATTERN_COUNT == 32
    assert all(p.shape == (5, 5) and 9 <= p.sum() <= 16 for p in patterns)
    for i, first in enumerate(patterns):
        for second in patterns[i + 1 :]:
            assert np.abs(first - second).sum() >= 6 and np.abs(first - second[:, ::-1]).sum() >= 6

    def nearest(glyph: np.ndarray) -> float:
        return min(min(np.abs(p - glyph).sum(), np.abs(p[:, ::-1] - glyph).sum()) for p in patterns)

    builtin = set(CANONICAL_FINDINGS) | set(BUILTIN_VOCABULARY.findings())
    assert {"Mass", "Lung Lesion", "Support Devices", "Hernia"} <= builtin
    assert min(nearest(finding_glyph(name)) for name in builtin) >= 8
    public = set()
    for kind, dataset in PUBLIC_DATASETS.items():
        _, parsed = read_public_labels(kind, require_reference(dataset.reference))
        public |= set(parsed.columns) - {"key", "patient_id", "path"}
    assert len(public - builtin) > 150  # PadChest's findings
    assert min(nearest(finding_glyph(name)) for name in public) >= 2


def test_the_patterns_brightness_changes_only_the_patterns(tmp_path):
    """``generate_patterns(strength=...)`` (the stand-in's brightness, a probe's option): the same labels, and the same
    pixels wherever no pattern is drawn; a pattern drawn at half the brightness adds less. The default strength's
    images are the default's (so every cached stand-in stays valid)."""
    default = generate_patterns(tmp_path / "default", n_images=40, image_size=32, seed=2)
    same = generate_patterns(tmp_path / "same", 40, 32, 2, (PATTERN_STRENGTH, PATTERN_STRENGTH))
    faint = generate_patterns(tmp_path / "faint", 40, 32, 2, (PATTERN_STRENGTH / 2, PATTERN_STRENGTH / 2))
    labels = pd.read_csv(default)
    pd.testing.assert_frame_equal(labels, pd.read_csv(faint))
    drawn = labels.drop(columns=["path", "patient_id"]).sum(axis=1)
    assert (drawn == 0).sum() == 2  # both kinds of image in 40
    for path, count in zip(labels["path"], drawn, strict=True):
        image = read_grayscale(default.parent / path).astype(int)
        assert np.array_equal(image, read_grayscale(same.parent / path))
        dimmer = read_grayscale(faint.parent / path).astype(int)
        assert np.array_equal(image, dimmer) == (count == 0), path
        if count:
            assert (image - dimmer).sum() > 0, path


def test_a_larger_pattern_vocabulary_begins_with_the_default_and_keeps_its_images_as_busy(tmp_path):
    """``--pretraining-shapes`` (a probe's lever): 128 shapes, the default's 32 first, each as far from the others and
    from every built-in finding as the default's; each rarer, so that an image shows about as many shapes; the
    stand-in's name says so, and the default's name (the shipped file's) is unchanged."""
    default, larger = pattern_glyphs(), pattern_glyphs(128)
    assert len(larger) == 128 and list(larger)[:2] == ["Pattern 001", "Pattern 002"]
    assert all(np.array_equal(a, b) for a, b in zip(default.values(), list(larger.values())[:32], strict=False))
    shapes = list(larger.values())
    for i, first in enumerate(shapes):
        for second in shapes[i + 1 :]:
            assert np.abs(first - second).sum() >= 6 and np.abs(first - second[:, ::-1]).sum() >= 6
    for name in BUILTIN_VOCABULARY.findings():
        glyph = finding_glyph(name)
        assert min(min(np.abs(p - glyph).sum(), np.abs(p[:, ::-1] - glyph).sum()) for p in shapes) >= 8, name
    few = pd.read_csv(generate_patterns(tmp_path / "few", 400, 32, 2)).drop(columns=["path", "patient_id"])
    many = pd.read_csv(generate_patterns(tmp_path / "many", 400, 32, 2, shapes=128)).drop(
        columns=["path", "patient_id"]
    )
    assert few.shape[1] == 32 and many.shape[1] == 128
    assert 2.6 < few.sum(axis=1).mean() < 3.2 and 2.6 < many.sum(axis=1).mean() < 3.2
    assert shipped_stand_in(Pretraining(64, **STAND_IN_PRETRAINING, shapes=32)) is not None
    assert Pretraining(64, 10000, 8, shapes=128).name == Pretraining(64, 10000, 8).name + "-shapes128"
    assert "of 128 glyph-like shapes" in Pretraining(64, 10000, 8, shapes=128).describe()


def test_a_fixed_count_of_shapes_an_image_changes_only_which_shapes(tmp_path):
    """``--shapes-per-image`` (a probe's lever): every image shows exactly that many shapes, so their count says
    nothing about which; the default's labels (the shipped stand-in's) are untouched, and the name says so."""
    default = pd.read_csv(generate_patterns(tmp_path / "default", 60, 32, 2)).drop(columns=["path", "patient_id"])
    fixed = pd.read_csv(generate_patterns(tmp_path / "fixed", 60, 32, 2, per_image=3)).drop(
        columns=["path", "patient_id"]
    )
    assert default.sum(axis=1).nunique() > 2  # counts vary by default
    assert (fixed.sum(axis=1) == 3).all() and (fixed.sum(axis=0) > 0).sum() > 20  # three each, many shapes used
    with pytest.raises(ValueError, match="per_image = 33"):
        generate_patterns(tmp_path / "too many", 2, 32, 2, per_image=33)
    assert Pretraining(64, 10000, 8, shapes_per_image=3).name == Pretraining(64, 10000, 8).name + "-each3"
    assert "shapes_per_image" not in Pretraining(64, 10000, 8).settings()
    assert "exactly 3 an image" in Pretraining(64, 10000, 8, shapes_per_image=3).describe()
