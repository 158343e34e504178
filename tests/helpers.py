"""Helpers shared by tests: toy state dicts, head rows by name, reference-data gate."""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
import torch
from filelock import FileLock

import surgical_aggregation.flare.recipe as recipes
from surgical_aggregation.core.head import HeadSpec
from surgical_aggregation.data.reference import reference_file
from surgical_aggregation.flare.recipe import SurgicalAggregationRecipe, nih_chexpert_recipe, write_job
from surgical_aggregation.images.names import SMOKE_DENSENET
from surgical_aggregation.training.profiles import SCRATCH

T = TypeVar("T")
REPOSITORY = Path(__file__).resolve().parents[1]
BENCHMARKS = REPOSITORY / "benchmarks"


def marked_block(text: str, marker: str) -> str:
    """What a page holds between its ``<!-- marker -->`` and ``<!-- /marker -->`` lines (a generated table)."""
    return text.split(f"<!-- {marker} -->\n", 1)[1].split(f"\n<!-- /{marker} -->", 1)[0]


TESTED = "<!-- tested by tests/test_docs.py"
MAIN_RUN = "e2e-main-run"  # built once, read by the FLARE and the blind tests
SNIPPET_RUN = "docs-recipe-snippet-run"  # built once, read by the docs and the determinism tests
TOY_HEAD = HeadSpec("head.weight", "head.bias")
TOY_FEATURES = 4


def toy_state(n_classes: int, seed: int) -> dict[str, torch.Tensor]:
    """A miniature model's state: a conv, a BatchNorm (params + buffers) and a head of n rows."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    return {
        "backbone.conv.weight": rand(TOY_FEATURES, 1, 3, 3),
        "backbone.bn.weight": rand(TOY_FEATURES),
        "backbone.bn.bias": rand(TOY_FEATURES),
        "backbone.bn.running_mean": rand(TOY_FEATURES),
        "backbone.bn.running_var": rand(TOY_FEATURES).abs() + 0.5,
        "backbone.bn.num_batches_tracked": torch.tensor(seed * 7 + 3, dtype=torch.int64),
        "head.weight": rand(n_classes, TOY_FEATURES),
        "head.bias": rand(n_classes),
    }


class ToyNet(torch.nn.Module):
    """The miniature model whose state :func:`toy_state` is: conv -> BatchNorm -> ReLU -> global mean -> head."""

    def __init__(self, n_classes: int) -> None:
        super().__init__()
        self.backbone = torch.nn.Module()
        self.backbone.conv = torch.nn.Conv2d(1, TOY_FEATURES, 3, bias=False)
        self.backbone.bn = torch.nn.BatchNorm2d(TOY_FEATURES)
        self.head = torch.nn.Linear(TOY_FEATURES, n_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.backbone.bn(self.backbone.conv(images))).mean(dim=(2, 3))
        return self.head(features)


TOY_PROBE = torch.linspace(-1, 1, 2 * 8 * 8).reshape(2, 1, 8, 8)


def toy_outputs(state: dict, class_names: Sequence[str]) -> np.ndarray:
    """A toy state's outputs on a fixed probe input, in eval mode: the server's model check of the test harness."""
    model = ToyNet(len(class_names)).eval()
    model.load_state_dict({key: torch.as_tensor(np.asarray(value)) for key, value in state.items()})
    with torch.no_grad():
        return model(TOY_PROBE).numpy()


def fedavg_reference(states: Sequence[dict], weights: Sequence[float] | None = None) -> dict[str, torch.Tensor]:
    """Plain FedAvg written out by hand (the reference surgical aggregation must reduce to): the weighted
    mean of every entry in float64, integer entries rounded back, each cast to its original dtype."""
    w = np.ones(len(states)) if weights is None else np.asarray(weights, dtype=np.float64)
    result = {}
    for key, first in states[0].items():
        stacked = np.stack([torch.as_tensor(state[key]).double().numpy() for state in states])
        mean = np.tensordot(w / w.sum(), stacked, axes=1)
        if not first.is_floating_point():
            mean = np.rint(mean)
        result[key] = torch.as_tensor(mean).to(first.dtype)
    return result


def rows_by_name(state: dict, classes: Sequence[str], head: HeadSpec = TOY_HEAD) -> dict[str, np.ndarray]:
    """class name -> its head row (weight row followed by bias) as float64."""
    weight = np.asarray(state[head.weight_key], dtype=np.float64)
    bias = np.asarray(state[head.bias_key], dtype=np.float64)
    return {name: np.append(weight[i], bias[i]) for i, name in enumerate(classes)}


def require_reference(name: str) -> Path:
    """A torchxrayvision data file; CI installs it, so there its absence fails instead of skipping."""
    path = reference_file(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} missing: CI must install torchxrayvision (pip install --no-deps torchxrayvision)")
        pytest.skip(f"{name} not installed (pip install --no-deps torchxrayvision)")
    return path


def errors_and_tail(output: str, tail: int = 3000) -> str:
    """What a failed simulator run's assertion shows: each ERROR line of its output (a site lost at its start, a
    refused handshake: often long before its end), then its last ``tail`` characters."""
    errors = [line for line in output.splitlines() if " - ERROR - " in line]
    return "\n".join([*errors[:40], "...", output[-tail:]])


def tiny_sites(sites: dict[str, dict], cache: Path, network: str = SMOKE_DENSENET) -> dict[str, dict]:
    """Site configs shrunk for tests: 30 patients of 32 px per site, 2 batches of 8 per epoch, the smoke network
    (``network``: DenseNet121 where a test needs the papers' network)."""
    return {
        site: {
            **config,
            "embedded": {**config.get("embedded", {}), "patients": 30, "image_size": 32},
            "image_size": 32,
            "network": network,
            "batch_size": 8,
            "max_batches_per_epoch": 2,
            "cache_dir": str(cache),
        }
        for site, config in sites.items()
    }


def tiny_recipe(
    make_recipe, cache: Path, rounds: int, network: str = SMOKE_DENSENET, **options
) -> SurgicalAggregationRecipe:
    """One of the bundle's recipes shrunk for tests (tiny sites on ``network``, ``rounds`` rounds, short timeouts; the
    main job from scratch: its stand-in is a DenseNet121 that takes minutes to build); ``options`` go to
    :class:`SurgicalAggregationRecipe` (``controller`` entries are added to the job's)."""
    bundle = make_recipe(start=SCRATCH) if make_recipe is nih_chexpert_recipe else make_recipe()
    controller = {
        **bundle.controller_args,
        "num_rounds": rounds,
        "handshake_timeout": 300,
        "train_timeout": 300,
        "validate_timeout": 300,
        **options.pop("controller", {}),
    }
    sites = tiny_sites(bundle.site_configs, cache, network)
    return SurgicalAggregationRecipe(bundle.name, sites, controller=controller, **options)


def union_of_the_seven_label_files() -> set[str]:
    """The classes of NIH, CheXpert, PadChest, VinDr-CXR, Google's NIH labels, RSNA and SIIM, read straight from
    torchxrayvision's copies of their label files with pandas (not through the bundle's loaders), by the rules
    ``images/public.py`` documents, named through the built-in vocabulary."""
    import ast

    import pandas as pd

    from surgical_aggregation.core.labels import BUILTIN_VOCABULARY

    raw_names: set[str] = set()
    nih = pd.read_csv(require_reference("Data_Entry_2017_v2020.csv.gz"), usecols=["Finding Labels"])
    raw_names |= {token for labels in nih["Finding Labels"] for token in labels.split("|")} - {"No Finding"}
    chexpert = pd.read_csv(require_reference("chexpert_train.csv.gz"), nrows=0)
    raw_names |= set(chexpert.columns[5:]) - {"No Finding"}
    padchest = pd.read_csv(
        require_reference("PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv.gz"),
        usecols=["Projection", "Labels"],
    )
    frontal = padchest[padchest["Projection"].isin(["PA", "AP", "AP_horizontal"]) & padchest["Labels"].notna()]
    lists = [[name.strip() for name in ast.literal_eval(text)] for text in frontal["Labels"]]
    remarks = {"", "normal", "exclude", "suboptimal study", "unchanged"}
    raw_names |= {name for names in lists if "exclude" not in names for name in names} - remarks
    vindr = pd.read_csv(require_reference("vinbigdata-train.csv.gz"), usecols=["class_name"])
    raw_names |= set(vindr["class_name"]) - {"No finding"}
    raw_names |= {"Fracture", "Pneumothorax", "Airspace opacity", "Nodule or mass"}  # Google's four columns
    raw_names |= {"Pneumonia"}  # RSNA's Target
    raw_names |= {"Pneumothorax"}  # SIIM's masks
    return {BUILTIN_VOCABULARY.canonical(name) for name in raw_names}


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T]) -> T:
    """A module fixture's run, built once per test session also under pytest-xdist (whose workers each run a
    module's fixtures again when its tests are spread over them): the first worker to ask builds it in a folder
    under the temporary root all workers share, the others wait for it and read its result (pickled)."""
    shared = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        shared = shared.parent  # pytest-of-<user>/pytest-<n>/, above each worker's popen-gw<k>/
    result = shared / f"{name}.pickle"
    failed = shared / f"{name}.failed"
    with FileLock(str(shared / f"{name}.lock")):
        if result.is_file():
            return pickle.loads(result.read_bytes())
        if failed.is_file():  # one failed build is enough: its traceback is in the test that made it
            raise RuntimeError(f"the shared run {name!r} failed in another test: {failed.read_text()}")
        try:
            value = build(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared)))
        except BaseException as error:
            failed.write_text(f"{type(error).__name__}: {error}"[:2000])
            raise
        result.write_bytes(pickle.dumps(value))
        return value


def run_main_job(
    root: Path, blind: bool = False, configure: Callable[[dict[str, dict]], dict[str, dict]] | None = None
) -> tuple[int, str, Path]:
    """The main job shrunk (:func:`tiny_recipe`, 2 rounds) through ``nvflare simulator -t 2`` as the README runs it,
    plain or ``blind`` (``configure`` adds to the site configs, e.g. the consortium's secret): (exit code, output,
    workspace). Each site records every exchange in full (``record_exchanges``), so that the blind run's models are
    compared with the plain run's."""
    cache = root / "cache"
    bundle = tiny_recipe(nih_chexpert_recipe, cache, rounds=2)
    configs = {site: {**config, "record_exchanges": "full"} for site, config in bundle.site_configs.items()}
    written_by_the_recipe = ("preprocessing", "publish_global_model")
    controller = {key: value for key, value in bundle.controller_args.items() if key not in written_by_the_recipe}
    recipe = SurgicalAggregationRecipe(bundle.name, (configure or dict)(configs), controller=controller, blind=blind)
    job = write_job(recipe, root / "job")
    code, output = load_benchmark("hostile_site").run_simulator(job, root / "ws", cache=cache, timeout=900)
    (root / "simulator.log").write_text(output)
    return code, output, root / "ws"


def build_main_run(root: Path) -> tuple[int, str, Path]:
    """The plain main run (:func:`run_main_job`)."""
    return run_main_job(root)


def snippet_under_test(page: Path) -> str:
    """The python block that follows the page's "tested by tests/test_docs.py" marker."""
    text = page.read_text()
    after = text[text.index(TESTED) :]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def build_snippet_run(root: Path) -> Path:
    """``docs/library.md``'s recipe snippet run as written (the main job in FLARE's SimEnv, tracked with MLflow), with
    tiny sites and 2 rounds in place of the bundle's: its workspace."""
    snippet = snippet_under_test(REPOSITORY / "docs" / "library.md")
    assert "/tmp/sa-recipe" in snippet and "nih_chexpert_recipe(" in snippet
    bundle_recipe = recipes.nih_chexpert_recipe
    recipes.nih_chexpert_recipe = lambda **options: tiny_recipe(bundle_recipe, root / "cache", rounds=2, **options)
    threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # as the main run's sites: the determinism test compares the two exactly
    try:
        exec(compile(snippet.replace("/tmp/sa-recipe", str(root / "ws")), "docs/library.md", "exec"), {})
    finally:
        recipes.nih_chexpert_recipe = bundle_recipe
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = threads
    return root / "ws"


def load_benchmark(name: str):
    """A script of ``benchmarks/`` as a module (its dataclasses look it up in ``sys.modules``; ``benchmarks/`` is on
    the path while it loads, for the scripts that import each other)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def write_dicom(pixels: np.ndarray, path: Path, monochrome1: bool = False) -> Path:
    """``pixels`` (uint8, H x W) as a PACS would export them: a CR image of 12 stored bits with a window that shows
    them as they were (MONOCHROME1: stored inverted, as many CR systems do)."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1"  # Computed Radiography Image Storage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    dataset = Dataset()
    dataset.file_meta = meta
    dataset.SOPClassUID, dataset.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    dataset.Modality = "CR"
    stored = pixels.astype(np.uint16) * 16  # 0..4080 of 4095
    if monochrome1:
        stored = 4095 - stored
    dataset.PhotometricInterpretation = "MONOCHROME1" if monochrome1 else "MONOCHROME2"
    dataset.Rows, dataset.Columns = stored.shape
    dataset.SamplesPerPixel, dataset.BitsAllocated, dataset.BitsStored, dataset.HighBit = 1, 16, 12, 11
    dataset.PixelRepresentation = 0
    dataset.WindowCenter, dataset.WindowWidth = 2048, 4096
    dataset.PixelData = stored.tobytes()
    dataset.save_as(path, enforce_file_format=True)
    return path


def audit_exchange(app: Path, round_number: int, direction: str, task: str = "train") -> tuple[dict, list[str]]:
    """(state, class names) of one exchange a site's audit kept (``flare.audit``): ``direction`` received, sent, or
    in blind mode decrypted, encrypted, of its ``task`` in ``round_number``."""
    from surgical_aggregation.flare.audit import read_audit

    (record,) = [
        record
        for record in read_audit(app)
        if record["task"] == task and record["round"] == round_number and record["direction"] == direction
    ]
    payload = torch.load(app / record["tensors"], weights_only=False)
    return payload["state"], record["class_names"]


def better_off_by_a_base_rate(judged: dict[str, dict]) -> None:
    """Each judge of a leave-one-out candidate (a round history's ``screening.left_out[...]``) was materially better
    off by its loss as it is, and by nearly nothing once each model is recalibrated in the large: its test on those
    (on record, ``recalibrated``) does not reject, so a verdict on both losses would have left the contribution in.
    What a site negating and doubling its update under the plain mean takes from the others in these small runs is
    their base rates (docs/server-checks.md: why the verdicts judge the losses as they are)."""
    for figures in judged.values():
        loss = figures["loss"]
        assert figures["verdict"] == "better" and loss["p"] < 1e-3, figures
        assert 0 < loss["recalibrated"]["better_by"] < 0.1 * loss["better_by"] and loss["recalibrated"]["p"] > 0.5
