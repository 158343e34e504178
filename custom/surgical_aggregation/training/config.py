"""A site's configuration: where its data is, which labels it trains, and how it trains.

One JSON file per site. Every field has a default; an unknown field, a wrong type or an
out-of-range value is an error that names the file and the field, so hospital IT sees exactly
what to fix. ``data.location: null`` means "no real data here": the site then trains on the
generated dataset of its ``data.kind`` shipped with its modality (and says so in its log).

This module holds the fields every site has; what a kind of data needs besides (the fields of images or
of reports) belongs to its modality (``modalities``), which checks it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from ..core.devices import AUTO
from ..core.errors import AliasFileError, DuplicateLabelError, SiteConfigError, UnknownLabelError
from ..core.labels import Vocabulary, read_alias_file
from ..data.names import RECORD_MODES
from ..data.site_view import DataConfig
from ..data.storage import default_cache_root
from ..modalities.registry import Modality, modality_for_kind, modality_kinds, registered_modalities
from .privacy import DifferentialPrivacy, dp_off_but_set
from .profiles import PAPERS_WARMUP_EPOCHS

OPTIMIZERS = ("adam", "adamw", "sgd")
COMPILE_MODES = ("off", "on")
CUDA_GRAPH_MODES = ("auto", "off")
DEVICES = (AUTO, "cpu", "cuda")
JOB_SUPPLIED = "job_supplied"  # metadata of the fields a job gives a loaded config, absent from the site's file
MODALITY_FIELDS = "modality_fields"  # metadata of the field holding the modality's own (flat in the file)


@dataclass
class SiteConfig:
    """Every field defaults to the papers' settings (batch 64, 15 warm-up epochs, Adam at 5e-5, ...), but the head
    warm-up's learning rate: 1e-3, their public code's (the papers' 5e-3 is the ``paper`` profile's).

    ``settings`` holds the fields of the data's modality (for images their size and normalisation, for reports the
    sentence encoder) as the modality's own dataclass (``Modality.settings_type``); they sit flat in the JSON next to
    these general fields, and the modality checks them.
    """

    data: DataConfig = field(default_factory=DataConfig)
    batch_size: int = 64
    optimizer: str = "adam"
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    local_epochs: int = 1
    warmup_epochs: int = PAPERS_WARMUP_EPOCHS
    warmup_learning_rate: float = 1e-3
    max_batches_per_epoch: int | None = None  # cap for quick runs; null = whole epochs
    workers: int | str = AUTO  # DataLoader worker processes; auto: core.devices.auto_workers
    cpu_threads: int | None = None  # torch CPU threads; null = torch's default
    device: str = AUTO  # auto | cpu | cuda | cuda:N
    # processes that train the local epochs together (PyTorch DDP): one per GPU from the device's index on
    # (cuda:N, N+1, ...); on a CPU, processes over gloo (for tests). 1 = this process alone
    gpus: int = 1
    amp: bool = True  # mixed precision on CUDA: bf16 where the GPU has it, else fp16 (ignored on CPU)
    compile: str = "off"  # on: torch.compile the training step (a first-step cost; see docs/performance.md)
    # auto: on a GPU, the training step (forward, loss, backward, Adam) captured once as a CUDA graph and replayed
    # (training.loops.GraphedStep) where that is exact; off: every step launched kernel by kernel
    cuda_graphs: str = "auto"
    cache_dir: str | None = None  # null = $SURGICAL_AGGREGATION_CACHE or ~/.cache/surgical_aggregation
    seed: int = 0
    record_exchanges: str = "head"  # what to keep of each model exchange: head | full | off (flare.audit)
    # blind mode: the consortium's secret file (core.blind.BlindSecret), kept in the site workspace's local/ folder,
    # never in a job; a site with one takes part in blind jobs only (flare.blind_site)
    blind_secret: str | None = None
    # DP-SGD over this site's local training, with this site's own budget (training.privacy); off by default
    differential_privacy: DifferentialPrivacy = field(default_factory=DifferentialPrivacy)
    settings: Any = field(default=None, metadata={MODALITY_FIELDS: True})  # the modality's (its settings_type)
    # the job's label aliases, given by whoever loads the config for a job (never read from the site's file)
    job_aliases: dict[str, str] = field(default_factory=dict, metadata={JOB_SUPPLIED: True})

    def __post_init__(self) -> None:
        if self.settings is None:
            self.settings = self.modality.settings_type()

    def to_dict(self) -> dict[str, Any]:
        """The site's file as JSON values: the general fields and the modality's, flat (the job's aliases are the
        job's, not part of it)."""
        values = dataclasses.asdict(self)
        for name in _job_supplied_fields(SiteConfig):
            values.pop(name)
        return {"data": values.pop("data"), **values.pop("settings"), **values}

    @property
    def modality(self) -> Modality:
        """What the data is (images or reports), and so which model reads it."""
        return modality_for_kind(self.data.kind)

    @property
    def vocabulary(self) -> Vocabulary:
        """How this site names classes: the built-in vocabulary, its own aliases, then the job's (which win)."""
        return Vocabulary(
            [(self.data.label_aliases or {}, "data.label_aliases"), (self.job_aliases, "the job's aliases")]
        )

    @property
    def cache_root(self) -> Path:
        """Where decoded images, embeddings and generated datasets are kept."""
        return Path(self.cache_dir) if self.cache_dir else default_cache_root()


_TYPE_WORDS = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def _check_type(value: Any, expected: Any, where: str) -> Any:
    """Check a JSON value against the field's annotation; ints are accepted (as floats) for floats."""
    if get_origin(expected) in (Union, UnionType):
        options = [option for option in get_args(expected) if option is not type(None)]
        if value is None and len(options) < len(get_args(expected)):
            return None
        if len(options) > 1:
            for option in options:
                try:
                    return _check_type(value, option, where)
                except SiteConfigError:
                    continue
            words = " or ".join(_TYPE_WORDS[get_origin(option) or option] for option in options)
            raise SiteConfigError(f"{where} must be {words}, got {value!r}")
        expected = options[0]
    if value is None:
        raise SiteConfigError(f"{where} must not be null")
    base = get_origin(expected) or expected
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, base) or (isinstance(value, bool) and base is not bool):
        raise SiteConfigError(f"{where} must be {_TYPE_WORDS[base]}, got {value!r}")
    return value


def _job_supplied_fields(cls: type) -> set[str]:
    return {f.name for f in fields(cls) if f.metadata.get(JOB_SUPPLIED)}


def _build(cls: type, values: Mapping[str, Any], source: str, prefix: str = "") -> Any:
    """``cls`` from a JSON object; errors read ``<source>: <field> ...`` (``prefix``: the enclosing field's path)."""
    if not isinstance(values, Mapping):
        what = prefix.rstrip(".") or "the config"
        raise SiteConfigError(f"{source}: {what} must be an object, got {values!r}")
    hints = get_type_hints(cls)
    known = [f.name for f in fields(cls) if not f.metadata]  # the modality's and the job's: not from this object
    unknown = sorted(set(values) - set(known))
    if unknown:
        of = f" of {prefix.rstrip('.')}" if prefix else ""
        raise SiteConfigError(
            f"{source}: unknown field(s) {[prefix + name for name in unknown]}; known fields{of}: {known}"
        )
    arguments = {}
    for name, value in values.items():
        expected = hints[name]
        if dataclasses.is_dataclass(expected):
            arguments[name] = _build(expected, value, source, f"{prefix}{name}.")
        else:
            arguments[name] = _check_type(value, expected, f"{source}: {prefix}{name}")
    return cls(**arguments)


def _build_site_config(values: Mapping[str, Any], source: str) -> SiteConfig:
    """The general fields, then the fields of the modality ``data.kind`` names (flat in the same object). Another
    modality's field is accepted at its default value (a file that lists every field of the bundle) and refused at any
    other, since nothing would read it."""
    if not isinstance(values, Mapping):
        raise SiteConfigError(f"{source}: the config must be an object, got {values!r}")
    data = _build(DataConfig, values.get("data", {}), source, "data.")
    kinds = modality_kinds()
    if data.kind not in kinds:
        raise SiteConfigError(f"{source}: data.kind must be one of {list(kinds)}, got {data.kind!r}")
    modality = modality_for_kind(data.kind)
    general = [f.name for f in fields(SiteConfig) if not f.metadata]
    own = [f.name for f in fields(modality.settings_type)]
    others = {
        name: other
        for other in registered_modalities()
        if other is not modality
        for name in (f.name for f in fields(other.settings_type))
        if name not in own
    }
    unknown = sorted(set(values) - set(general) - set(own) - set(others))
    if unknown:
        raise SiteConfigError(f"{source}: unknown field(s) {unknown}; known fields: {[*general, *own]}")
    for name in sorted(set(values) & set(others)):
        owner = others[name]
        default = getattr(owner.settings_type(), name)
        given = values[name]
        if dataclasses.is_dataclass(default):  # read as the owner reads it: a field the file leaves out is its default
            given = dataclasses.asdict(_build(type(default), given, source, f"{name}."))
            default = dataclasses.asdict(default)
        if given != default:
            raise SiteConfigError(
                f"{source}: {name} is read by {owner.name} sites only; this site's data (kind {data.kind!r}) is "
                f"{modality.name}: remove it"
            )
    config = _build(SiteConfig, {name: values[name] for name in general if name in values}, source)
    config.settings = _build(modality.settings_type, {name: values[name] for name in own if name in values}, source)
    return config


def _check_and_resolve(config: SiteConfig, where: str, base_dir: Path | None) -> None:
    def fail(field_name: str, message: str) -> SiteConfigError:
        return SiteConfigError(f"{where}: {field_name} {message}")

    data = config.data
    if data.location not in (None, DATA_LOCATION_PLACEHOLDER):  # "~/data" is the user's home's data
        data.location = str(Path(data.location).expanduser())
    if config.cache_dir is not None:
        config.cache_dir = str(Path(config.cache_dir).expanduser())
    if base_dir is not None:  # relative paths start at the config file's folder, as data.label_aliases does
        location = data.location
        if location not in (None, DATA_LOCATION_PLACEHOLDER) and not Path(location).is_absolute():
            data.location = str((base_dir / data.location).resolve())
        if config.cache_dir is not None and not Path(config.cache_dir).is_absolute():
            config.cache_dir = str((base_dir / config.cache_dir).resolve())
        if config.blind_secret is not None and not Path(config.blind_secret).expanduser().is_absolute():
            config.blind_secret = str((base_dir / config.blind_secret).resolve())
    config.modality.check(config, where)
    if isinstance(data.label_aliases, str):  # inlined, so that a job written from this config carries them
        path = Path(data.label_aliases).expanduser()
        try:
            data.label_aliases = read_alias_file(path if path.is_absolute() or base_dir is None else base_dir / path)
        except AliasFileError as error:
            raise SiteConfigError(f"{where}: data.label_aliases: {error}") from None
    try:
        vocabulary = config.vocabulary
        if data.labels is not None:
            if not data.labels:
                raise fail("data.labels", "must list at least one finding (or be null for all of the dataset's)")
            data.labels = vocabulary.canonical_list(data.labels, f"{where}: data.labels")
    except AliasFileError as error:
        raise SiteConfigError(f"{where}: {error}") from None
    except (UnknownLabelError, DuplicateLabelError) as error:
        raise SiteConfigError(str(error)) from None
    fractions = data.split_fractions
    if len(fractions) != 3 or any(not isinstance(f, (int, float)) or f < 0 for f in fractions):
        raise fail("data.split_fractions", f"must be three non-negative numbers (train, val, test), got {fractions}")
    if abs(sum(fractions) - 1) > 1e-6 or fractions[0] <= 0 or fractions[1] <= 0:
        raise fail("data.split_fractions", f"must sum to 1 with non-empty train and val shares, got {fractions}")
    if data.partition_count < 1 or not 0 <= data.partition_index < data.partition_count:
        raise fail(
            "data.partition_index",
            f"must be in [0, partition_count={data.partition_count}), got {data.partition_index}",
        )
    if not 0 < data.train_subsample <= 1:
        raise fail("data.train_subsample", f"must be in (0, 1], got {data.train_subsample}")
    positive = {"batch_size": config.batch_size, "local_epochs": config.local_epochs, "gpus": config.gpus}
    for name, value in positive.items():
        if value <= 0:
            raise fail(name, f"must be positive, got {value}")
    if config.warmup_epochs < 0:
        raise fail("warmup_epochs", f"must not be negative, got {config.warmup_epochs}")
    if config.workers != AUTO and not (isinstance(config.workers, int) and config.workers >= 0):
        raise fail("workers", f"must be a whole number >= 0 or {AUTO!r}, got {config.workers!r}")
    if config.compile not in COMPILE_MODES:
        raise fail("compile", f"must be one of {list(COMPILE_MODES)}, got {config.compile!r}")
    if config.cuda_graphs not in CUDA_GRAPH_MODES:
        raise fail("cuda_graphs", f"must be one of {list(CUDA_GRAPH_MODES)}, got {config.cuda_graphs!r}")
    for name in ("learning_rate", "warmup_learning_rate"):
        if not getattr(config, name) > 0:
            raise fail(name, f"must be positive, got {getattr(config, name)}")
    if config.max_batches_per_epoch is not None and config.max_batches_per_epoch <= 0:
        raise fail("max_batches_per_epoch", f"must be positive or null, got {config.max_batches_per_epoch}")
    if config.cpu_threads is not None and config.cpu_threads <= 0:
        raise fail("cpu_threads", f"must be positive or null, got {config.cpu_threads}")
    if config.optimizer not in OPTIMIZERS:
        raise fail("optimizer", f"must be one of {list(OPTIMIZERS)}, got {config.optimizer!r}")
    if config.device.split(":")[0] not in DEVICES:
        raise fail("device", f"must be auto, cpu, cuda or cuda:N, got {config.device!r}")
    config.differential_privacy.check(where)
    if config.record_exchanges not in RECORD_MODES:
        raise fail("record_exchanges", f"must be one of {list(RECORD_MODES)}, got {config.record_exchanges!r}")


def _refuse_a_partial_dp_block_without_epsilon(block: Any, where: str) -> None:
    """A ``differential_privacy`` block that names DP fields but leaves ``epsilon`` null would train without DP,
    silently, whatever the values (``release_validation: "loss"`` alone would even send per-class figures). DP is off
    by leaving the block out, ``{"epsilon": null}``, or the whole block as a written job carries it (every field,
    epsilon null; a changed value there is refused by :meth:`DifferentialPrivacy.check`)."""
    if not isinstance(block, Mapping) or block.get("epsilon") is not None:
        return
    named = sorted(set(block) - {"epsilon"})
    every_field = {item.name for item in fields(DifferentialPrivacy)}
    if named and set(block) != every_field:
        raise dp_off_but_set(named, where)


def site_config_from_dict(
    values: Mapping[str, Any],
    where: str = "site config",
    base_dir: Path | None = None,
    job_aliases: Mapping[str, str] | None = None,
) -> SiteConfig:
    """Build and validate a :class:`SiteConfig`; ``where`` names the source in errors, ``base_dir`` is where
    relative file names in it start (its file's folder), ``job_aliases`` the label aliases of the job it is loaded
    for (its vocabulary reads the site's labels with them)."""
    _refuse_a_partial_dp_block_without_epsilon(values.get("differential_privacy"), where)
    config = _build_site_config(values, where)
    config.job_aliases = dict(job_aliases or {})
    _check_and_resolve(config, where, base_dir)
    return config


def load_site_config(path: str | Path, job_aliases: Mapping[str, str] | None = None) -> SiteConfig:
    """A site's config file, loaded for a job with ``job_aliases`` (none: the built-in and the site's own)."""
    path = Path(path)
    if not path.is_file():
        raise SiteConfigError(f"site config not found: {path}")
    try:
        values = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise SiteConfigError(f"{path}: not valid JSON ({error})") from None
    return site_config_from_dict(values, where=str(path), base_dir=path.parent, job_aliases=job_aliases)


# data.location in a provisioned kit's template, refused until hospital IT sets it
DATA_LOCATION_PLACEHOLDER = "REQUIRED: the dataset folder at this site (the CSV file for kind csv)"
SITE_CONFIG_ENV = "SURGICAL_AGGREGATION_SITE_CONFIG"
SITE_CONFIGS_DIR = "site_configs"  # a job's default configs, under each site app's config/ folder
JOB_DEFAULT_ORIGIN = "the job's default for this site"
SITE_LOCAL_CONFIG = "surgical_aggregation.json"


def find_site_config(site_name: str, app_dir: str | Path) -> tuple[Path, str]:
    """Where this site's config is, and why that one. Looked up in order:

    1. the file named by the ``SURGICAL_AGGREGATION_SITE_CONFIG`` environment variable;
    2. ``<site workspace>/local/surgical_aggregation.json`` (a provisioned site's own folder,
       edited by hospital IT, never shipped with a job);
    3. the job's default, ``<app>/config/site_configs/<site name>.json``.

    ``app_dir`` is the job's app folder at the site (``<site workspace>/<job id>/app_<site>``).
    """
    app_dir = Path(app_dir)
    candidates: list[tuple[Path, str]] = []
    if os.environ.get(SITE_CONFIG_ENV):
        candidates.append((Path(os.environ[SITE_CONFIG_ENV]), f"${SITE_CONFIG_ENV}"))
    if len(app_dir.parents) >= 2:
        candidates.append((app_dir.parents[1] / "local" / SITE_LOCAL_CONFIG, "the site's local folder"))
    candidates.append((app_dir / "config" / SITE_CONFIGS_DIR / f"{site_name}.json", JOB_DEFAULT_ORIGIN))
    for path, origin in candidates:
        if path.is_file():
            return path, origin
    looked = "; ".join(str(path) for path, _ in candidates)
    raise SiteConfigError(f"no site config for {site_name!r}; looked for: {looked}")
