"""DICOM radiographs (images.dicom): a real chest film (pydicom-data's CR chest PA, RG1) in several transfer syntaxes
decodes to the same pixels; the display pipeline (modality LUT, window, MONOCHROME1) does what the standard says;
what cannot be one radiograph is refused by name; folders, public releases, predict and the bundle take DICOM."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.uid import (
    DeflatedExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    RLELossless,
)

from surgical_aggregation.core.errors import ImageLoadError
from surgical_aggregation.images.dataset import list_images
from surgical_aggregation.images.decode import read_grayscale
from surgical_aggregation.images.public import load_rsna, load_siim

CHEST_FILM = "RG1_UNCR.dcm"  # CR, CHEST, MONOCHROME1, 1955 x 1841, 15 bits stored, window 15000 / 30000


def _film(tmp_path: Path, name: str = "film.dcm", every: int = 4, **changes) -> Path:
    """The chest film, every ``every``-th pixel (the syntaxes' encoders are quick on it), with ``changes``."""
    dataset = pydicom.dcmread(get_testdata_file(CHEST_FILM))
    pixels = dataset.pixel_array[::every, ::every].copy()
    dataset.Rows, dataset.Columns = pixels.shape
    dataset.PixelData = pixels.tobytes()
    for key, value in changes.items():
        setattr(dataset, key, value)
    path = tmp_path / name
    dataset.save_as(path)
    return path


def _in_syntax(source: Path, syntax, path: Path) -> Path:
    dataset = pydicom.dcmread(source)
    if syntax in (RLELossless, JPEG2000Lossless):
        dataset.compress(syntax)
        dataset.save_as(path)
    else:
        dataset.file_meta.TransferSyntaxUID = syntax
        dataset.save_as(path, implicit_vr=syntax == ImplicitVRLittleEndian, little_endian=True)
    assert pydicom.dcmread(path).file_meta.TransferSyntaxUID == syntax
    return path


def test_the_chest_film_decodes_to_the_same_pixels_in_every_lossless_transfer_syntax(tmp_path):
    explicit = _film(tmp_path)
    reference = read_grayscale(explicit)
    assert reference.shape == (489, 461) and reference.dtype == np.uint8
    for syntax in (ImplicitVRLittleEndian, DeflatedExplicitVRLittleEndian, RLELossless, JPEG2000Lossless):
        path = _in_syntax(explicit, syntax, tmp_path / f"{syntax.name}.dcm")
        assert np.array_equal(read_grayscale(path), reference), syntax.name
    # the film as shipped, full size: uncompressed and JPEG 2000 lossless alike; JPEG 2000 lossy within a grey level
    shipped = read_grayscale(get_testdata_file(CHEST_FILM), 128)
    assert np.array_equal(read_grayscale(get_testdata_file("RG1_J2KR.dcm"), 128), shipped)
    lossy = read_grayscale(get_testdata_file("RG1_J2KI.dcm"), 128).astype(int)
    assert 0 < np.abs(lossy - shipped).mean() < 1.0


def test_the_display_pipeline_windows_rescales_and_inverts_as_the_standard_says(tmp_path):
    film = pydicom.dcmread(get_testdata_file(CHEST_FILM))
    stored = film.pixel_array[::4, ::4].astype(np.float64)
    shown = read_grayscale(_film(tmp_path)).astype(np.float64)
    # the window's linear function (centre 15000, width 30000) onto 0..255, then MONOCHROME1 inverted
    expected = 255 * (1 - np.clip((stored - 14999.5) / 29999 + 0.5, 0, 1))
    assert np.abs(shown - expected).max() <= 0.5 + 1e-9
    monochrome2 = read_grayscale(_film(tmp_path, "m2.dcm", PhotometricInterpretation="MONOCHROME2")).astype(int)
    assert np.abs(monochrome2 - (255 - shown)).max() <= 1  # the same film, not inverted
    # stored values through the modality LUT (value / 2 + 50), the window in the output's units: the same image
    rescaled = _film(tmp_path, "rescaled.dcm", RescaleSlope=0.5, RescaleIntercept=50, WindowCenter=7550,
                     WindowWidth=15000)  # fmt: skip
    assert np.abs(read_grayscale(rescaled).astype(int) - shown).max() <= 1
    unwindowed = pydicom.dcmread(_film(tmp_path))
    del unwindowed.WindowCenter, unwindowed.WindowWidth
    unwindowed.save_as(tmp_path / "plain.dcm")
    stretched = 255 * (1 - (stored - stored.min()) / (stored.max() - stored.min()))  # no window: its own range
    assert np.abs(read_grayscale(tmp_path / "plain.dcm") - stretched).max() <= 0.5 + 1e-9


def test_what_is_not_one_radiograph_is_refused_with_the_file_and_the_reason(tmp_path):
    film = _film(tmp_path)
    frames = pydicom.dcmread(film)
    pixels = frames.pixel_array
    frames.NumberOfFrames = 2
    frames.PixelData = np.stack([pixels, pixels]).tobytes()
    frames.save_as(tmp_path / "cine.dcm")
    with pytest.raises(ImageLoadError, match=r"cine.dcm: a multi-frame DICOM \(2 frames\); export each radiograph"):
        read_grayscale(tmp_path / "cine.dcm")
    report = pydicom.dcmread(film)
    del report.PixelData
    report.save_as(tmp_path / "report.dcm")
    with pytest.raises(ImageLoadError, match=r"report.dcm: a DICOM CR with no pixel data \(not an image\)"):
        read_grayscale(tmp_path / "report.dcm")
    (tmp_path / "fake.dcm").write_bytes(b"not a dicom file at all" * 20)
    with pytest.raises(ImageLoadError, match=r"fake.dcm: not a DICOM file"):
        read_grayscale(tmp_path / "fake.dcm")


@pytest.mark.parametrize(
    ("name", "refusal"),
    [
        ("CT_small.dcm", "its Modality is CT, not radiography (CR or DX): not a chest radiograph"),
        ("MR_small.dcm", "its Modality is MR, not radiography (CR or DX): not a chest radiograph"),
        ("US1_UNCR.dcm", "its Modality is US, not radiography (CR or DX): not a chest radiograph"),
        ("RG3_UNCR.dcm", "its BodyPartExamined is EXTREMITY, not the chest: not a chest radiograph"),
    ],
)
def test_a_study_that_says_it_is_no_chest_radiograph_is_refused_by_name_unless_accepted(name, refusal):
    path = get_testdata_file(name)
    with pytest.raises(ImageLoadError, match=rf"{name}: {re.escape(refusal)}; refused \(accept_non_chest overrides\)"):
        read_grayscale(path, 32)
    assert read_grayscale(path, 32, accept_non_chest=True).shape == (32, 32)


def test_a_stale_window_that_renders_the_film_black_is_refused_and_a_chest_film_is_read(tmp_path):
    assert read_grayscale(_film(tmp_path, every=8), 64).std() > 20  # CR, CHEST, as shipped: read
    stale = _film(tmp_path, "stale.dcm", every=8, WindowCenter=60000, WindowWidth=100)  # all values far below it
    with pytest.raises(ImageLoadError, match=r"stale.dcm: a near-constant render \(90 % of its pixels between gray "):
        read_grayscale(stale, 64)


def test_pixel_data_no_decoder_reads_is_refused_in_one_line_without_pydicoms_tracebacks(tmp_path, caplog):
    from pydicom.encaps import encapsulate

    film = pydicom.dcmread(get_testdata_file("JPEG2000.dcm"))
    film.Modality, film.BodyPartExamined = "CR", "CHEST"
    film.PixelData = encapsulate([np.random.default_rng(0).bytes(2000)])  # not a JPEG 2000 codestream
    film.save_as(tmp_path / "garbled.dcm")
    with caplog.at_level(logging.WARNING), pytest.raises(ImageLoadError) as caught:
        read_grayscale(tmp_path / "garbled.dcm", 32)
    assert str(caught.value).startswith(
        f"{tmp_path / 'garbled.dcm'}: cannot decode its transfer syntax JPEG 2000 Image Compression (Unable to decode "
    )
    assert "\n" not in str(caught.value)
    assert not [record for record in caplog.records if record.exc_info] and "Traceback" not in caplog.text


def test_a_folder_lists_dicom_beside_png_and_a_file_without_suffix_is_read_by_its_magic(tmp_path):
    from PIL import Image

    (tmp_path / "in").mkdir()
    film = _film(tmp_path / "in", every=8)
    (tmp_path / "in" / "export").write_bytes(film.read_bytes())  # a PACS export without a suffix
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(tmp_path / "in" / "a.png")
    listed = [Path(path).name for path in list_images(tmp_path / "in")]
    assert listed == ["a.png", "export", "film.dcm"]  # every file: the decoder decides by content
    assert np.array_equal(read_grayscale(tmp_path / "in" / "export", 64), read_grayscale(film, 64))


def test_rsna_and_siim_are_read_as_shipped_in_dicom(tmp_path):
    film = _film(tmp_path, every=8)
    rsna = tmp_path / "rsna"
    (rsna / "stage_2_train_images").mkdir(parents=True)
    rows = [("p1", 1), ("p1", 1), ("p2", 0)]
    pd.DataFrame(rows, columns=["patientId", "Target"]).assign(x="", y="", width="", height="").to_csv(
        rsna / "stage_2_train_labels.csv", index=False
    )
    for patient in ("p1", "p2"):
        (rsna / "stage_2_train_images" / f"{patient}.dcm").write_bytes(film.read_bytes())
    table = load_rsna(rsna)
    assert [Path(path).relative_to(rsna).as_posix() for path in table.paths] == [
        "stage_2_train_images/p1.dcm", "stage_2_train_images/p2.dcm"
    ]  # fmt: skip
    siim = tmp_path / "siim"
    nested = siim / "dicom-images-train" / "1.2.3" / "1.2.3.4"
    nested.mkdir(parents=True)
    (nested / "1.2.3.4.5.dcm").write_bytes(film.read_bytes())
    pd.DataFrame({"ImageId": ["1.2.3.4.5"], " EncodedPixels": ["-1"]}).to_csv(siim / "train-rle.csv", index=False)
    assert [Path(path) for path in load_siim(siim).paths] == [nested / "1.2.3.4.5.dcm"]
    assert read_grayscale(load_siim(siim).paths[0], 32).shape == (32, 32)


def test_prepare_caches_a_hospitals_dicom_export_as_the_pixels_it_shows(tmp_path, capsys):
    """``prepare`` on a CSV of DICOM files (half MONOCHROME1, 12 bits, windowed): every image is cached, and the
    cached pixels are the ones the export shows (within the window's rounding)."""
    from surgical_aggregation.cli import main

    from helpers import write_dicom

    rng = np.random.default_rng(0)
    shown = {index: rng.integers(0, 256, (40, 40), dtype=np.uint8) for index in range(6)}
    (tmp_path / "img").mkdir()
    rows = ["path,patient_id,Effusion"]
    for index, pixels in shown.items():
        write_dicom(pixels, tmp_path / "img" / f"{index}.dcm", monochrome1=index % 2 == 1)
        rows.append(f"img/{index}.dcm,p{index},{index % 2}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    cache = ["--cache-dir", str(tmp_path / "cache"), "--size", "40", "--no-progress"]
    assert main(["prepare", "--kind", "csv", "--data", str(tmp_path / "labels.csv"), *cache]) == 0
    assert "0 unreadable" in capsys.readouterr().out
    for index, pixels in shown.items():
        decoded = read_grayscale(tmp_path / "img" / f"{index}.dcm", 40).astype(int)
        assert np.abs(decoded - pixels.astype(int)).max() <= 1, index


def test_a_voi_lut_takes_precedence_over_the_window(tmp_path):
    """A VOI LUT Sequence that reverses the 12 stored bits: the image shows inverted, whatever its window says."""
    from pydicom.dataset import Dataset

    from helpers import write_dicom

    pixels = np.random.default_rng(1).integers(0, 256, (32, 32), dtype=np.uint8)
    path = write_dicom(pixels, tmp_path / "lut.dcm")
    dataset = pydicom.dcmread(path)
    lut = Dataset()
    lut.add_new(0x00283002, "US", [4096, 0, 12])  # LUT Descriptor: entries, first stored value mapped, bits
    lut.add_new(0x00283006, "OW", np.arange(4095, -1, -1, dtype=np.uint16).tobytes())  # LUT Data
    dataset.VOILUTSequence = [lut]
    dataset.save_as(path)
    shown = read_grayscale(path).astype(int)
    stored = pixels.astype(float) * 16
    expected = 255 * (4095 - stored - (4095 - stored).min()) / np.ptp(4095 - stored)  # the LUT's output, stretched
    assert np.abs(shown - expected).max() <= 0.5 + 1e-9


def test_a_transfer_syntax_without_its_decoder_names_the_syntax_and_the_packages(tmp_path, monkeypatch):
    """As a site without pylibjpeg sees a JPEG 2000 film: pydicom's own error, with the syntax and what to install."""
    path = _in_syntax(_film(tmp_path), JPEG2000Lossless, tmp_path / "j2k.dcm")

    def no_decoder(self):
        raise RuntimeError("Unable to decode as exceptions were raised by all available plugins")

    monkeypatch.setattr(pydicom.dataset.Dataset, "pixel_array", property(no_decoder))
    expected = (
        r"j2k.dcm: cannot decode its transfer syntax JPEG 2000 Image Compression \(Lossless Only\) "
        r"\(Unable to decode .*\); the JPEG and JPEG 2000 syntaxes need pylibjpeg"
    )
    with pytest.raises(ImageLoadError, match=expected):
        read_grayscale(path)
