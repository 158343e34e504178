"""The server's statistical rules on the sites' validation: which round's model harms a site, which contribution to
leave out of a round, and when the server cannot decide. Plain Python and SciPy, no FLARE.

Every site validates each round's candidate model on its own validation images and reports, paired over those
images (``training.loops.Evaluation.image_losses``), how much worse the candidate is than the model it trained itself
in that round (``val_loss_minus_own``, H) and than the model the round started from (``val_loss_minus_start``, D),
each with its standard error. ``G = H - D`` is what the site's own training of the round gained. Averaging with the
other sites costs every site something (the federation's model is not its own), so the rule is a test of *material*
harm, a non-inferiority test with a margin: the null hypothesis of a site is that the candidate lost at most
:data:`HARM_GAIN_SHARE` of the site's own gain of the round plus :data:`HARM_LOSS_SHARE` of its own model's loss,

    H0: H <= m * max(G, 0) + c * own loss,

tested one-sided on ``T = H - m * max(G, 0) - c * own loss`` = ``(1 - m) H + m D - c * own loss`` (G > 0), whose
standard error is at most ``(1 - m) SE(H) + m SE(D)`` (the paired figures' correlation is not reported, so the bound
that holds for any correlation is used; the own loss's noise is small beside them).

Error rate. A job tests every site whose result made the candidate, every round: the sites of a round are tested by
Holm's step-down procedure, and the rounds share the job's :data:`FALSE_ALARM_RATE` equally (Bonferroni over the
planned ``num_rounds``; a job that stops early spends less). So the probability that a job flags any site whose harm
is within the margin is at most :data:`FALSE_ALARM_RATE` (for the figures' normal approximation), whatever the number
of sites and rounds. The margin and the floor under a reported standard error (:data:`SE_FLOOR_SD`) were set on a
randomised sweep of clean federations (``benchmarks/clean_sweep.py`` with other seeds than the one the docs report);
``docs/server-checks.md`` gives both sweeps.

What a flag does depends on how many sites made the candidate (:func:`decide`):

* two (or one and a rejected other): the server cannot tell which result harms the other site, or whose figures are
  false; the job stops non-zero and publishes nothing;
* three or more: the round is recomputed without each contribution in turn (leave-one-out candidates, each validated
  by the other sites, paired against the round's candidate); a contribution is left out when most of the other sites
  are materially better off without it (each site's one-sided test that its loss falls by more than
  :data:`IMPROVEMENT_SHARE` of it, at the round's rate split over every candidate and site: a false exclusion needs
  at least one false rejection, so it is controlled by the same rate). A harm no exclusion explains this way is
  kept on record: one site's figures (its data disagree with the federation's, or it lies) remove no one;
* sites whose results were rejected (they do not judge) stop the job when two or more of them flag it: a colluding
  majority that got them rejected, which the server cannot tell from sites whose data conflict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from scipy.stats import norm

FALSE_ALARM_RATE = 0.01  # per job: the chance that a flag is raised while every site's harm is within the margin
HARM_GAIN_SHARE = 0.5  # m: the share of its own round's gain a site may lose to averaging
HARM_LOSS_SHARE = 0.05  # c: and this share of its own model's loss
AUROC_HARM = 0.05  # ranking: the candidate's mean AUROC may be this much below its own model's
# the least per-image spread of a paired difference a site may claim (loss, AUROC): its reported standard error is
# floored at this over the square root of the validation size it declared at the handshake
SE_FLOOR_SD = 0.02
AUROC_SE_FLOOR_SD = 0.05
OWN, START = "val_loss_minus_own", "val_loss_minus_start"
AUROC_OWN = "val_auroc_minus_own"
TESTS = ("loss", "AUROC")  # each harm and each improvement is tested on both, each at half the rate


@dataclass(frozen=True)
class Harm:
    """One site's test of one candidate."""

    difference: float  # the harm (or the improvement), paired: loss units, or AUROC
    gain: float  # G: what its own training of the round gained (H - D); 0 for the other tests
    margin: float  # the harm the null hypothesis allows
    error: float  # the standard error of the difference minus the margin used (at least the floor)
    z: float
    p: float
    kind: str = "loss"  # "loss" or "AUROC"

    def reason(self) -> str:
        if self.kind == "AUROC":
            said = f"its validation mean AUROC is {self.difference:.4f} below its own model's"
        else:
            said = f"its validation loss is {self.difference:.4f} above its own model's"
        return f"{said}, more than the {self.margin:.4f} averaging may cost it (z = {self.z:.1f}, p = {self.p:.2g})"


def standard_error_floor(validation_size: int | None, spread: float = SE_FLOOR_SD) -> float:
    """The least standard error a site with ``validation_size`` images may report (0 when it declared none)."""
    if not validation_size or validation_size < 1:
        return 0.0
    return spread / math.sqrt(validation_size)


def auroc_harm_of(metrics: Mapping[str, float], validation_size: int | None = None) -> Harm | None:
    """The site's ranking harm test: the candidate's mean AUROC more than :data:`AUROC_HARM` below its own model's
    (``val_auroc_minus_own``, paired; None without it)."""
    difference, error = metrics.get(AUROC_OWN), metrics.get(f"{AUROC_OWN}_se")
    if difference is None or error is None:
        return None
    harm = -float(difference)
    error = max(float(error), standard_error_floor(validation_size, AUROC_SE_FLOOR_SD), 1e-12)
    z = (harm - AUROC_HARM) / error
    return Harm(harm, 0.0, AUROC_HARM, error, z, float(norm.sf(z)), "AUROC")


def harm_of(metrics: Mapping[str, float], validation_size: int | None = None) -> Harm | None:
    """The site's harm test of a candidate from its checked metrics (None without the paired figures)."""
    names = (OWN, f"{OWN}_se", START, f"{START}_se", "val_loss")
    if any(metrics.get(name) is None for name in names):
        return None
    own_difference, own_error, start_difference, start_error, loss = (float(metrics[name]) for name in names)
    floor = standard_error_floor(validation_size)
    own_error, start_error = max(own_error, floor), max(start_error, floor)
    gain = own_difference - start_difference
    own_loss = max(loss - own_difference, 0.0)
    share = HARM_GAIN_SHARE if gain > 0 else 0.0
    margin = share * gain + HARM_LOSS_SHARE * own_loss
    error = max((1 - share) * own_error + share * start_error, 1e-12)
    z = (own_difference - margin) / error
    return Harm(own_difference, gain, margin, error, z, float(norm.sf(z)))


def round_level(num_rounds: int, rate: float = FALSE_ALARM_RATE) -> float:
    """The false-alarm rate one round may spend: the job's, shared equally by its planned rounds."""
    return rate / max(num_rounds, 1)


def holm(p_values: Mapping[str, float], level: float) -> list[str]:
    """The hypotheses Holm's step-down procedure rejects at family-wise ``level``: in ascending order of p, the
    i-th (from 0) of m is rejected while p <= level / (m - i)."""
    ordered = sorted(p_values.items(), key=lambda item: (item[1], item[0]))
    rejected = []
    for index, (name, p) in enumerate(ordered):
        if p > level / (len(ordered) - index):
            break
        rejected.append(name)
    return sorted(rejected)


def flagged(
    figures: Mapping[str, Mapping[str, float]],
    validation_sizes: Mapping[str, int | None],
    level: float,
) -> dict[str, Harm]:
    """site -> its harm, for each site (of ``figures``: its checked metrics of one candidate) whose loss harm test
    or ranking harm test Holm's procedure rejects across the sites, each family at half ``level``."""
    found: dict[str, Harm] = {}
    for test in (harm_of, auroc_harm_of):
        tests = {site: test(metrics, validation_sizes.get(site)) for site, metrics in figures.items()}
        tests = {site: result for site, result in tests.items() if result is not None}
        for site in holm({site: result.p for site, result in tests.items()}, level / len(TESTS)):
            found.setdefault(site, tests[site])
    return dict(sorted(found.items()))


@dataclass
class Decision:
    """What the server does with a round's candidate after the sites' validation."""

    action: str  # "accept", "exclude" (a leave-one-out candidate replaces it), "stop"
    excluded: list[str] = field(default_factory=list)  # contributions left out, in the order they were
    flags: dict[str, str] = field(default_factory=dict)  # site -> why it is harmed (kept on record or stopping)
    why: str = ""  # the stop's case, or why a flag was kept on record


IMPROVEMENT_SHARE = 0.02  # material: a site's loss lower by at least this share of it without a contribution
AUROC_IMPROVEMENT = 0.02  # or its mean AUROC higher by this much
REFERENCE, AUROC_REFERENCE = "val_loss_minus_reference", "val_auroc_minus_reference"


def improvement_of(metrics: Mapping[str, float], validation_size: int | None = None) -> list[Harm]:
    """A site's tests of whether a leave-one-out candidate is materially better for it than the round's candidate,
    paired: its loss lower by more than :data:`IMPROVEMENT_SHARE` of the round's candidate's loss
    (``val_loss_minus_reference``), and its mean AUROC higher by more than :data:`AUROC_IMPROVEMENT`
    (``val_auroc_minus_reference``); the tests its figures allow."""
    tests = []
    difference, error, loss = metrics.get(REFERENCE), metrics.get(f"{REFERENCE}_se"), metrics.get("val_loss")
    if difference is not None and error is not None and loss is not None:
        gain = -float(difference)
        margin = IMPROVEMENT_SHARE * max(float(loss) - float(difference), 0.0)
        error = max(float(error), standard_error_floor(validation_size), 1e-12)
        z = (gain - margin) / error
        tests.append(Harm(gain, 0.0, margin, error, z, float(norm.sf(z))))
    difference, error = metrics.get(AUROC_REFERENCE), metrics.get(f"{AUROC_REFERENCE}_se")
    if difference is not None and error is not None:
        error = max(float(error), standard_error_floor(validation_size, AUROC_SE_FLOOR_SD), 1e-12)
        z = (float(difference) - AUROC_IMPROVEMENT) / error
        tests.append(Harm(float(difference), 0.0, AUROC_IMPROVEMENT, error, z, float(norm.sf(z)), "AUROC"))
    return tests


TWO_SITES = (
    "two sites made the model: the server cannot tell which result harms the other site's data, or whose figures are "
    "false"
)
NOT_MOST = "leaving no single contribution out makes the model materially better for most of the other sites"
SEVERAL = (
    "several sites are harmed and no single contribution explains it: several hostile contributions, a colluding "
    "group, or sites whose data conflict; the server cannot decide which"
)
MAJORITY = (
    "sites whose results were rejected find the model harmful: a colluding majority of the others, or sites whose data "
    "conflict; the server cannot decide which group to trust"
)
MIN_OBJECTORS = 2  # rejected sites whose flags stop a job (one rejected site cannot: it may have got itself rejected)
Better = Callable[[str], Mapping[str, bool] | None]  # a contribution -> each other judge: materially better without it


def decide(
    contributors: Sequence[str],
    flags: Mapping[str, Harm],
    better_without: Better,
    objections: Mapping[str, Harm] | None = None,
) -> Decision:
    """What to do with a candidate the ``contributors`` made (they are its judges), which ``flags`` (site -> its harm
    test) say harms some of them:

    * ``objections`` (flags of sites whose results were rejected this round, which do not judge) from
      :data:`MIN_OBJECTORS` or more sites stop the job: a colluding majority may have got them rejected;
    * no flag: the candidate stands;
    * two contributors or fewer: the job stops (the server cannot tell which result harms the other's site);
    * three or more: ``better_without(site)`` says, for each other judge, whether the candidate made without
      ``site``'s contribution is materially better for it (:func:`improvement_of`). A contribution without which
      most of the other judges are better off is left out (the one with the largest such share; among equals, by
      name). None is: with one flagged site the candidate stands, the flag kept on record (one site harmed is the
      federation's heterogeneity, or a false figure: it cannot remove anyone on its own say); with
      :data:`MIN_OBJECTORS` or more the job stops (several contributions harm, or a colluding group)."""
    if objections and len(objections) >= MIN_OBJECTORS:
        return Decision("stop", flags=_reasons(objections), why=MAJORITY)
    if not flags:
        return Decision("accept")
    if len(contributors) <= 2:
        return Decision("stop", flags=_reasons(flags), why=TWO_SITES)
    options = []
    for site in contributors:
        verdicts = better_without(site)
        if not verdicts:
            continue
        share = sum(verdicts.values()) / len(verdicts)
        if share > 0.5:
            options.append((-share, site))
    if options:
        _, site = min(options)
        return Decision("exclude", excluded=[site], flags=_reasons(flags))
    if len(flags) >= MIN_OBJECTORS:
        return Decision("stop", flags=_reasons(flags), why=SEVERAL)
    return Decision("accept", flags=_reasons(flags), why=NOT_MOST)


def _reasons(flags: Mapping[str, Harm]) -> dict[str, str]:
    return {site: harm.reason() for site, harm in sorted(flags.items())}
