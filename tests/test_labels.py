from __future__ import annotations

import json
import logging

import pytest

from surgical_aggregation.core.errors import AliasFileError
from surgical_aggregation.core.labels import (
    ALIASES,
    BUILTIN_FINDINGS,
    BUILTIN_VOCABULARY,
    CHEXPERT_LABELS,
    CXR_LT_LABELS,
    NIH_LABELS,
    NIH_RAW_LABELS,
    UnknownLabelError,
    Vocabulary,
    dataset_labels,
    read_alias_file,
    union_labels,
)

canonical_name = BUILTIN_VOCABULARY.canonical  # the names every process agrees on, with no alias added
canonical_names = BUILTIN_VOCABULARY.canonical_list


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


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("Nodules", "Nodule"),
        ("Masses", "Mass"),
        ("Opacities", "Lung Opacity"),
        ("pleural-effusions", "Pleural Effusion"),
        ("Support Device", "Support Devices"),
        ("Atelectasis", "Atelectasis"),  # a final "is", "ss" or "us" is not a plural
        ("Hernias", "Hernia"),
        # other datasets' spellings
        ("pulmonary fibrosis", "Fibrosis"),  # PadChest, VinDr-CXR
        ("hiatal hernia", "Hernia"),  # PadChest
        ("infiltrates", "Infiltration"),  # PadChest
        ("normal", "No Finding"),  # PadChest, Open-i
        ("ILD", "Interstitial Lung Disease"),  # VinDr-CXR
        ("Nodule/Mass", "Nodule or Mass"),  # VinDr-CXR
        ("Nodule or mass", "Nodule or Mass"),  # Google's NIH relabelling
        ("Airspace opacity", "Lung Opacity"),  # Google's NIH relabelling
        ("Aortic enlargement", "Aortic Enlargement"),  # VinDr-CXR
    ],
)
def test_plural_forms_and_other_datasets_spellings(spelling, canonical):
    assert canonical_name(spelling) == canonical


def test_names_that_differ_in_meaning_stay_apart():
    apart = ["Nodule or Mass", "Nodule", "Mass", "Lung Opacity", "Consolidation", "Calcification"]
    assert canonical_names(apart) == apart
    assert canonical_name("Calcification") != canonical_name("Calcification of the Aorta")


def test_a_name_outside_the_vocabulary_is_a_class_of_its_own_logged_once(caplog):
    caplog.set_level(logging.INFO, logger="surgical_aggregation.core.labels")
    spellings = ["Miliary pattern", "miliary_patterns", " MILIARY  PATTERN "]  # a name no other test uses
    assert {canonical_name(name, "site-x labels") for name in spellings} == {"Miliary pattern"}
    logged = [record.getMessage() for record in caplog.records]
    assert logged == ["site-x labels: label 'Miliary pattern' is outside the built-in vocabulary: a class of its own"]
    # one spelling for every site: the class is named by its normal form, whatever case a site used
    assert canonical_name("Aortic elongation") == canonical_name("AORTIC ELONGATIONS") == "Aortic elongation"
    assert canonical_name("Ascites") == "Ascites" and canonical_name("gas") == "Gas"  # not plurals


def test_a_list_logs_its_new_classes_in_one_line(caplog):
    caplog.set_level(logging.INFO, logger="surgical_aggregation.core.labels")
    names = ["Mass", "zebra stripes", "Quux shadow"]  # names no dataset or other test uses: logged once a process
    assert canonical_names(names, "hospital.csv") == ["Mass", "Zebra stripe", "Quux shadow"]
    assert [record.getMessage() for record in caplog.records] == [
        "hospital.csv: 2 labels are outside the built-in vocabulary, each a class of its own: "
        "'zebra stripes' -> the class 'Zebra stripe'; 'Quux shadow'"
    ]


def test_a_near_miss_of_a_known_name_is_its_own_class_with_a_hint(caplog):
    caplog.set_level(logging.INFO, logger="surgical_aggregation.core.labels")
    assert canonical_name("Pleural Efusion") == "Pleural efusion"
    assert "(close to ['Pleural Effusion']: a misspelling? add an alias)" in caplog.text


def test_every_built_in_name_and_alias_is_stable_under_canonicalisation():
    for name in [*BUILTIN_FINDINGS, *ALIASES]:
        canonical = canonical_name(name)
        assert canonical in BUILTIN_FINDINGS and canonical_name(canonical) == canonical
    assert len(BUILTIN_FINDINGS) == 31 and BUILTIN_FINDINGS[:26] == tuple(sorted((*CXR_LT_LABELS, "No Finding")))


def test_added_aliases_win_over_the_built_in_ones_and_the_job_over_the_site():
    assert canonical_name("Opacity") == "Lung Opacity"
    job = Vocabulary([({"Opacity": "Consolidation"}, "job aliases")])
    assert job.canonical("Opacity") == job.canonical("opacities") == "Consolidation"
    assert job.canonical("Lung Opacity") == "Lung Opacity"  # only the alias moved
    layered = Vocabulary([({"TB": "Tuberculosis", "BB": "Bulla"}, "site"), ({"TB": "Mycobacterial infection"}, "job")])
    assert (layered.canonical("TB"), layered.canonical("bb")) == ("Mycobacterial infection", "Bulla")
    # chains resolve to their end, so every canonical name stays canonical
    chained = Vocabulary([({"TB": "Tuberculosis"}, "site"), ({"Tuberculosis": "Mycobacterial infection"}, "job")])
    assert chained.canonical("TB") == chained.canonical("Mycobacterial infection") == "Mycobacterial infection"
    with pytest.raises(AliasFileError, match=r"the aliases of .* lead back to it"):
        Vocabulary([({"A": "B", "B": "C", "C": "A"}, "job aliases")])


def test_a_vocabulary_is_a_value_a_site_config_carries_and_no_process_wide_state():
    from surgical_aggregation.training.config import site_config_from_dict

    values = {"data": {"kind": "nih", "label_aliases": {"BB": "Bulla"}}}
    site = site_config_from_dict(values, job_aliases={"TB": "Tuberculosis"})
    assert site.vocabulary.canonical_list(["TB", "BB", "Mass"]) == ["Tuberculosis", "Bulla", "Mass"]
    assert canonical_name("TB") == "Tb"  # another reader in the same process is not changed
    assert site_config_from_dict(values).vocabulary.canonical_list(["TB", "BB"]) == ["Tb", "Bulla"]
    assert union_labels(["TB", "Mass"], vocabulary=site.vocabulary) == ["Tuberculosis", "Mass"]
    assert "job_aliases" not in site.to_dict()  # the job's, never written into the site's file


def test_a_closed_vocabulary_refuses_other_classes_by_name():
    closed = Vocabulary(accepted=["Effusion", "nodules"], accepted_origin="job accepted_classes")
    assert closed.accepted == ("Pleural Effusion", "Nodule")
    assert closed.canonical("pleural effusions") == "Pleural Effusion"
    with pytest.raises(UnknownLabelError) as caught:
        closed.canonical("Mass", "site-b's class names")
    assert str(caught.value) == (
        "site-b's class names: class 'Mass' (from 'Mass') is not one of the job's accepted classes: "
        "Pleural Effusion, Nodule"
    )
    with pytest.raises(UnknownLabelError, match="must list at least one class name"):
        Vocabulary(accepted=[])


def test_alias_files_in_json_and_yaml(tmp_path):
    (tmp_path / "aliases.json").write_text(json.dumps({"TB": "Tuberculosis", "Pneumo": "Pneumothorax"}))
    (tmp_path / "aliases.yaml").write_text("TB: Tuberculosis\nPneumo: Pneumothorax\n")
    expected = {"TB": "Tuberculosis", "Pneumo": "Pneumothorax"}
    assert read_alias_file(tmp_path / "aliases.json") == read_alias_file(tmp_path / "aliases.yaml") == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('["TB", "Tuberculosis"]', "must map each alias to a class name, got list"),
        ('{"TB": ""}', "entry 'TB': '': both must be non-empty names"),
        ('{"TB": 3}', "entry 'TB': 3: both must be non-empty names"),
        ('{"TB": "Tuberculosis", "TB": "Mycobacterial infection"}', "entry 'TB' appears twice"),
        ('{"TB": "Tuberculosis",}', "not a JSON/YAML mapping"),
    ],
)
def test_a_bad_alias_file_names_the_file_and_the_entry(tmp_path, text, message):
    path = tmp_path / "consortium-aliases.json"
    path.write_text(text)
    with pytest.raises(AliasFileError) as caught:
        read_alias_file(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)


def test_a_missing_alias_file_is_named(tmp_path):
    with pytest.raises(AliasFileError, match=r"alias file not found: .*nowhere.yaml"):
        read_alias_file(tmp_path / "nowhere.yaml")


def test_duplicates_after_aliasing_are_an_error():
    with pytest.raises(ValueError, match="'Effusion' duplicates 'Pleural Effusion': both mean 'Pleural Effusion'"):
        canonical_names(["Pleural Effusion", "Effusion"])
    with pytest.raises(ValueError, match="'nodules' duplicates 'Nodule'"):
        canonical_names(["Nodule", "nodules"])


def test_dataset_label_lists():
    assert len(NIH_LABELS) == 14 and len(CHEXPERT_LABELS) == 13 and len(CXR_LT_LABELS) == 25
    assert (NIH_RAW_LABELS[4], NIH_LABELS[4]) == ("Effusion", "Pleural Effusion")
    assert (NIH_RAW_LABELS[11], NIH_LABELS[11]) == ("Pleural_Thickening", "Pleural Thickening")
    assert [a == b for a, b in zip(NIH_RAW_LABELS, NIH_LABELS, strict=True)].count(False) == 2
    assert all(name in BUILTIN_FINDINGS for name in NIH_LABELS + CHEXPERT_LABELS)
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
