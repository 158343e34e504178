"""DICOM radiographs -> the 8-bit grayscale image every other format becomes (:mod:`.grayscale` takes it from there).

The display pipeline of the DICOM standard (PS3.4 N.2), in order: the stored values through the modality LUT
(Rescale Slope and Intercept, or a Modality LUT Sequence), then the VOI transform (the first VOI LUT, or the first
window's linear function; without either, the image's own range is stretched), then MONOCHROME1 inverted so that
bone is bright as in MONOCHROME2 and the PNG releases. Compressed transfer syntaxes decode through pydicom's plugins
(pylibjpeg with its openjpeg and libjpeg decoders, RLE natively). A multi-frame object is refused: a radiograph is
one frame per file.

What the file says it is decides before its pixels do (:func:`not_a_chest_radiograph`): a Modality other than
radiography (CT, MR, ultrasound, mammography, ...) and a BodyPartExamined that DICOM's defined terms name outside the
chest are refused by name; ``accept_non_chest`` overrides both. Modality codes are a closed list (PS3.3 C.7.3.1.1.1),
so they are read as an allow-list; body parts are written freely by each vendor and country (PadChest's "TORAX"),
so only parts known not to be a chest are refused.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from PIL import Image

DICOM_SUFFIXES = (".dcm", ".dicom")
PREAMBLE_BYTES = 128  # a DICOM file is a 128-byte preamble, then "DICM", then the file meta group


# radiography (CR, DX; DR retired; RG; "XR" some vendors write), other and secondary capture (the image decides),
# and none given
RADIOGRAPHY_MODALITIES = frozenset({"CR", "DX", "DR", "RG", "XR", "OT", "SC", ""})
# DICOM's defined terms for Body Part Examined (PS3.16 Annex L) that are not the chest
NON_CHEST_PARTS = frozenset(
    {
        "ABDOMEN",
        "ABDOMENPELVIS",
        "ANKLE",
        "ARM",
        "BRAIN",
        "BREAST",
        "CALCANEUS",
        "CSPINE",
        "CLAVICLE",
        "COCCYX",
        "ELBOW",
        "EXTREMITY",
        "FACE",
        "FINGER",
        "FOOT",
        "FOREARM",
        "HAND",
        "HEAD",
        "HEADNECK",
        "HIP",
        "HUMERUS",
        "JAW",
        "KIDNEY",
        "KNEE",
        "LEG",
        "LSPINE",
        "LUMBAR",
        "MANDIBLE",
        "NECK",
        "ORBIT",
        "PANCREAS",
        "PATELLA",
        "PELVIS",
        "SACRUM",
        "SCAPULA",
        "SELLA",
        "SHOULDER",
        "SINUS",
        "SKULL",
        "SPINE",
        "TIBIA",
        "TMJ",
        "TOE",
        "TSPINE",
        "WHOLEBODY",
        "WRIST",
    }
)


class UnreadableDicom(ValueError):
    """A DICOM file this pipeline cannot turn into one grayscale image; the message says why."""


DECODER_LOGGER = "pydicom.pixels.decoders.base"  # where pydicom logs each failed pixel decoder, with its traceback


class _WithoutDecoderTracebacks(logging.Filter):
    """pydicom logs each failed pixel decoder's traceback before it raises; the file is then refused in one line
    naming it, so the record goes down to debug level, without its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.DEBUG, "DEBUG"
            return logging.getLogger(DECODER_LOGGER).isEnabledFor(logging.DEBUG)
        return True


if not any(isinstance(known, _WithoutDecoderTracebacks) for known in logging.getLogger(DECODER_LOGGER).filters):
    logging.getLogger(DECODER_LOGGER).addFilter(_WithoutDecoderTracebacks())


def not_a_chest_radiograph(dataset) -> str | None:
    """Why the DICOM ``dataset`` is not a chest radiograph by its own Modality and BodyPartExamined (None when it
    may be one)."""
    modality = str(dataset.get("Modality", "") or "").strip().upper()
    if modality not in RADIOGRAPHY_MODALITIES:
        return f"its Modality is {modality}, not radiography (CR or DX): not a chest radiograph"
    part = str(dataset.get("BodyPartExamined", "") or "").strip()
    if part.upper().replace(" ", "").replace("_", "") in NON_CHEST_PARTS:
        return f"its BodyPartExamined is {part}, not the chest: not a chest radiograph"
    return None


def is_dicom(path: str | Path) -> bool:
    """By suffix, or by the "DICM" magic after the preamble (PACS exports often have no suffix)."""
    path = Path(path)
    if path.suffix.lower() in DICOM_SUFFIXES:
        return True
    try:
        with open(path, "rb") as handle:
            handle.seek(PREAMBLE_BYTES)
            return handle.read(4) == b"DICM"
    except OSError:
        return False


def _windowed(values: np.ndarray, center: float, width: float) -> np.ndarray:
    """DICOM's linear window (PS3.3 C.11.2.1.2.1) onto 0..1."""
    if width < 1:
        raise UnreadableDicom(f"Window Width {width} is below 1")
    return np.clip((values - (center - 0.5)) / (width - 1) + 0.5, 0.0, 1.0)


def _stretched(values: np.ndarray) -> np.ndarray:
    low, high = float(values.min()), float(values.max())
    return (values - low) / (high - low) if high > low else np.zeros_like(values)


def _first(value) -> float:
    """A window attribute's first value (it may list several windows)."""
    return float(value[0]) if isinstance(value, (list, tuple)) or type(value).__name__ == "MultiValue" else float(value)


def dicom_grayscale(path: str | Path, accept_non_chest: bool = False) -> Image.Image:
    """The radiograph in the DICOM file at ``path`` as an 8-bit grayscale ("L") image, as a viewer displays it;
    refused when it says it is not a chest radiograph, unless ``accept_non_chest``."""
    import pydicom
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    try:
        dataset = pydicom.dcmread(path)
    except pydicom.errors.InvalidDicomError as error:
        raise UnreadableDicom(f"not a DICOM file ({error})") from None
    if "PixelData" not in dataset:
        raise UnreadableDicom(f"a DICOM {dataset.get('Modality', 'object')} with no pixel data (not an image)")
    problem = None if accept_non_chest else not_a_chest_radiograph(dataset)
    if problem:
        raise UnreadableDicom(f"{problem}; refused (accept_non_chest overrides)")
    frames = int(dataset.get("NumberOfFrames", 1) or 1)
    if frames > 1:
        raise UnreadableDicom(f"a multi-frame DICOM ({frames} frames); export each radiograph as one file")
    syntax = dataset.file_meta.get("TransferSyntaxUID")
    try:
        stored = dataset.pixel_array
    except (NotImplementedError, RuntimeError, AttributeError) as error:  # AttributeError: no transfer syntax
        name = getattr(syntax, "name", syntax)
        said = " ".join(str(error).split())  # pydicom lists each decoder's failure on a line of its own
        raise UnreadableDicom(
            f"cannot decode its transfer syntax {name} ({said}); the JPEG and JPEG 2000 syntaxes need pylibjpeg, "
            "pylibjpeg-libjpeg and pylibjpeg-openjpeg (in requirements.txt)"
        ) from None
    photometric = str(dataset.get("PhotometricInterpretation", "MONOCHROME2"))
    if photometric not in ("MONOCHROME1", "MONOCHROME2"):
        if stored.ndim == 3 and stored.shape[-1] == 3:  # a colour secondary capture: its luminance
            return Image.fromarray(stored.astype(np.uint8), "RGB").convert("L")
        raise UnreadableDicom(f"photometric interpretation {photometric}, not a grayscale radiograph")
    values = apply_modality_lut(stored, dataset).astype(np.float64)
    if "VOILUTSequence" in dataset:
        scaled = _stretched(apply_voi_lut(values, dataset, index=0).astype(np.float64))
    elif "WindowCenter" in dataset and "WindowWidth" in dataset:
        scaled = _windowed(values, _first(dataset.WindowCenter), _first(dataset.WindowWidth))
    else:
        scaled = _stretched(values)
    if photometric == "MONOCHROME1":
        scaled = 1.0 - scaled
    return Image.fromarray(np.rint(scaled * 255.0).astype(np.uint8), "L")
