from __future__ import annotations

import pytest

from surgical_aggregation.core.labels import (
    CANONICAL_FINDINGS,
    CHEXPERT_LABELS,
    CXR_LT_LABELS,
    NIH_LABELS,
    NIH_RAW_LABELS,
    UnknownLabelError,
    canonical_name,
    canonical_names,
    dataset_labels,
    union_labels,
)


def test_effusion_and_pleural_effusion_are_one_class():
    assert canonical_name("Effusion") == canonical_name("Pleural Effusion") == "Pleural Effusion"


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("Pleural_Thickening", "Pleural Thickening"),
        ("pleural thickening", "Pleural Thickening"),
        ("  Cardiomegaly ", "Cardiomegaly"),
        ("Opacity", "Lung Opacity"),
        ("Lesion", "Lung Lesion"),
        ("No_Finding", "No Finding"),
        ("Enlarged  Cardiomediastinum", "Enlarged Cardiomediastinum"),
    ],
)
def test_spelling_variants(spelling, canonical):
    assert canonical_name(spelling) == canonical


def test_unknown_name_is_a_clear_error_listing_known_names():
    with pytest.raises(UnknownLabelError) as caught:
        canonical_name("Pleural Efusion", where="site-nih config 'labels'")
    message = str(caught.value)
    assert message.startswith("site-nih config 'labels': unknown label 'Pleural Efusion'")
    for name in CANONICAL_FINDINGS:
        assert name in message


def test_duplicates_after_aliasing_are_an_error():
    with pytest.raises(ValueError, match="'Effusion' duplicates 'Pleural Effusion'"):
        canonical_names(["Pleural Effusion", "Effusion"])


def test_dataset_label_lists():
    assert len(NIH_LABELS) == 14 and len(CHEXPERT_LABELS) == 13 and len(CXR_LT_LABELS) == 25
    assert (NIH_RAW_LABELS[4], NIH_LABELS[4]) == ("Effusion", "Pleural Effusion")
    assert (NIH_RAW_LABELS[11], NIH_LABELS[11]) == ("Pleural_Thickening", "Pleural Thickening")
    assert [a == b for a, b in zip(NIH_RAW_LABELS, NIH_LABELS, strict=True)].count(False) == 2
    assert all(name in CANONICAL_FINDINGS for name in NIH_LABELS + CHEXPERT_LABELS)
    assert dataset_labels("NIH") == NIH_LABELS
    with pytest.raises(ValueError, match="unknown dataset kind 'padchest'"):
        dataset_labels("padchest")


def test_nih_chexpert_union_has_20_labels_7_shared():
    union = union_labels(NIH_LABELS, CHEXPERT_LABELS)
    shared = set(NIH_LABELS) & set(CHEXPERT_LABELS)
    assert len(union) == 20
    assert shared == {
        "Atelectasis",
        "Cardiomegaly",
        "Consolidation",
        "Edema",
        "Pleural Effusion",
        "Pneumonia",
        "Pneumothorax",
    }
    assert union[:14] == list(NIH_LABELS)  # order of first appearance
    assert set(union) <= set(CXR_LT_LABELS)
