"""The papers' experiment settings as site configs (no FLARE): simulated federations from NIH, NIH +
CheXpert, and the report-labelling grids.

Simulated (Kulkarni et al., *Surgical Aggregation: A Collaborative Learning Framework for Harmonizing
Distributed Medical Imaging Datasets with Diverse Tasks*): the NIH patients are split by patient (the profile's
fractions); the training and validation patients are dealt IID (stratified) to K sites, the test split is the
common held-out set; each site trains a label subset chosen for a label heterogeneity psi (share of labels not
shared by all sites); N keeps a fraction of each site's training patients. Every seed draws the label subsets, the
split and the partition anew (:meth:`Setting.for_seed`). Each setting comes in two controls: ``missing`` (a site's
images show the federation's findings it does not label, as real images do) and ``absent`` (on embedded data only:
they are left out of its images, so its negatives are true ones; at psi = 0 the two are the same). Real: an NIH
site and a CheXpert site with the 7 shared labels only, or all 20.

Data comes from real folders when given (``DataSources``), the embedded generated datasets otherwise.
Everything here is plain dicts in the site-config format, validated by
:func:`surgical_aggregation.training.config.site_config_from_dict`, with the training settings of a profile.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np

from ..core.errors import SiteConfigError
from ..core.labels import CHEXPERT_LABELS, NIH_LABELS
from ..data.reference import CHEXPERT_LABEL_FILE, NIH_LABEL_FILE, reference_file
from ..images.names import SHARED_ROWS
from ..training.profiles import Profile
from .choices import ABSENT, CONTROLS, MISSING

K_VALUES = (2, 3, 4, 5, 6, 8, 10)
PSI_VALUES = (
    Fraction(0),
    Fraction(2, 14),
    Fraction(6, 14),
    Fraction(10, 14),
    Fraction(12, 14),
    Fraction(13, 14),
    Fraction(1),
)
N_VALUES = (Fraction(1, 10), Fraction(1, 8), Fraction(1, 6), Fraction(1, 4), Fraction(1, 3), Fraction(1, 2))
K_GRID_PSI = Fraction(4, 14)  # the K sweep uses the N sweep's heterogeneity
PSI_GRID_K = 4
N_GRID_K, N_GRID_PSI = 2, Fraction(4, 14)


def assign_label_sets(labels: Sequence[str], n_sites: int, psi: float | Fraction, seed: int = 0) -> list[list[str]]:
    """Label subsets for ``n_sites`` sites with label heterogeneity ``psi``.

    ``round(psi * len(labels))`` labels (which must be exact) are held by one site each, dealt
    round-robin after a seeded shuffle; the others are held by every site. Every label is held
    somewhere; each site's labels keep the order of ``labels``.
    """
    labels = list(labels)
    if n_sites < 1:
        raise ValueError(f"need at least one site, got {n_sites}")
    if not 0 <= psi <= 1:
        raise ValueError(f"psi must be in [0, 1], got {psi}")
    n_unique = round(float(psi) * len(labels))
    if abs(float(psi) * len(labels) - n_unique) > 1e-9:
        raise ValueError(f"psi={psi} is not a whole number of the {len(labels)} labels")
    n_shared = len(labels) - n_unique
    if n_unique and n_sites < 2:
        raise ValueError("label heterogeneity needs at least two sites")
    if n_shared == 0 and n_unique < n_sites:
        raise ValueError(f"psi={psi} leaves {n_unique} labels for {n_sites} sites: some site would have none")
    order = [labels[index] for index in np.random.default_rng(seed).permutation(len(labels))]
    holders: dict[str, set[int]] = {name: set(range(n_sites)) for name in order[:n_shared]}
    for position, name in enumerate(order[n_shared:]):
        holders[name] = {position % n_sites}
    return [[name for name in labels if site in holders[name]] for site in range(n_sites)]


def shared_labels(label_sets: Sequence[Sequence[str]]) -> list[str]:
    """Labels every site holds (in the first site's order)."""
    return [name for name in label_sets[0] if all(name in labels for labels in label_sets)]


@dataclass
class DataSources:
    """Real dataset folders; None means the embedded generated dataset of that kind."""

    nih: str | None = None
    chexpert: str | None = None
    mimic: str | None = None
    embedded_patients: int = 400
    embedded_image_size: int = 64
    external_patients: int = 400  # the embedded external (MIMIC-layout) test set
    co_occurrence: str = SHARED_ROWS  # how embedded images draw the findings their layout does not label

    def data(self, kind: str) -> dict[str, Any]:
        return {"kind": kind, "location": getattr(self, kind)}

    def missing_label_files(self) -> list[str]:
        """torchxrayvision's label files whose real rows this grid's embedded datasets draw their labels from, and
        that this machine lacks. Any embedded dataset needs both: its own layout's rows, and the other file's rows
        for the findings its layout does not label (``images.synthetic_labels.finding_donors``)."""
        if None not in (self.nih, self.chexpert, self.mimic):
            return []
        return [name for name in (NIH_LABEL_FILE, CHEXPERT_LABEL_FILE) if reference_file(name) is None]

    def embedded_labels(self) -> str:
        """Where the embedded datasets' labels come from here, as a grid's plan records it."""
        missing = self.missing_label_files()
        if missing:
            return f"built-in frequencies, each finding on its own ({', '.join(missing)} not installed)"
        return "real label rows of torchxrayvision's data files"

    def embedded(self, patients: int | None = None) -> dict[str, Any]:
        settings = {"patients": patients or self.embedded_patients, "image_size": self.embedded_image_size, "seed": 0}
        if self.co_occurrence != SHARED_ROWS:  # written only when chosen: the default's configs stay as they were
            settings["co_occurrence"] = self.co_occurrence
        return settings


@dataclass
class TestSet:
    """A labelled evaluation set: a dataset as a site config describes it, its ``test`` split or ``all`` of it."""

    name: str
    config: dict[str, Any]
    split: str = "test"  # test | all (external)


@dataclass(frozen=True)
class LabelDraw:
    """How each seed draws a setting's label subsets: ``labels`` dealt to its sites with heterogeneity ``psi``."""

    labels: tuple[str, ...]
    psi: Fraction


@dataclass
class Setting:
    """One point of a grid: the sites' configs and the sets the resulting models are tested on."""

    name: str
    factor: str  # K | psi | N | labels
    value: float
    sites: dict[str, dict[str, Any]]
    test_sets: list[TestSet]
    label_sets: dict[str, list[str]] = field(default_factory=dict)
    repartition: bool = False  # each seed also draws new splits and partitions (data.split_seed = seed)
    control: str = MISSING  # or ABSENT: a site's unlabelled findings drawn as decoys (embedded data only)
    label_draw: LabelDraw | None = None  # each seed draws the label subsets anew (None: fixed ``label_sets``)

    @property
    def shared_classes(self) -> list[str]:
        return shared_labels(list(self.label_sets.values()))

    def for_seed(self, seed: int) -> Setting:
        """The setting as seed ``seed`` runs it: its label subsets drawn, its split and partition seeded (and the test
        split with them), and under the absent control the federation's classes each site does not label left out of
        its images."""
        sites, tests, label_sets = copy.deepcopy(self.sites), list(self.test_sets), dict(self.label_sets)
        if self.label_draw is not None:
            drawn = assign_label_sets(self.label_draw.labels, len(sites), self.label_draw.psi, seed)
            label_sets = dict(zip(sites, drawn, strict=True))
            for site, labels in label_sets.items():
                sites[site]["data"]["labels"] = labels
        if self.repartition:
            for config in sites.values():
                config["data"]["split_seed"] = seed
            tests = [replace(t, config={**t.config, "data": {**t.config["data"], "split_seed": seed}}) for t in tests]
        if self.control == ABSENT:
            union = {name for labels in label_sets.values() for name in labels}
            for site, config in sites.items():
                if config["data"].get("location"):
                    raise SiteConfigError(f"{self.name} {site}: the absent control needs embedded data (no location)")
                # the federation's classes this site does not label: what vanilla FL would train it on as negatives
                # (findings no site labels stay, in every control: no method has a row for them)
                absent = sorted(union - set(label_sets[site]))
                config["embedded"] = {**config.get("embedded", {}), "absent": absent}
        return replace(self, sites=sites, test_sets=tests, label_sets=label_sets, repartition=False, label_draw=None)


def _site_config(
    sources: DataSources, profile: Profile, kind: str, patients: int | None = None, **data: Any
) -> dict[str, Any]:
    return profile.site_config({**sources.data(kind), **data}, embedded=sources.embedded(patients))


def _external(sources: DataSources, profile: Profile) -> list[TestSet]:
    """The external test set: MIMIC-CXR (embedded: MIMIC layout, all 20 findings of the main job labelled)."""
    return [TestSet("mimic", _site_config(sources, profile, "mimic", sources.external_patients), "all")]


def simulated_nih(
    n_sites: int,
    psi: float | Fraction,
    fraction: float | Fraction,
    sources: DataSources,
    profile: Profile,
    factor: str,
    value: float,
    control: str = MISSING,
) -> Setting:
    """K IID sites from NIH with heterogeneity psi and training fraction N; tested on NIH's test split. Each seed
    draws the label subsets, split and partition anew (the label sets shown are seed 0's)."""
    if control not in CONTROLS:
        raise ValueError(f"unknown control {control!r}; choose one of {CONTROLS}")
    label_sets = assign_label_sets(NIH_LABELS, n_sites, psi, 0)
    sites = {}
    for index, labels in enumerate(label_sets):
        sites[f"site-{index + 1}"] = _site_config(
            sources,
            profile,
            "nih",
            labels=labels,
            partition_count=n_sites,
            partition_index=index,
            train_subsample=float(fraction),
        )
    unique = round(float(psi) * len(NIH_LABELS))
    name = f"nih-K{n_sites}-psi{unique}of{len(NIH_LABELS)}-N{Fraction(fraction)}" + (
        "-absent" if control == ABSENT else ""
    )
    tests = [TestSet("nih", _site_config(sources, profile, "nih")), *_external(sources, profile)]
    label_map = dict(zip(sites, label_sets, strict=True))
    draw = LabelDraw(tuple(NIH_LABELS), Fraction(psi))
    return Setting(name.replace("/", "_"), factor, float(value), sites, tests, label_map, True, control, draw)


def nih_chexpert(shared_only: bool, sources: DataSources, profile: Profile) -> Setting:
    """The real two-site setting: the 7 shared labels only, or all 20."""
    shared = [name for name in NIH_LABELS if name in CHEXPERT_LABELS]
    nih_labels = shared if shared_only else list(NIH_LABELS)
    chexpert_labels = [name for name in CHEXPERT_LABELS if name in shared] if shared_only else list(CHEXPERT_LABELS)
    sites = {
        "site-nih": _site_config(sources, profile, "nih", labels=nih_labels),
        "site-chexpert": _site_config(sources, profile, "chexpert", labels=chexpert_labels),
    }
    tests = [
        TestSet("nih", _site_config(sources, profile, "nih", labels=nih_labels)),
        TestSet("chexpert", _site_config(sources, profile, "chexpert", labels=chexpert_labels)),
        *_external(sources, profile),
    ]
    count = len(shared) if shared_only else len(set(NIH_LABELS) | set(CHEXPERT_LABELS))
    return Setting(
        f"nih_chexpert-{count}labels",
        "labels",
        float(count),
        sites,
        tests,
        {"site-nih": nih_labels, "site-chexpert": chexpert_labels},
    )


# Report labelling (the report-labelling paper): the IU reports' 14 most frequent findings (47 or more positives).
REPORT_LABEL_COUNT = 14
REPORT_NODE_VALUES = tuple(range(2, 11))
REPORT_SHARED_VALUES = tuple(range(REPORT_LABEL_COUNT))


def report_labels() -> list[str]:
    """The IU findings of the report experiments, most frequent first."""
    from ..reports.data import load_iu_reports

    table, _ = load_iu_reports()
    return list(table.classes[:REPORT_LABEL_COUNT])


def report_setting(n_sites: int, shared: int, profile: Profile, factor: str, value: float) -> Setting:
    """IU reports dealt IID to ``n_sites``; ``shared`` findings at every site, each other finding at one."""
    labels = report_labels()
    label_sets = assign_label_sets(labels, n_sites, Fraction(len(labels) - shared, len(labels)))
    from ..reports.data import IU_REPORTS

    sites = {
        f"site-{index + 1}": profile.site_config(
            {"kind": IU_REPORTS, "labels": site_labels, "partition_count": n_sites, "partition_index": index}
        )
        for index, site_labels in enumerate(label_sets)
    }
    test = TestSet("iu", profile.site_config({"kind": IU_REPORTS, "labels": labels}))
    name = f"reports-K{n_sites}-shared{shared}of{len(labels)}"
    label_map = dict(zip(sites, label_sets, strict=True))
    return Setting(name, factor, float(value), sites, [test], label_map, repartition=True)


def grid_settings(
    grid: str, sources: DataSources, profile: Profile, controls: Sequence[str] = (MISSING,)
) -> list[Setting]:
    """The settings of a named grid: K, psi, N and nih_chexpert (the surgical aggregation papers), report_nodes
    and report_shared (the report-labelling paper), small (a quick check). The simulated grids' settings come in
    each of ``controls``; the K and N grids add a psi = 0 setting (every site labels every class: the federated
    methods give one model)."""
    simulated = []
    if grid == "K":
        simulated = [(k, K_GRID_PSI, 1, "K", k) for k in K_VALUES] + [(PSI_GRID_K, 0, 1, "psi", 0)]
    elif grid == "psi":
        simulated = [(PSI_GRID_K, psi, 1, "psi", float(psi)) for psi in PSI_VALUES]
    elif grid == "N":
        simulated = [(N_GRID_K, N_GRID_PSI, n, "N", float(n)) for n in N_VALUES] + [(N_GRID_K, 0, 1, "psi", 0)]
    elif grid == "small":
        simulated = [(PSI_GRID_K, psi, 1, "psi", float(psi)) for psi in (Fraction(0), Fraction(12, 14))]
    if simulated:
        return [
            simulated_nih(k, psi, n, sources, profile, factor, value, control)
            for control in controls
            for k, psi, n, factor, value in simulated
        ]
    if grid == "nih_chexpert":
        return [nih_chexpert(True, sources, profile), nih_chexpert(False, sources, profile)]
    if grid == "report_nodes":
        return [report_setting(k, 0, profile, "K", k) for k in REPORT_NODE_VALUES]
    if grid == "report_shared":
        return [report_setting(2, shared, profile, "shared", shared) for shared in REPORT_SHARED_VALUES]
    raise ValueError(f"unknown grid {grid!r}; choose one of {', '.join(GRIDS)}")


GRIDS = ("small", "K", "psi", "N", "nih_chexpert", "report_nodes", "report_shared")


def dataset_identity(config: Mapping[str, Any]) -> str:
    """Which dataset a site config reads (sites of one simulated federation share one)."""
    data = config["data"]
    if data.get("location"):
        return f"{data['kind']}:{data['location']}"
    embedded = config.get("embedded", {})
    return f"{data['kind']}:embedded-{embedded.get('patients')}p-{embedded.get('image_size')}px-s{embedded.get('seed')}"
