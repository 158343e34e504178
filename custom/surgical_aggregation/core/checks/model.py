"""The checks of a candidate global model, the blame for one that fails, and the statistic that selects models."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..head import StateDict
from . import Reasons, server_check
from .metrics import MAX_BCE_LOSS
from .result import batchnorm_problems, finite_problems

ModelOutputs = Callable[[StateDict, Sequence[str]], np.ndarray]


@server_check(
    "model",
    "every entry finite, BatchNorm statistics valid, and the model's outputs on a fixed probe input (two inputs "
    "preprocessed as the federation's data) finite; a candidate that fails is discarded, the last good model stays, "
    "and the results responsible are found by leaving each out",
    "the model's outputs on the probe input have 40 non-finite value(s)",
)
def model_problems(state: StateDict, class_names: Sequence[str], outputs: ModelOutputs | None) -> Reasons:
    problems = finite_problems(state) + batchnorm_problems(state)
    if problems or outputs is None:
        return problems
    values = np.asarray(outputs(state, class_names))
    bad = int(values.size - np.count_nonzero(np.isfinite(values)))
    return [f"the model's outputs on the probe input have {bad} non-finite value(s)"] if bad else []


def _culprits_among(
    sites: Sequence[str], problems_of: Callable[[Sequence[str]], Reasons]
) -> tuple[dict[str, str], Reasons]:
    """Leave each site out: those without whom the aggregate passes are responsible; failing that, those whose
    result fails alone. Returns (site -> reason, the full aggregate's problems)."""
    everyone = problems_of(sites)
    if not everyone:
        return {}, []
    summary = "; ".join(everyone[:2])
    culprits = {}
    if len(sites) > 1:
        for site in sites:
            if not problems_of([other for other in sites if other != site]):
                culprits[site] = (
                    f"the global model aggregated with its result failed the model check ({summary}); without it "
                    "the check passes"
                )
    if not culprits:
        for site in sites:
            alone = problems_of([site])
            if alone:
                culprits[site] = f"the global model aggregated from its result alone fails the model check ({alone[0]})"
    return culprits, everyone


def blame_for_failing_model(
    sites: Sequence[str], problems_of: Callable[[Sequence[str]], Reasons]
) -> tuple[list[str], dict[str, str], Reasons]:
    """The sites whose aggregate passes the model check, and why the others are rejected.

    ``problems_of(sites)``: the model check's problems of the global model aggregated from those sites' results.
    Returns (the sites to keep, rejected site -> reason, the problems of the aggregate of all). When no site can
    be singled out, nobody is kept: the round's aggregation is discarded.
    """
    culprits, everyone = _culprits_among(list(sites), problems_of)
    if not everyone:
        return list(sites), {}, []
    kept = [site for site in sites if site not in culprits]
    if culprits and kept and not problems_of(kept):
        return kept, culprits, everyone
    reason = (
        f"the round's global model failed the model check ({'; '.join(everyone[:2])}) and no single result could "
        "be blamed: the round's aggregation was discarded"
    )
    return [], dict.fromkeys(sites, reason), everyone


# --- selection of the best model --------------------------------------------------------------------------------


def judged_loss(losses: Mapping[str, float]) -> tuple[float, str]:
    """The statistic of the sites' validation losses that selects models and stops early: the median with three
    or more sites (one site cannot move it beyond the honest sites' values), else the mean."""
    values = [value for value in losses.values() if value is not None and not math.isnan(value)]
    if not values:
        return math.nan, "none"
    if len(values) >= 3:
        return float(np.median(values)), "median"
    return float(np.mean(values)), "mean"


def recalibrated_changes(
    metrics: Mapping[str, Mapping[str, float]],
    first: Mapping[str, Mapping[str, float]],
    initial: Mapping[str, Mapping[str, float]],
) -> dict[str, float]:
    """Each site's change of loss against its own loss of the initial model once each model is recalibrated in the
    large to its images, for the initial model's bar (:func:`changes_against_the_bar`): its recalibrated loss of the
    model (``metrics``: ``val_recalibrated_loss``) minus that of the initial model, which its validation of the model
    of a round trained from the initial one gives (``first``: its ``val_recalibrated_loss`` minus
    ``val_recalibrated_loss_minus_start``, the paired change against the model that round started from, the initial
    one; outside the metric checks' range of a loss, none). Only for a site whose mean AUROC
    of the model is at least both its mean AUROC of the initial model and that of its own model of the first round
    (``initial``: ``val_mean_auroc``, ``local_val_mean_auroc``): recalibration forgives intercepts, not a ranking worse
    than the site's own training reached, so a wrecked model (constant outputs rank at 0.5, and their recalibrated loss
    is the base rate's, below that of an untrained start's random scores) gains nothing from it where the site's own
    training learned to rank at all. A site without these figures has none."""
    changes = {}
    for site, figures in metrics.items():
        start, before = first.get(site, {}), initial.get(site, {})
        auroc = figures.get("val_mean_auroc", math.nan)
        yardsticks = (before.get("val_mean_auroc", math.nan), before.get("local_val_mean_auroc", math.nan))
        if not all(auroc >= yardstick for yardstick in yardsticks):  # False with a figure missing (NaN)
            continue
        initial_loss = start.get("val_recalibrated_loss", math.nan) - start.get(
            "val_recalibrated_loss_minus_start", math.nan
        )
        change = figures.get("val_recalibrated_loss", math.nan) - initial_loss
        if 0.0 <= initial_loss <= MAX_BCE_LOSS and math.isfinite(change):  # a loss the metric checks would allow
            changes[site] = change
    return changes


def changes_against_the_bar(
    losses: Mapping[str, float],
    initial: Mapping[str, Mapping[str, float]],
    tie: float,
    vetoes: bool = False,
    recalibrated: Mapping[str, float] | None = None,
) -> tuple[dict[str, float], list[str]]:
    """The initial model's bar on a trained model, paired per site: each judging site's loss of the model minus its
    own loss of the initial model (``initial``: the sites' validation of it), for the judges that validated both. The
    model passes when the judged statistic of these changes (the mean of two, the median of three or more) is below
    ``tie``: the median judge finds it no worse than where training started, each on its own scale. Losses compared
    across sites would let one liar set both sides (a loss of 100 for the initial model raises the median bar to the
    highest honest start, a loss of 0 for the model lowers its median to the lowest honest loss: every honest site
    worse off, and the model past the bar); paired, a liar supplies one change of the median's inputs.

    With ``vetoes`` (a job from untrained heads), a site cannot veto when its own model of the first round
    (``local_val_loss``) had a validation loss at least its loss of the initial model: its own training did not lower
    its loss, so its loss does not tell a trained model from the untrained start (a small site's own model made
    overconfident on its few images), and on its own scale it would veto every trained model. Its change counts as at
    most ``2 * tie``: no veto, and never a vote for a model it finds no better than the start. Where its change is
    lower it vouches for the model as before. A site that sent no own-model loss judges as before; when every judge
    cannot veto, nobody can tell, and the changes count as they are.

    ``recalibrated`` (:func:`recalibrated_changes`): a site's change counts as the lower of its change as it is and
    its change once each model is recalibrated in the large to its images, so that a model which ranks its images no
    worse than the start and than the site's own training did, and is worse only by its intercepts (a finding's row
    averaged over sites whose prevalences of it differ, which the site's own data set right), is no veto: the harm
    test asks both too.
    Returns (site -> change as the bar weighs it, the sites without a veto)."""
    changes = {
        site: loss - initial[site]["val_loss"]
        for site, loss in losses.items()
        if site in initial and math.isfinite(initial[site].get("val_loss", math.nan)) and math.isfinite(loss)
    }
    for site, change in (recalibrated or {}).items():
        if site in changes and math.isfinite(change):
            changes[site] = min(changes[site], change)
    without_veto = []
    for site in changes if vetoes else ():
        own = initial[site].get("local_val_loss")
        if own is not None and own >= initial[site]["val_loss"]:
            without_veto.append(site)
    if not without_veto or len(without_veto) == len(changes):
        return changes, []
    weighed = {site: min(change, 2 * tie) if site in without_veto else change for site, change in changes.items()}
    return weighed, sorted(without_veto)
