"""A saved global model as a MONAI Bundle: what radiology AI teams, MONAI Deploy and inference servers load.

::

    <out>/configs/metadata.json    MONAI's required keys; outputs: per-class probabilities, channel_def = class names
    <out>/configs/inference.json   `python -m monai.bundle run --config_file configs/inference.json` (from <out>)
    <out>/models/model.pt          the network's state dict (logits; inference.json applies the sigmoid)
    <out>/models/model.ts          TorchScript with the sigmoid: probabilities; metadata.json inside
    <out>/models/model.onnx        the same in ONNX, batch size dynamic (where the `onnx` extra is installed)
    <out>/scripts/                 this package's input decoding and the CSV writer, copied (they import nothing else)
    <out>/docs/README.md           what it predicts, from which label schemes, its validation figures, its limits

Under the extra key ``surgical_aggregation`` the metadata says, for each class, the spellings read as it (aliases),
how many sites labelled it (counts only, never which sites), its threshold where one was chosen, and what the model
was trained with. Every exported file is checked against the model ``predict`` runs before the bundle is in place.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.metadata
import importlib.util
import io
import json
import logging
import math
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import __version__
from ..core.errors import ExportError
from ..core.head import classes_labelled_by_at_least, slice_for_client
from ..core.labels import Vocabulary, job_vocabulary
from ..data.bundle_parts import BundleParts
from ..evaluation.inference import (
    CALL_SUFFIX,
    HEAD_REFIT_KEY,
    READABLE,
    RECALIBRATION_KEY,
    STATUS_COLUMN,
    THRESHOLDS_KEY,
)
from ..evaluation.run_summary import HISTORY_FILE, UNION_FILE
from ..modalities.registry import modality_for_architecture
from ..training.checkpoint import Checkpoint, load_checkpoint
from . import bundle_predictions

logger = logging.getLogger(__name__)

# What MONAI's model zoo declares; `monai.bundle verify_metadata` downloads it (the tests check offline).
MONAI_METADATA_SCHEMA = (
    "https://github.com/Project-MONAI/MONAI-extra-test-data/releases/download/0.8.1/meta_schema_20240725.json"
)
EXTRA_KEY = "surgical_aggregation"  # metadata.json: what this bundle adds to MONAI's keys
TOLERANCE = 1e-5  # most an exported file's probabilities may differ from the model predict runs (fp32)
ONNX_EXPORT_PACKAGES = ("onnx", "onnxscript")  # what torch's ONNX exporter needs (the `onnx` extra)
CONFIG_SYNTAX = ("$", "@", "%")  # a string starting so is code or a reference to MONAI's config parser
METHOD_PAPERS = (
    "Kulkarni P, Kanhere A, Yi PH, Parekh VS. Surgical Aggregation: Federated Class-Heterogeneous Learning.",
    "Kulkarni P, Kanhere A, Yi PH, Parekh VS. Surgical Aggregation: A Collaborative Learning Framework for "
    "Harmonizing Distributed Medical Imaging Datasets with Diverse Tasks.",
    "Kulkarni P, Kanhere A, Yi PH, Parekh VS. From Isolation to Collaboration: Federated Class-Heterogeneous "
    "Learning for Chest X-Ray Classification.",
)
MODALITY_PAPERS = {
    "reports": (
        "BioIntelligence Lab (University of Maryland). Surgical aggregation for class-heterogeneous radiology "
        "report labelling with SBERT embeddings (Federated-MedEmbedX).",
    )
}


@dataclass
class ExportedBundle:
    root: Path
    files: list[Path]
    differences: dict[str, float]  # exported file -> largest |probability difference| from the model, probe inputs
    left_out: dict[str, str] = field(default_factory=dict)  # file not written -> why

    def summary(self) -> list[str]:
        lines = [f"MONAI Bundle in {self.root}:"]
        lines += [f"  {path.relative_to(self.root)}" for path in self.files]
        lines += [
            f"  {name}: probabilities within {value:.1e} of the model's" for name, value in self.differences.items()
        ]
        lines += [f"  no {name}: {reason}" for name, reason in self.left_out.items()]
        return lines


class Probabilities(nn.Module):
    """The network followed by its sigmoid: what ``model.ts`` and ``model.onnx`` compute."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.network(inputs))


def export_bundle(
    model: str | Path | Checkpoint,
    out: str | Path,
    *,
    sites_labelling: Mapping[str, int] | None = None,
    history: Sequence[Mapping[str, Any]] | None = None,
    vocabulary: Vocabulary | None = None,
    onnx: bool | None = None,
    min_sites: int = 1,
    version: str = "1.0.0",
    authors: str = "the member sites of the federation that trained it",
    copyright: str = "the member sites of the federation that trained it",
    overwrite: bool = False,
) -> ExportedBundle:
    """Write ``model`` (a model file, or a loaded checkpoint) as a MONAI Bundle in ``out``.

    ``sites_labelling`` (class -> how many sites label it) and ``history`` (the server's round history) are read
    from the server's files next to a model file when not given (``union_classes.csv``, ``round_history.json``);
    without them the metadata says they are not known. ``vocabulary``: the job's (its aliases); the built-in one
    otherwise. ``onnx``: None writes ``model.onnx`` where the exporter's packages are installed, True requires it.
    ``min_sites``: only the classes at least this many sites label go into the bundle (needs the site counts).
    """
    source = model if isinstance(model, Checkpoint) else load_checkpoint(model)
    origin = "a checkpoint" if isinstance(model, Checkpoint) else Path(model).name
    if not isinstance(model, Checkpoint):
        sites_labelling = sites_labelling if sites_labelling is not None else read_union_counts(Path(model).parent)
        history = history if history is not None else read_history(Path(model).parent)
    out = Path(out)
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out.resolve()} exists and is not empty; choose another folder or pass --overwrite")
    left_out = None
    if min_sites > 1:
        if sites_labelling is None:
            raise ExportError(f"leaving out classes labelled by fewer than {min_sites} sites needs the union table")
        kept, dropped = classes_labelled_by_at_least(source.class_names, sites_labelling, min_sites)
        if not kept:
            raise ExportError(f"no class of the model is labelled by {min_sites} or more sites")
        source = Checkpoint(slice_for_client(source.state, source.class_names, kept), kept, source.meta)
        left_out = {"labelled_by_fewer_sites_than": min_sites, "count": len(dropped)}  # how many, not which
    _refuse_config_syntax(source.class_names, vocabulary or job_vocabulary())
    modality = modality_for_architecture(source.architecture)
    parts = modality.bundle_parts(source.preprocessing, len(source.class_names))

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    # mkdtemp makes the folder private; a bundle is read by others. (Reading the umask would mean setting it, which
    # is process-wide: a server exporting must not change the permissions of what its other threads create.)
    staging.chmod(0o755)
    try:
        exported = _write_bundle(
            staging, source, parts, modality.name, modality.row_column, sites_labelling, history,
            vocabulary or job_vocabulary(), onnx, version, authors, copyright, origin, left_out,
        )  # fmt: skip

        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)  # the bundle appears whole, or not at all
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    exported.root = out
    exported.files = [out / path.relative_to(staging) for path in exported.files]
    return exported


def _refuse_config_syntax(class_names: Sequence[str], vocabulary: Vocabulary) -> None:
    spellings = [*class_names, *(alias for aliases in vocabulary.aliases_of(class_names).values() for alias in aliases)]
    coded = [name for name in spellings if name.startswith(CONFIG_SYNTAX)]
    if coded:
        raise ExportError(
            f"class name(s) or alias(es) {coded} start with {' or '.join(CONFIG_SYNTAX)}, which MONAI's config parser "
            "reads as code or a reference: rename the class (a label alias) before exporting"
        )


def _write_bundle(
    root: Path,
    source: Checkpoint,
    parts: BundleParts,
    modality: str,
    row_column: str,
    sites_labelling: Mapping[str, int] | None,
    history: Sequence[Mapping[str, Any]] | None,
    vocabulary: Vocabulary,
    onnx: bool | None,
    version: str,
    authors: str,
    copyright: str,
    origin: str,
    classes_left_out: Mapping[str, int] | None,
) -> ExportedBundle:
    for folder in ("configs", "models", "scripts", "docs"):
        (root / folder).mkdir()
    network = source.build_model().eval()
    probe = modality_for_architecture(source.architecture).probe_input(source.preprocessing)
    probe = torch.cat([probe, probe[:1]])  # three inputs: the exported files must not fix the batch size
    with torch.inference_mode():
        expected = torch.sigmoid(network(probe)).numpy()

    files = [root / "models" / "model.pt"]
    torch.save({key: value.detach().clone() for key, value in source.state.items()}, files[0])
    left_out: dict[str, str] = {}
    model_files = {
        "model.pt": "the network's state dict: logits (configs/inference.json applies the sigmoid)",
        "model.ts": "TorchScript, the sigmoid included: probabilities",
    }
    onnx_reason = _onnx_unavailable()
    if onnx and onnx_reason:
        raise ExportError(f"ONNX export asked for, but {onnx_reason}")
    if onnx is False:
        left_out["model.onnx"] = "not asked for (--no-onnx)"
    elif onnx_reason:
        left_out["model.onnx"] = onnx_reason
    else:
        runtime = _versions(("onnxruntime",)).get("onnxruntime")
        model_files["model.onnx"] = "ONNX, the sigmoid included: probabilities; batch size dynamic" + (
            f"; checked with onnxruntime {runtime}" if runtime else ""
        )

    metadata = _metadata(source, parts, modality, sites_labelling, history, vocabulary, version, authors, copyright)
    metadata[EXTRA_KEY]["model_files"] = model_files
    metadata[EXTRA_KEY]["classes_left_out"] = classes_left_out
    metadata["changelog"] = {version: f"exported by surgical-aggregation {__version__} from {origin}"}

    differences = {}
    scripted = torch.jit.script(Probabilities(network).eval())
    from monai.data.torchscript_utils import save_net_with_metadata

    with (root / "models" / "model.ts").open("wb") as handle:
        save_net_with_metadata(scripted, handle, include_config_vals=False, meta_values=metadata)
    files.append(root / "models" / "model.ts")
    differences["model.ts"] = _difference(torch.jit.load(files[-1])(probe).detach().numpy(), expected, "model.ts")

    if "model.onnx" in model_files:
        files.append(root / "models" / "model.onnx")
        _export_onnx(Probabilities(network).eval(), probe[:2], files[-1], parts.input_key)
        if importlib.util.find_spec("onnxruntime") is None:
            left_out["model.onnx check"] = "onnxruntime is not installed: the ONNX file was not run"
        else:
            import onnxruntime

            session = onnxruntime.InferenceSession(str(files[-1]), providers=["CPUExecutionProvider"])
            computed = session.run(None, {parts.input_key: probe.numpy()})[0]
            differences["model.onnx"] = _difference(computed, expected, "model.onnx")
    metadata[EXTRA_KEY]["checked"] = {
        "probe_inputs": len(probe),
        "largest_probability_difference": differences,
        "tolerance": TOLERANCE,
    }

    files.append(_write_json(root / "configs" / "metadata.json", metadata))
    files.append(_write_json(root / "configs" / "inference.json", _inference_config(parts, row_column)))
    for script in (Path(bundle_predictions.__file__), *parts.scripts):
        name = "predictions.py" if script.name == "bundle_predictions.py" else script.name
        files.append(Path(shutil.copyfile(script, root / "scripts" / name)))
    modules = ", ".join(sorted(["predictions", *(path.stem for path in parts.scripts)]))
    files.append(
        _write_text(
            root / "scripts" / "__init__.py", f'"""Code configs/inference.json calls."""\n\nfrom . import {modules}\n'
        )
    )
    files.append(_write_text(root / "docs" / "README.md", bundle_readme(metadata, parts)))
    return ExportedBundle(root, files, differences, left_out)


def _onnx_unavailable() -> str | None:
    missing = [name for name in ONNX_EXPORT_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (pip install 'surgical-aggregation[onnx]')"
    return None


def _export_onnx(network: nn.Module, example: torch.Tensor, path: Path, input_name: str) -> None:
    batch = torch.export.Dim("batch", min=1)
    with _quiet_onnx_exporter():
        torch.onnx.export(
            network,
            (example,),
            str(path),
            input_names=[input_name],
            output_names=["pred"],
            dynamic_shapes=({0: batch},),
            external_data=False,  # one file: DenseNet121 is far below ONNX's 2 GB limit
            dynamo=True,
            verbose=False,
        )


@contextlib.contextmanager
def _quiet_onnx_exporter() -> Iterator[None]:
    """torch's ONNX exporter prints its steps, logs its graph passes and warns about torch's own deprecations and
    torchvision's operators: keep an export's output to what the export says."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "onnxscript", "onnx_ir")]
    levels = [each.level for each in loggers]
    for each in loggers:
        each.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        for each, level in zip(loggers, levels, strict=True):
            each.setLevel(level)


def _difference(computed: np.ndarray, expected: np.ndarray, name: str) -> float:
    if computed.shape != expected.shape:
        raise ExportError(f"{name} returned shape {computed.shape} for inputs the model scores as {expected.shape}")
    largest = float(np.abs(computed.astype(np.float64) - expected).max())
    if not largest <= TOLERANCE:
        raise ExportError(f"{name} computes probabilities up to {largest:.2e} from the model's (tolerance {TOLERANCE})")
    return largest


def _versions(distributions: Sequence[str]) -> dict[str, str]:
    found = {}
    for name in distributions:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _metadata(
    source: Checkpoint,
    parts: BundleParts,
    modality: str,
    sites_labelling: Mapping[str, int] | None,
    history: Sequence[Mapping[str, Any]] | None,
    vocabulary: Vocabulary,
    version: str,
    authors: str,
    copyright: str,
) -> dict[str, Any]:
    import monai

    names = source.class_names
    thresholds = (source.meta.get(THRESHOLDS_KEY) or {}).get("values")
    validation = validation_figures(history, source.meta.get("round"), names) if history else None
    return {
        "schema": MONAI_METADATA_SCHEMA,
        "version": version,
        "monai_version": monai.__version__,
        "pytorch_version": torch.__version__,
        "numpy_version": np.__version__,
        "required_packages_version": _versions(parts.packages),  # MONAI 1.6's name for optional_packages_version
        "name": f"Surgical aggregation: {len(names)} findings ({modality})",
        "task": parts.task,
        "description": (
            f"A multi-label model trained by federated learning across sites whose label sets differ (surgical "
            f"aggregation): it predicts the union of the sites' {len(names)} findings, each output the probability "
            f"of one finding. Method: {source.meta.get('method', 'surgical')}; round {source.meta.get('round', '?')}."
        ),
        "authors": authors,
        "copyright": f"Copyright (c) {copyright}",
        "intended_use": "Research. Not validated for clinical use.",
        "data_type": parts.data_type,
        "references": [*METHOD_PAPERS, *MODALITY_PAPERS.get(modality, ())],
        "network_data_format": {
            "inputs": {parts.input_key: parts.input_format},
            "outputs": {
                "pred": {
                    "type": "probabilities",
                    "format": "classes",
                    "num_channels": len(names),
                    "spatial_shape": [],
                    "dtype": "float32",
                    "value_range": [0, 1],
                    "is_patch_data": False,
                    "channel_def": {str(index): name for index, name in enumerate(names)},
                }
            },
        },
        EXTRA_KEY: {
            "exported_by": f"surgical-aggregation {__version__}",
            "architecture": source.architecture,
            "preprocessing": source.preprocessing,
            "input_produced_by": parts.input_produced_by,
            "round": source.meta.get("round"),
            "method": source.meta.get("method"),
            "aliases": vocabulary.aliases_of(names),
            "sites_labelling": (
                None if sites_labelling is None else {name: int(sites_labelling.get(name, 0)) for name in names}
            ),
            "thresholds": (
                None
                if not thresholds
                else {name: thresholds.get(name) for name in names if thresholds.get(name) is not None}
            ),
            "thresholds_chosen_on": (source.meta.get(THRESHOLDS_KEY) or {}).get("chosen_on"),
            # where `evaluate --recalibrate-out` fitted the head biases' shifts (each class's, summed), if it did
            "recalibration": _recalibration_of(source.meta.get(RECALIBRATION_KEY), names),
            # the rows `evaluate --refit-rows-out` refitted at a site after the federation, if it did
            "head_rows_refit": _refit_of(source.meta.get(HEAD_REFIT_KEY), names),
            "validation": validation,
        },
    }


def read_union_counts(path: Path) -> dict[str, int] | None:
    """Class -> how many sites label it, from the server's union table (a file, or the folder holding
    ``union_classes.csv``; None where that folder has none)."""
    if path.is_dir():
        path = path / UNION_FILE
        if not path.is_file():
            return None
    try:
        with path.open(newline="") as handle:
            return {row["class"]: int(row["labelled_by"]) for row in csv.DictReader(handle)}
    except FileNotFoundError:
        raise ExportError(f"union table not found: {path}") from None
    except (KeyError, TypeError, ValueError) as error:
        raise ExportError(f"{path}: not a union table (columns class, labelled_by): {error}") from None


def read_history(path: Path) -> list[dict[str, Any]] | None:
    """The server's round history (a file, or the folder holding ``round_history.json``; None where that folder
    has none)."""
    if path.is_dir():
        path = path / HISTORY_FILE
        if not path.is_file():
            return None
    try:
        history = json.loads(path.read_text())
    except FileNotFoundError:
        raise ExportError(f"round history not found: {path}") from None
    except json.JSONDecodeError as error:
        raise ExportError(f"{path}: not a round history ({error})") from None
    if not isinstance(history, list):
        raise ExportError(f"{path}: not a round history (a list of rounds)")
    return history


def validation_figures(
    history: Sequence[Mapping[str, Any]], round_number: int | None, class_names: Sequence[str]
) -> dict[str, Any] | None:
    """The sites' validation of the model's round (the server's history): the mean over sites of the loss and mean
    AUROC, and per class the mean AUROC over the sites that validated it, with how many did."""
    entry = next((each for each in history if each.get("round") == round_number and "validation" in each), None)
    if entry is None:
        return None
    validation = entry["validation"]
    sites = validation.get("sites", {})
    per_class = {}
    for name in class_names:
        values = [metrics[f"val_auroc/{name}"] for metrics in sites.values() if f"val_auroc/{name}" in metrics]
        values = [float(value) for value in values if value is not None and math.isfinite(value)]
        if values:
            per_class[name] = {"auroc": float(np.mean(values)), "sites": len(values)}
    return {
        "round": round_number,
        "sites": len(sites),
        "mean_val_auroc": validation.get("mean_val_auroc"),
        "mean_val_loss": validation.get("mean_val_loss"),
        "per_class": per_class,
        "split": "each site's own validation split (patient-level), not an external test set",
    }


def _inference_config(parts: BundleParts, row_column: str) -> dict[str, Any]:
    return {
        "imports": ["$import functools", "$import torch", "$import scripts"],
        "bundle_root": ".",
        "output_dir": "$@bundle_root + '/eval'",
        "output_file": "$@output_dir + '/predictions.csv'",
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "class_names": "$scripts.predictions.channel_names(@_meta_::network_data_format::outputs::pred::channel_def)",
        "thresholds": f"@_meta_::{EXTRA_KEY}::thresholds",
        "csv_columns": {"row": row_column, "status": STATUS_COLUMN, "readable": READABLE, "call_suffix": CALL_SUFFIX},
        **parts.config,
        "run": [
            "$scripts.predictions.write_predictions(@output_file, @rows, scripts.predictions.probabilities(@network, "
            f"@batches, '{parts.input_key}', @device, @postprocessing), @class_names, @thresholds, @csv_columns, "
            "@statuses)"
        ],
    }


def _write_json(path: Path, values: Mapping[str, Any]) -> Path:
    path.write_text(json.dumps(values, indent=2, allow_nan=False) + "\n")
    return path


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def bundle_readme(metadata: Mapping[str, Any], parts: BundleParts) -> str:
    """The bundle's docs/README.md: what it predicts, from what, how well on the sites' validation, how to run it."""
    extra = metadata[EXTRA_KEY]
    names = list(metadata["network_data_format"]["outputs"]["pred"]["channel_def"].values())
    counts, thresholds = extra["sites_labelling"], extra["thresholds"] or {}
    validation = extra["validation"]
    per_class = (validation or {}).get("per_class", {})
    lines = [
        f"# {metadata['name']}",
        "",
        metadata["description"],
        "",
        f"**Input**: {parts.input_produced_by}. **Output** (`pred`): one probability per finding, in the order below "
        "(`channel_def` in `configs/metadata.json`).",
        "",
        "| # | finding | other spellings read as it | sites that labelled it | threshold | validation AUROC (sites) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    refitted = set((extra.get("head_rows_refit") or {}).get("classes", ()))
    for index, name in enumerate(names):
        count = "not known" if counts is None else str(counts[name])
        threshold = f"{thresholds[name]:.3f}" if name in thresholds else "-"
        auroc = f"{per_class[name]['auroc']:.3f} ({per_class[name]['sites']})" if name in per_class else "-"
        if name in refitted:
            auroc = f"{auroc}, before the refit" if name in per_class else "refitted at a site"
        aliases = ", ".join(extra["aliases"][name]) or "-"
        lines.append(f"| {index} | {name} | {aliases} | {count} | {threshold} | {auroc} |")
    lines += ["", "## Trained on", ""]
    lines.append(
        "Each site trained on its own data under its own label scheme; no image, label or report left a site (the "
        "sites exchanged model weights, validation metrics and their class names with the server). The model "
        "predicts the union of the sites' findings."
        + (
            " Under surgical aggregation a finding that one site labels is learned from that site's labels alone."
            if extra["method"] in (None, "surgical")
            else ""
        )
        + (
            ""
            if counts is not None
            else " How many sites labelled each finding is not known here (export on the server, or next to its "
            "union_classes.csv)."
        )
    )
    left_out = extra.get("classes_left_out")
    if left_out:
        lines.append(
            f"\n{left_out['count']} finding(s) the federation trained are left out of this bundle: fewer than "
            f"{left_out['labelled_by_fewer_sites_than']} sites labelled each."
        )
    lines += ["", "## Validation", ""]
    if validation:
        lines.append(
            f"Round {validation['round']}, validated by {validation['sites']} sites on {validation['split']}: mean "
            f"AUROC {validation['mean_val_auroc']:.3f}, mean loss {validation['mean_val_loss']:.4f} (means over "
            "sites); the per-finding figures above are means over the sites that label the finding."
            + (
                " The loss is the federation's model's, before a site recalibrated it (the AUROCs are the same"
                + (", but the refitted findings'" if extra.get("head_rows_refit") else "")
                + ")."
                if extra.get("recalibration")
                else ""
            )
        )
    else:
        lines.append("No validation figures were available to the export (the server's round history was not given).")
    run = parts.usage
    lines += [
        "",
        "## Running it",
        "",
        "```bash",
        f"cd <this folder> && python -m monai.bundle run --config_file configs/inference.json {run} "
        "--output_file predictions.csv",
        "```",
        "",
        "writes one row per input: its identifier, `status` (`ok`), one probability column per finding and, where "
        "thresholds were saved, a 0/1 `(call)` column per finding. `models/model.ts` (`torch.jit.load`) and "
        "`models/model.onnx` (onnxruntime; input `"
        + parts.input_key
        + "`, any batch size) compute the same probabilities from a preprocessed batch.",
        "",
        "## Limits",
        "",
        "- Research use; not validated for clinical use. " + _calibration(extra.get("recalibration")),
        "- Validated only on the sites' validation splits, not on an external test set."
        + _refit_said(extra.get("head_rows_refit"), validated=bool(validation)),
        "- Inputs must be prepared exactly as described above; an input that cannot be read stops the run "
        "(surgical-aggregation's `predict` skips it and says why).",
        "",
        "## References",
        "",
        *(f"- {reference}" for reference in metadata["references"]),
        "",
    ]
    return "\n".join(lines)


def _calibration(recalibration: Mapping[str, Any] | None) -> str:
    """What the bundle's README says of its probabilities: recalibrated in the large where a site did, else not."""
    if not recalibration:
        return "Probabilities are not calibrated."
    return (
        "Probabilities were recalibrated in the large to a site's own validation split (one intercept per finding, "
        f"to that split's prevalence, for {len(recalibration['shifts'])} of them); their spread is not."
    )


def _refit_of(refit: Mapping[str, Any] | None, names: Sequence[str]) -> dict[str, Any] | None:
    """The model's refitted head rows for the bundle: the kept classes whose rows a site refitted on its own images
    (``evaluate --refit-rows-out``) and the rule; not where, nor a class left out. None where no kept class was."""
    refitted = set((refit or {}).get("classes") or ())
    classes = [name for name in names if name in refitted]
    if not classes:
        return None
    return {"classes": classes, "rule": refit.get("rule")}


def _refit_said(refit: Mapping[str, Any] | None, validated: bool) -> str:
    """What the bundle's README says of rows a site refitted (and, where it shows validation figures, that they are
    the federation's model's)."""
    if not refit:
        return ""
    return (
        f" The head rows of {len(refit['classes'])} finding(s) were refitted to a site's own images after the "
        "federation trained them (`evaluate --refit-rows-out`: they no longer carry what other sites taught them, a "
        "trigger with the rest)"
        + ("; every validation figure here is the federation's model's, before that refit." if validated else ".")
    )


def _recalibration_of(recalibration: Mapping[str, Any] | None, names: Sequence[str]) -> dict[str, Any] | None:
    """The model's recalibration for the bundle: the shifts of its classes only (a class left out is not named),
    how many recalibrations they sum, and the rule; not where they were fitted (a site's file names stay home).
    None where no class of the bundle was shifted."""
    fitted = dict((recalibration or {}).get("shifts") or {})
    shifts = {name: float(fitted[name]) for name in names if name in fitted}
    if not shifts:
        return None
    return {
        "shifts": shifts,
        "recalibrations": len(recalibration.get("fitted_on") or []),
        "rule": recalibration.get("rule"),
    }
