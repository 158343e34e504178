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
  by the sites); a contribution is left out when its candidate clears every other flagged site's harm and flags no
  one new; up to the tolerated number of hostile sites are left out this way, one at a time. A flag no single
  exclusion clears is kept on record when one site raises it (its data, or its figures, disagree with the
  federation: it is outvoted), and stops the job when two or more do (several contributions harm, or a colluding
  group: the server cannot decide which).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from scipy.stats import norm

FALSE_ALARM_RATE = 0.01  # per job: the chance that a flag is raised while every site's harm is within the margin
HARM_GAIN_SHARE = 0.5  # m: the share of its own round's gain a site may lose to averaging
HARM_LOSS_SHARE = 0.05  # c: and this share of its own model's loss
# the least per-image spread of a paired loss difference a site may claim: its reported standard error is floored at
# this over the square root of the validation size it declared at the handshake
SE_FLOOR_SD = 0.02
OWN, START = "val_loss_minus_own", "val_loss_minus_start"


@dataclass(frozen=True)
class Harm:
    """One site's test of one candidate."""

    difference: float  # H: the candidate's loss minus its own model's, paired
    gain: float  # G: what its own training of the round gained (H - D)
    margin: float  # the harm the null hypothesis allows, in loss units
    error: float  # the standard error of H - margin used (at least the floor)
    z: float
    p: float

    def reason(self) -> str:
        return (
            f"its validation loss is {self.difference:.4f} above its own model's, more than the {self.margin:.4f} "
            f"averaging may cost it (z = {self.z:.1f}, p = {self.p:.2g})"
        )


def standard_error_floor(validation_size: int | None) -> float:
    """The least standard error a site with ``validation_size`` images may report (0 when it declared none)."""
    if not validation_size or validation_size < 1:
        return 0.0
    return SE_FLOOR_SD / math.sqrt(validation_size)


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
    """site -> its harm, for each site (of ``figures``: its checked metrics of one candidate) whose harm test
    Holm's procedure rejects at ``level`` across the sites."""
    tests = {site: harm_of(metrics, validation_sizes.get(site)) for site, metrics in figures.items()}
    tests = {site: test for site, test in tests.items() if test is not None}
    return {site: tests[site] for site in holm({site: test.p for site, test in tests.items()}, level)}


@dataclass
class Decision:
    """What the server does with a round's candidate after the sites' validation."""

    action: str  # "accept", "exclude" (a leave-one-out candidate replaces it), "stop"
    excluded: list[str] = field(default_factory=list)  # contributions left out, in the order they were
    flags: dict[str, str] = field(default_factory=dict)  # site -> why it is harmed (kept on record or stopping)
    why: str = ""  # the stop's case, or why a flag was kept on record


@dataclass(frozen=True)
class Screen:
    """The sites' validation of one candidate: who is harmed, and the judged loss (for choosing among candidates)."""

    flags: dict[str, Harm]
    judged_loss: float = math.nan


TWO_SITES = (
    "two sites made the model: the server cannot tell which result harms the other site's data, or whose figures are "
    "false"
)
SEVERAL = (
    "several sites are harmed and no single contribution explains it: several hostile contributions, a colluding "
    "group, or sites whose data conflict; the server cannot decide which"
)
OUTVOTED = "one site is harmed and no single contribution explains it: its data or its figures disagree with the others"
MAJORITY = (
    "sites whose results were rejected find the model harmful: a colluding majority of the others, or sites whose data "
    "conflict; the server cannot decide which group to trust"
)
MIN_OBJECTORS = 2  # rejected sites whose flags stop a job (one rejected site cannot: it may have got itself rejected)


def decide(
    contributors: Sequence[str],
    screen: Screen,
    without: Callable[[frozenset[str]], Screen | None],
    tolerated: int,
    objections: Mapping[str, Harm] | None = None,
) -> Decision:
    """What to do with a candidate the ``contributors`` made (they are its judges) whose validation is ``screen``;
    ``without(sites)``: the validation of the candidate made without those sites' contributions (None: it cannot be
    made). Flags with one or two contributors stop the job. With more, contributions are left out one at a time, at
    most ``tolerated``: each time the one whose leave-one-out candidate clears the most flagged sites (besides
    itself), flags no judging site that was not flagged, and, among equals, has the lowest judged loss.
    ``objections``: flags of sites whose results were rejected this round (they do not judge); :data:`MIN_OBJECTORS` or
    more of them stop the job."""
    if objections and len(objections) >= MIN_OBJECTORS:
        return Decision("stop", flags=_reasons(objections), why=MAJORITY)
    if not screen.flags:
        return Decision("accept")
    if len(contributors) <= 2:
        return Decision("stop", flags=_reasons(screen.flags), why=TWO_SITES)
    left_out: list[str] = []
    current = screen
    while current.flags and len(left_out) < tolerated:
        options = []
        for site in contributors:
            if site in left_out:
                continue
            after = without(frozenset([*left_out, site]))
            if after is None:
                continue
            judges = [other for other in contributors if other not in left_out and other != site]
            cleared = [other for other in current.flags if other != site and other not in after.flags]
            new = [other for other in judges if other in after.flags and other not in current.flags]
            if cleared and not new:
                remaining = sum(1 for other in judges if other in after.flags)
                options.append((remaining, after.judged_loss, site, after))
        if not options:
            break
        _, _, site, after = min(options, key=lambda option: (option[0], _sortable(option[1]), option[2]))
        left_out.append(site)
        current = Screen(
            {other: harm for other, harm in after.flags.items() if other not in left_out}, after.judged_loss
        )
    action = "exclude" if left_out else "accept"
    if not current.flags:
        return Decision(action, excluded=left_out)
    if len(current.flags) >= 2:
        return Decision("stop", excluded=left_out, flags=_reasons(current.flags), why=SEVERAL)
    return Decision(action, excluded=left_out, flags=_reasons(current.flags), why=OUTVOTED)


def _reasons(flags: Mapping[str, Harm]) -> dict[str, str]:
    return {site: harm.reason() for site, harm in sorted(flags.items())}


def _sortable(value: float) -> float:
    return math.inf if math.isnan(value) else value
