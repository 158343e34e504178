"""The arguments of :class:`~.controller.SurgicalAggregatorShareable` (its job config's ``args``): what each means,
and its check (before a job is written or run; each wrong value is a ``ValueError`` naming the argument).

num_rounds: maximum number of federated rounds.
min_clients: sites needed at the handshake and valid contributions needed to update the model.
method: "surgical" (the default), or a comparator: "vanilla", "partial_loss", "personal" (PFL).
backbone_strategy: "fedavg" (average everything, BatchNorm statistics included),
    "fedbn_plus" (BatchNorm frozen at the initial statistics on every site, never averaged)
    or "fedbn" (each site keeps and trains its own BatchNorm; PFL only).
weighting: "uniform" (the papers' unweighted mean) or "samples" (by training images, at most what each
    site declared at the handshake).
label_prior: FedSLD: sites share per-class training counts once, and re-weight their loss
    by the federation's label prior the server computes from them.
proximal_mu: FedProx's proximal term weight (0 = off).
patience: stop after this many validated rounds without a new best: a model whose judging sites'
    judged change of validation loss against their own loss of the best is below ``-min_delta``.
handshake_timeout / train_timeout / validate_timeout: seconds a site may take per task
    (0 waits forever; a dropped site then hangs the run).
final_validation: validate the last global model (and the best) after the last round.
publish_global_model: at the end, send the best global model (the union head and its class
    names) to every site, which keeps it in its workspace. This is when the sites learn the
    union's class names; off, the model stays on the server.
export_bundle: at the end, also write the best global model as a MONAI Bundle in the server's app folder
    (``monai_bundle/``: class names, how many sites labelled each, the round history's validation figures,
    TorchScript, and ONNX where the ``onnx`` extra is installed), as ``surgical-aggregation export-bundle`` does.
min_sites_per_published_class: publish (and export) only the classes that at least this many sites label;
    the others' head rows and names stay on the server. A class one site labels is that site's head row,
    unaveraged: 2 keeps every site's own-class training off the published model. 1 (the default) publishes all.
resume: how a job treats an unfinished federation of its name saved by an earlier job (after a server
    crash): "latest" continues from its last completed round, "backup" from the state saved one
    round earlier (when the latest is damaged), "never" starts afresh.
update_bound: reject a result whose update of a part of the model (backbone weights, BatchNorm
    statistics, a head row) is more than this many times the typical accepted update of earlier
    rounds (times the site's sample count over the typical accepted site's, where larger, at most 32
    times); caps relative to the global model apply too. None turns every update bound off (research).
clip_updates: with three or more sites moving a part of the model (backbone weights, BatchNorm statistics,
    a head row) in a round, scale each site's update of it down to the round's median size, so that no site
    moves it further than a typical site did. Off: the papers' plain means (the experiment grids turn it off).
reject_opposed_updates: with three or more results left in a round, reject a result whose update of the backbone
    weights points against the round's consensus (a cosine of 0 or below with the robust aggregate of all the
    round's updates, a copy counted once), head rows and all, unless half or more of the round's updates do. With
    exactly two results (``core.robust.two_sites_apart``), stop the job when, in its first round from untrained
    heads, their shared head rows point apart or their backbone updates point opposite (later rounds are not judged
    by direction). On by default; "first_round": the direction check once a site, in the first round that judges
    its direction (the job's first, or the one a site that missed it comes in; the two-site rule as with on), and
    after it a running opposition (``core.checks.update.persistently_opposed``: Page's CUSUM of the site's cosines,
    an update that takes it above its limit rejected), which the bundle's jobs set when they start from pretrained
    weights (``recipe.start_settings``: fine-tuned from them, honest sites of other vocabularies have pointed against
    the consensus in later rounds, by a little).
robust_aggregation: how the server aggregates each part of the model (the backbone's learned weights, a head row;
    the BatchNorm statistics keep their mean) that three or more sites moved in a round, after the size checks and
    the clipping:
    "mean" (the papers' plain mean), or a rule of :mod:`surgical_aggregation.core.robust` ("median",
    "trimmed_mean", "meamed", "geometric_median", "centered_clipping", "multi_krum", "mda", each with "nnm+"
    before it for nearest-neighbour mixing), or one for each part: ``{"backbone": ..., "head_rows": ...}`` (a part
    whose rule is "mean" keeps the weighted mean; the consensus of the warm-up round's head-row check and of the
    direction check takes the backbone's rule, as their thresholds were set under one rule for every part). A part
    fewer sites moved keeps its (weighted) mean; a robust rule counts each site once, whatever its sample count.
byzantine_sites: the hostile sites the robust rule tolerates among the sites that moved a part (None: the most
    it can, (n - 1) // 2 of n; never more).
update_noise: FLAME's lambda (0: off, the default): after the aggregation, the backbone's learned weights and each
    head row get Gaussian noise of standard deviation lambda x the round's median norm of that part's updates per
    value (FLAME uses 0.001 for image classification), the server's part of the defences against backdoors with the
    clipping (Sun et al., 2019).
robust_learning_rate: RLR's theta (0: off, the default): after the robust rule, each value of the
    backbone's learned weights and of each head row keeps the aggregate where the signs of the sites' updates agree
    (|sum of signs| at least theta) and is turned back where they do not (Ozdayi, Kantarcioglu and Gel, AAAI 2021).
    At three sites it led the exclusion to leave an honest site out (docs/server-checks.md): for research only.
validation_guard: a model that a judging site's own validation finds worse than the best model so far (or the
    initial one) by more than that site's noise (twice the standard error of the difference, from the standard
    errors the site reports) is never the best; and when the judged loss says such a model is the best, the sites
    disagree and the job stops, non-zero, naming them, with the last good model kept and nothing published.
    Off: the papers' selection by the judged loss alone (the experiment grids turn it off).
judging_sites: the sites whose validation losses select the best model and stop early (None: every
    site whose result was accepted; their mean with two, their median with three or more).
identity_batchnorm: with ``fedbn_plus``, train a model whose BatchNorm holds its default statistics
    (every BatchNorm the identity) on purpose; by default such a job is refused at its start.
max_classes_per_site / max_class_name_length: what a site may report at the handshake.
preprocessing: what every site must feed the model (image size, channels, normalisation, or the
    sentence encoder); a site that reports another is refused at the handshake. None: the first
    site's (in name order) decides.
label_aliases: the consortium's synonyms, ``{"alias": "class name"}``, over the built-in ones; the
    sites read the same mapping from the job (``config/label_aliases.json``).
accepted_classes: a closed vocabulary: a site bringing any other class is refused at the handshake
    (the run goes on with the others if ``min_clients`` allows). None: any class may join.
head_seed: seed of the initial head rows (one generator per class name).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.aggregation import WEIGHTINGS
from ..core.checks.update import OPPOSED_FIRST_ROUND
from ..core.methods import check_method
from ..core.robust import RobustRule
from ..core.strategies import strategy
from .protocol import RESUME_CHOICES, RESUME_LATEST, RESUME_NEVER

# written into the job's config even at their defaults, so an operator reading it sees the method
ALWAYS_WRITTEN = (
    "num_rounds",
    "min_clients",
    "method",
    "backbone_strategy",
    "weighting",
    "patience",
    "min_delta",
    "handshake_timeout",
    "train_timeout",
    "validate_timeout",
    "publish_global_model",
    "update_bound",
    "clip_updates",
    "reject_opposed_updates",
    "robust_aggregation",
    "validation_guard",
)
POSITIVE_WHOLE_NUMBERS = (
    "num_rounds",
    "min_clients",
    "max_classes_per_site",
    "max_class_name_length",
    "min_sites_per_published_class",
)


def checked_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` checked, with ``resume`` as one of :data:`RESUME_CHOICES` (``True``/``False`` are read as
    ``latest``/``never``), ``proximal_mu`` a float and ``judging_sites`` a list. Each rule applies to the arguments
    given: the blind workflow, which takes a part of them, is checked by the same rules."""
    values = dict(arguments)
    if "backbone_strategy" in values:
        strategy(values["backbone_strategy"])  # a known one (ValueError naming them)
    if "weighting" in values and values["weighting"] not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {values['weighting']!r}")
    if "method" in values:
        check_method(values["method"], values["backbone_strategy"])
    if "proximal_mu" in values:
        if not values["proximal_mu"] >= 0:
            raise ValueError(f"proximal_mu must not be negative, got {values['proximal_mu']!r}")
        values["proximal_mu"] = float(values["proximal_mu"])
    for name in POSITIVE_WHOLE_NUMBERS:
        value = values.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if "resume" in values:
        resume = values["resume"]
        if isinstance(resume, bool):
            values["resume"] = resume = RESUME_LATEST if resume else RESUME_NEVER
        if resume not in RESUME_CHOICES:
            raise ValueError(f"resume must be one of {RESUME_CHOICES}, got {resume!r}")
    bound = values.get("update_bound")
    if bound is not None and not bound > 1:
        raise ValueError(f"update_bound must be above 1 (or None for no bound), got {bound!r}")
    for name in ("clip_updates", "validation_guard"):
        if not isinstance(values.get(name, True), bool):
            raise ValueError(f"{name} must be true or false, got {values[name]!r}")
    opposed = values.get("reject_opposed_updates", True)
    if not (isinstance(opposed, bool) or opposed == OPPOSED_FIRST_ROUND):
        raise ValueError(f"reject_opposed_updates must be true, false or {OPPOSED_FIRST_ROUND!r}, got {opposed!r}")
    noise = values.get("update_noise", 0.0)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0 <= noise < 1:
        raise ValueError(f"update_noise must be a number from 0 (off) to below 1, got {noise!r}")
    if "update_noise" in values:
        values["update_noise"] = float(noise)
    votes = values.get("robust_learning_rate", 0)
    if isinstance(votes, bool) or not isinstance(votes, int) or votes < 0:
        raise ValueError(f"robust_learning_rate must be a whole number, 0 (off) or more, got {votes!r}")
    if "robust_aggregation" in values:
        RobustRule.parse(values["robust_aggregation"], values["byzantine_sites"])  # a ValueError names the problem
    judges = values.get("judging_sites")
    if judges is not None and (isinstance(judges, str) or not judges):
        raise ValueError(f"judging_sites must list at least one site name (or be None), got {judges!r}")
    if "judging_sites" in values:
        values["judging_sites"] = list(judges) if judges is not None else None
    return values
