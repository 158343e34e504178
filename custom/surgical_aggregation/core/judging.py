"""The server's statistical rules on the sites' validation: which round's model harms a site, which contribution to
leave out of a round, and when the server cannot decide. Plain Python and SciPy, no FLARE.

Every site validates each round's candidate model on its own validation images and reports, paired over those
images (``training.loops.Evaluation``), how much worse the candidate is than the model it trained itself in that
round (``val_loss_minus_own``, H; ``val_auroc_minus_own``) and than the model the round started from
(``val_loss_minus_start``, D), each with its standard error. ``G = H - D`` is what the site's own training of the
round gained. Averaging with the other sites costs every site something (the federation's model is not its own, and
a large site's own model fits its data better than any average), so each rule is a non-inferiority test with a
margin, one-sided on the z-score of the paired difference minus the margin:

* loss: H0: ``H <= m * max(G, 0) + c * own loss`` (m = :data:`HARM_GAIN_SHARE`, c = :data:`HARM_LOSS_SHARE`): with
  m = 1, the round may cost the site all its own gain and c of its own loss more, i.e. for G > 0 the test is on
  ``D - c * own loss`` with the standard error of D (``(1 - m) SE(H) + m SE(D)`` in general, the bound that holds for
  any correlation of the two paired figures); the same test on the losses once each model is recalibrated in the
  large to the site's images (each finding's logits shifted to its prevalence there) must reject too (an
  intersection-union test, p the larger): averaging a finding's row over sites whose prevalences of it differ by
  orders of magnitude moves its intercept far from every one of them (a clean two-site federation was stopped so,
  its loss 1.62 higher, its AUROC 0.05 lower), which the site's own data set right and no ranking shows;
* ranking: H0: ``-A <= max(G_A, 0) + AUROC_HARM``, with ``A`` the candidate's mean AUROC minus its own model's
  (``val_auroc_minus_own``) and ``G_A`` what its own training gained in mean AUROC (``val_auroc_minus_start`` minus
  ``A``): as the loss, the round may cost the site all its own gain and :data:`AUROC_HARM` more, i.e. the candidate
  may not rank materially worse than the model the round started from.

Error rate. A job tests every site whose result made the candidate, every round: the sites of a round are tested by
Holm's step-down procedure, each of the two tests at half the round's rate, and the rounds share the job's
:data:`FALSE_ALARM_RATE` equally (Bonferroni over the planned ``num_rounds``; a job that stops early spends less). So
the probability that a job flags a site whose harm is within the margins is at most :data:`FALSE_ALARM_RATE` (for the
figures' normal approximation), whatever the number of sites and rounds. The margins and the floors under a
reported standard error (:data:`SE_FLOOR_SD`, :data:`AUROC_SE_FLOOR_SD`) were set on randomised sweeps of clean
federations (``benchmarks/clean_sweep.py``: seeds 100-119 and 200-204), the first round's rule and the majority for an
exclusion on the first sweep of seeds 0-9 (``docs/clean-sweep/first-sweep.json``); ``docs/server-checks.md`` reports
the sweep of the current rules and marks the federations that set a rule.

What a flag does depends on how many sites made the candidate (:func:`decide`):

* two (or fewer): the server cannot tell which result harms the other site, or whose figures are false; the job
  stops non-zero and publishes nothing;
* three or more, every round (no flag needed: harm spread thin over the other sites counts as much as harm
  concentrated on one; but see below for a round that starts from untrained heads): the round is made again without
  each contribution in turn (leave-one-out candidates, each validated by the other sites, paired against the round's
  candidate); a contribution is left out when more than half of the other sites are materially better off without
  it (each site's one-sided tests that its loss falls by more than :data:`IMPROVEMENT_SHARE` of it or its mean AUROC
  rises by more than :data:`AUROC_IMPROVEMENT`, at the round's rate split over every candidate, site and test: a
  false exclusion needs at least two false rejections, so it is controlled by the same rate, as long as the margins
  cover what clean heterogeneity gives, which the sweeps measure). Failing a majority, two or more flagged sites that
  are each materially better off without one contribution have it left out (it explains their harm: rows only they
  hold). One site's verdict never removes anyone on its own: a liar, or a site whose labels conflict with one
  other's, is outvoted (a liar together with one such honest site is a majority at three or four sites); the price
  is that harm only one other site sees (a row only two sites hold) is not acted on here, nor by the aggregation
  (the two holders' mean: ``docs/server-checks.md`` says what was tried). A flag of one
  site that no exclusion explains is kept on record (its data disagree with the federation's, or it lies: it removes
  no one on its own say); flags of two or more that no exclusion explains stop the job;
* sites whose results were rejected (they do not judge) stop the job when two or more of them flag it: a colluding
  majority that got them rejected, which the server cannot tell from sites whose data conflict.

The job's first round, when it starts from a model no site has trained (random or ImageNet backbone, no trained head
row: every site warms up a head of its own on it), is judged by the loss alone and against where it started. Models
trained apart from one random start are then least alike, the first average fits no site's head, and the candidate, the
start and each leave-one-out candidate all rank near chance, each differently: on the calibration sweep (11 clean
federations, ``docs/clean-sweep/first-sweep.json``) every significant AUROC difference between a site's own model and
the candidate (up to 0.41), every leave-one-out candidate materially better for a judge, and round-0 candidates up to
0.24 AUROC below the untrained start (unpaired) came in that round, none later. So in that round the ranking tests are
not run, the loss test allows all of the site's own gain as in every round (it tests the candidate against the start),
and the round is made again without a contribution only when a site flags the candidate, judged by the loss. That
round is the one that makes the job's first model (round 0 unless every result of round 0 was refused); a job that
continues an earlier global model with trained rows is judged in full from its first round, a newcomer's fresh rows
included.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .checks import server_check


def normal_upper_tail(z: float) -> float:
    """P(Z > z) for a standard normal Z, from the complementary error function: accurate far into the tail, and the
    server's import needs no scipy.stats (seconds on every start)."""
    return 0.5 * math.erfc(float(z) / math.sqrt(2.0))


FALSE_ALARM_RATE = 0.01  # per job: the chance that a flag is raised while every site's harm is within the margin
HARM_GAIN_SHARE = 1.0  # m: the share of its own round's gain a site may lose to averaging
HARM_LOSS_SHARE = 0.3  # c: and this share of its own model's loss
AUROC_HARM = 0.05  # ranking: the candidate's mean AUROC may be this much below its own model's, beyond its own gain
# the least per-image spread of a paired difference a site may claim (loss, AUROC): its reported standard error is
# floored at this over the square root of the validation size it declared at the handshake
SE_FLOOR_SD = 0.02
AUROC_SE_FLOOR_SD = 0.05
OWN, START = "val_loss_minus_own", "val_loss_minus_start"
RECALIBRATED = "val_recalibrated_loss"  # the candidate's loss recalibrated in the large (paired: OWN's names)
AUROC_OWN, AUROC_START = "val_auroc_minus_own", "val_auroc_minus_start"
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
    # the loss test's second half: the same test once each model is recalibrated in the large to the site's images
    # (None without its figures); ``p`` is then the larger of the two tests' (an intersection-union test), the other
    # figures stay the losses' as they are
    recalibrated: Harm | None = None

    def reason(self) -> str:
        if self.kind == "AUROC":
            said = f"its validation mean AUROC is {self.difference:.4f} below its own model's"
        else:
            said = f"its validation loss is {self.difference:.4f} above its own model's"
        said = f"{said}, more than the {self.margin:.4f} averaging may cost it"
        if self.recalibrated is None:
            return f"{said} (z = {self.z:.1f}, p = {self.p:.2g})"
        again = self.recalibrated
        return (
            f"{said} (z = {self.z:.1f}), and {again.difference:.4f} above once each model is recalibrated to its "
            f"images, more than {again.margin:.4f} (z = {again.z:.1f}); p = {self.p:.2g}"
        )


def standard_error_floor(validation_size: int | None, spread: float = SE_FLOOR_SD) -> float:
    """The least standard error a site with ``validation_size`` images may report (0 when it declared none)."""
    if not validation_size or validation_size < 1:
        return 0.0
    return spread / math.sqrt(validation_size)


@server_check(
    "screening",
    f"a site whose mean validation AUROC of the candidate is below that of the model it trained itself that round by "
    f"more than what its own training gained that round plus {AUROC_HARM:g} (`val_auroc_minus_own` and "
    "`val_auroc_minus_start`, paired, their standard errors by the bootstrap over its images; without the start's "
    f"figure, more than {AUROC_HARM:g} below its own model's) flags it, tested as the loss; a reported standard error "
    "is floored at what the validation size the site declared at the handshake allows "
    f"({SE_FLOOR_SD:g} for the loss, {AUROC_SE_FLOOR_SD:g} for the AUROC, over the square root of that size)",
    "its validation mean AUROC is 0.3200 below its own model's, more than the 0.2500 averaging may cost it (z = 3.5, "
    "p = 0.0002)",
)
def auroc_harm_of(metrics: Mapping[str, float], validation_size: int | None = None) -> Harm | None:
    """The site's ranking harm test (None without ``val_auroc_minus_own``): the candidate's mean AUROC below its own
    model's by more than what its own training gained in mean AUROC that round plus :data:`AUROC_HARM`
    (``val_auroc_minus_start`` gives that gain; without it, the margin is :data:`AUROC_HARM` alone)."""
    difference, error = metrics.get(AUROC_OWN), metrics.get(f"{AUROC_OWN}_se")
    if difference is None or error is None:
        return None
    floor = standard_error_floor(validation_size, AUROC_SE_FLOOR_SD)
    harm, own_error = -float(difference), max(float(error), floor)
    start, start_error = metrics.get(AUROC_START), metrics.get(f"{AUROC_START}_se")
    gain = 0.0 if start is None or start_error is None else float(start) - float(difference)
    share = 1.0 if gain > 0 else 0.0
    start_error = max(float(start_error), floor) if share else 0.0
    error = max((1 - share) * own_error + share * start_error, 1e-12)
    margin = share * gain + AUROC_HARM
    z = (harm - margin) / error
    return Harm(harm, gain, margin, error, z, normal_upper_tail(z), "AUROC")


@server_check(
    "screening",
    "every site validates each round's candidate; a site whose validation loss of it is above the loss of the model "
    f"it trained itself that round by more than {HARM_GAIN_SHARE:g} x what its own training gained that round plus "
    f"{HARM_LOSS_SHARE:g} of its own model's loss (paired over its images: `val_loss_minus_own` and "
    "`val_loss_minus_start`), tested one-sided at the job's false-alarm rate "
    f"({FALSE_ALARM_RATE:g} per job, shared by the planned rounds, Holm over the sites; the loss and the AUROC tests "
    "each at half), flags it when the same test rejects too on its losses once each model's logits of each finding "
    "are shifted to the finding's prevalence in its images (`val_recalibrated_loss...`: recalibration in the large; "
    "a site that sends no such figures is judged by its losses as they are)",
    "its validation loss is 0.4210 above its own model's, more than the 0.3550 averaging may cost it (z = 4.1), and "
    "0.3920 above once each model is recalibrated to its images, more than 0.3100 (z = 3.9); p = 5e-05",
)
def harm_of(metrics: Mapping[str, float], validation_size: int | None = None) -> Harm | None:
    """The site's harm test of a candidate from its checked metrics (None without the paired figures): the loss test
    on the losses as they are and, where the site sent them, on the losses once each model is recalibrated in the
    large to its images (``val_recalibrated_loss...``); the site is harmed only when both reject (an
    intersection-union test: its p is the larger of the two, so its false-alarm rate is at most the level and every
    candidate it flags the test on the losses alone flags too). A candidate whose harm is only its base rate of a
    finding (the intercept averaging takes from sites whose prevalences of it differ, which the site's own data
    undo) is not harmful to the site's ranking or to the spread of its scores, and is not flagged."""
    raw = _loss_test(metrics, (OWN, f"{OWN}_se", START, f"{START}_se", "val_loss"), validation_size)
    if raw is None:
        return None
    names = tuple(name.replace("val_loss", RECALIBRATED) for name in (OWN, f"{OWN}_se", START, f"{START}_se"))
    recalibrated = _loss_test(metrics, (*names, RECALIBRATED), validation_size)
    if recalibrated is None:
        return raw
    return replace(raw, p=max(raw.p, recalibrated.p), recalibrated=recalibrated)


def _loss_test(metrics: Mapping[str, float], names: Sequence[str], validation_size: int | None) -> Harm | None:
    """The non-inferiority test of one loss (``names``: its paired figures against the site's own model and the
    round's start, their standard errors, and the candidate's loss)."""
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
    return Harm(own_difference, gain, margin, error, z, normal_upper_tail(z))


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
    ranking: bool = True,
) -> dict[str, Harm]:
    """site -> its harm, for each site (of ``figures``: its checked metrics of one candidate) whose loss harm test
    or ranking harm test Holm's procedure rejects across the sites, each family at half ``level``; the ranking test
    only when ``ranking`` (not in a round from untrained heads)."""
    found: dict[str, Harm] = {}
    for test in (harm_of, auroc_harm_of) if ranking else (harm_of,):
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


# material: a site's loss lower by more than this share of it without a contribution, or its mean AUROC higher by
# more than this; about twice what clean heterogeneity gave on the calibration sweep (seeds 200-204: up to 5.1 % of
# the loss, significant, when a 64-patient site's round-0 update was left out; AUROC up to 0.13, within its noise)
IMPROVEMENT_SHARE = 0.10
AUROC_IMPROVEMENT = 0.05
REFERENCE, AUROC_REFERENCE = "val_loss_minus_reference", "val_auroc_minus_reference"
# the same once each model is recalibrated in the large: its test is recorded, not part of a verdict
RECALIBRATED_REFERENCE = "val_recalibrated_loss_minus_reference"


@server_check(
    "screening",
    "with three or more contributions, every round (in the job's first round from untrained heads, only when a site "
    "flags the candidate, and by the loss alone), the round is made again without each contribution in turn, and "
    "the other sites validate each such candidate against the round's: a site is materially better off without a "
    f"contribution when its loss falls by more than {IMPROVEMENT_SHARE:.0%} of it or its mean AUROC rises by more than "
    f"{AUROC_IMPROVEMENT:g} (`val_..._minus_reference`, one-sided, at the round's rate split over every candidate, "
    "site and test), and materially worse off when its loss rises or its AUROC falls by as much, tested alike",
    "(recorded in the round's `screening`: each left-out candidate's figures and p-values)",
)
def improvement_of(metrics: Mapping[str, float], validation_size: int | None = None, sign: int = 1) -> list[Harm]:
    """A site's tests of whether a leave-one-out candidate is materially better for it than the round's candidate,
    paired: its loss lower by more than :data:`IMPROVEMENT_SHARE` of the round's candidate's loss
    (``val_loss_minus_reference``), and its mean AUROC higher by more than :data:`AUROC_IMPROVEMENT`
    (``val_auroc_minus_reference``); the tests its figures allow. ``sign=-1`` tests the other way: the candidate
    without the contribution materially worse for the site (the contribution helps it)."""
    tests = []
    difference, error, loss = metrics.get(REFERENCE), metrics.get(f"{REFERENCE}_se"), metrics.get("val_loss")
    if difference is not None and error is not None and loss is not None:
        gain = -sign * float(difference)
        margin = IMPROVEMENT_SHARE * max(float(loss) - float(difference), 0.0)
        error = max(float(error), standard_error_floor(validation_size), 1e-12)
        z = (gain - margin) / error
        tests.append(Harm(gain, 0.0, margin, error, z, normal_upper_tail(z)))
    difference, error = metrics.get(AUROC_REFERENCE), metrics.get(f"{AUROC_REFERENCE}_se")
    if difference is not None and error is not None:
        error = max(float(error), standard_error_floor(validation_size, AUROC_SE_FLOOR_SD), 1e-12)
        gain = sign * float(difference)
        z = (gain - AUROC_IMPROVEMENT) / error
        tests.append(Harm(gain, 0.0, AUROC_IMPROVEMENT, error, z, normal_upper_tail(z), "AUROC"))
    return tests


def recalibrated_improvement_of(metrics: Mapping[str, float], validation_size: int | None = None) -> Harm | None:
    """:func:`improvement_of`'s loss test on the site's losses once each model is recalibrated in the large to its
    images (``val_recalibrated_loss_minus_reference``; None without them): on record beside the verdict, which judges
    the losses as they are (``docs/server-checks.md`` says why), so that a record shows how much of a verdict a
    finding's base rate is."""
    names = {REFERENCE: RECALIBRATED_REFERENCE, f"{REFERENCE}_se": f"{RECALIBRATED_REFERENCE}_se"}
    renamed = {name: metrics.get(source) for name, source in {**names, "val_loss": RECALIBRATED}.items()}
    tests = improvement_of({name: value for name, value in renamed.items() if value is not None}, validation_size)
    return next((test for test in tests if test.kind == "loss"), None)


BETTER, WORSE, NEITHER = "better", "worse", "neither"  # a judge without a contribution: materially so, or neither


def verdict_of(metrics: Mapping[str, float], validation_size: int | None, level: float, ranking: bool = True) -> str:
    """One judge's verdict on a leave-one-out candidate: :data:`BETTER` when a test of :func:`improvement_of`
    rejects at ``level`` (split over its tests), :data:`WORSE` when one of the reverse tests does, else
    :data:`NEITHER`; the AUROC tests only when ``ranking`` (not in a round from untrained heads)."""
    for sign, verdict in ((1, BETTER), (-1, WORSE)):
        tests = [test for test in improvement_of(metrics, validation_size, sign) if ranking or test.kind == "loss"]
        if any(test.p <= level / len(TESTS) for test in tests):
            return verdict
    return NEITHER


TWO_SITES = (
    "two sites made the model: the server cannot tell which result harms the other site's data, or whose figures are "
    "false"
)
NOT_MOST = "leaving no single contribution out makes the model materially better for more than half of the other sites"
SEVERAL = (
    "several sites are harmed and no single contribution explains it: several hostile contributions, a colluding "
    "group, or sites whose data conflict; the server cannot decide which"
)
MAJORITY = (
    "sites whose results were rejected find the model harmful: a colluding majority of the others, or sites whose data "
    "conflict; the server cannot decide which group to trust"
)
# a round of two: a BatchNorm layer of the candidate reads this much further from a site's validation images than the
# same layer of the site's own model (nats per channel, `val_batchnorm_minus_own`; docs/server-checks.md says how it
# was set and tested)
BATCHNORM_APART = 1.0


@server_check(
    "screening",
    "with exactly two contributions, a site whose validation reads some BatchNorm layer of the candidate further from "
    "its images than the same layer of the model it trained itself that round (`val_batchnorm_minus_own`: the mean "
    "over the layer's channels of KL(its images' Gaussian || the layer's running statistics), the candidate's minus "
    f"its own model's) by more than {BATCHNORM_APART:g} stops the job (non-zero, nothing published): one of the two "
    "sent statistics that no data of its gave, and with two sites the server cannot tell which",
    "site-nih reads a BatchNorm layer of the candidate 4.21 further from its images than its own model's (more than "
    "1): one of the two sent statistics that no data of its gave",
)
def batchnorm_apart(validation: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Why the candidate of a round of two cannot be kept (``validation``: site -> its checked metrics of it): each
    site that reads some BatchNorm layer of it more than :data:`BATCHNORM_APART` further from its validation images
    than the same layer of its own model of the round. Averaging two honest sites' statistics moves each layer at
    most as far as the two sites' data differ; inflated or shifted statistics (the suite's ``bn_inflate``) move it as
    far as the sender likes. A site that reports no figure (a DP site's released validation, an older site) is not
    judged."""
    found = []
    for site, metrics in sorted(validation.items()):
        value = metrics.get("val_batchnorm_minus_own")
        if value is not None and value > BATCHNORM_APART:
            found.append(
                f"{site} reads a BatchNorm layer of the candidate {value:.2f} further from its images than its own "
                f"model's (more than {BATCHNORM_APART:g}): one of the two sent statistics that no data of its gave"
            )
    return found


MIN_OBJECTORS = 2  # rejected sites whose flags stop a job (one rejected site cannot: it may have got itself rejected)
# the share of the other judges that must be materially better off without a contribution to leave it out (more than
# this): a majority. One judge's data conflict with one contribution (RSNA's opacity against CheXpert's, a 67-patient
# site whose round one large site ranks worse with) or one liar removes no one: with a third, a single judge of three
# or four sites did, and the clean sweep found honest sites so left out (``docs/server-checks.md``)
EXCLUSION_SHARE = 1 / 2
Verdicts = Callable[[str], Mapping[str, str] | None]  # a contribution -> each other judge's verdict without it


@server_check(
    "screening",
    "a contribution is left out of the round (the round's model is made again without it; the site is named in the "
    "log, the history, its outcome and the summary) when more than half of the other sites are materially better "
    f"off without it, or when {MIN_OBJECTORS} or more flagged sites each are (and more of the others better than worse "
    "off), and stays out for the rest of the job (at most "
    "as many sites as the robust rule tolerates, (n - 1) // 2 of n); a flag no exclusion explains is kept on "
    f"record when one site raises it, and stops the job when {MIN_OBJECTORS} or more do, when two sites made the "
    f"model (the server cannot tell which result harms), or when {MIN_OBJECTORS} or more sites whose results were "
    "rejected flag it (a colluding majority)",
    "the global model after round 1 harms a site: for site-a, its validation loss is ... Two sites made the model: the "
    "server cannot tell which result harms the other site's data, or whose figures are false",
)
def decide(
    contributors: Sequence[str],
    flags: Mapping[str, Harm],
    verdicts_without: Verdicts,
    objections: Mapping[str, Harm] | None = None,
    untrained_start: bool = False,
) -> Decision:
    """What to do with a candidate the ``contributors`` made (they are its judges), which ``flags`` (site -> its harm
    test) say harms some of them:

    * ``objections`` (flags of sites whose results were rejected this round, which do not judge) from
      :data:`MIN_OBJECTORS` or more sites stop the job: a colluding majority may have got them rejected;
    * two contributors or fewer: a flag stops the job (the server cannot tell which result harms the other's site);
    * three or more, every round: ``verdicts_without(site)`` gives each other judge's :func:`verdict_of` the
      candidate made without ``site``'s contribution. A contribution is left out when more than
      :data:`EXCLUSION_SHARE` of the other judges are :data:`BETTER` off without it (the one with the largest net
      share of better over :data:`WORSE`; among equals, by name). No flag is needed: harm spread thin over the other
      sites counts as much as harm concentrated on one. Failing a majority, :data:`MIN_OBJECTORS` or more flagged
      sites that are each :data:`BETTER` off without one contribution (and more judges better than worse off) have
      it left out: it explains their harm (rows that only they hold). None is: one flagged site is kept on record
      (its data or its figures disagree with the federation's: a flag removes no one), :data:`MIN_OBJECTORS` or more
      stop the job (several contributions harm, or a colluding group). In a round that starts from untrained heads
      (``untrained_start``) the round is made again only when a site flags the candidate (the caller runs the loss
      tests alone in that round)."""
    if objections and len(objections) >= MIN_OBJECTORS:
        return Decision("stop", flags=_reasons(objections), why=MAJORITY)
    if len(contributors) <= 2:
        return Decision("stop", flags=_reasons(flags), why=TWO_SITES) if flags else Decision("accept")
    if untrained_start and not flags:
        return Decision("accept")
    options, explaining = [], []
    for site in contributors:
        verdicts = verdicts_without(site)
        if not verdicts:
            continue
        better = sum(verdict == BETTER for verdict in verdicts.values())
        worse = sum(verdict == WORSE for verdict in verdicts.values())
        net = (worse - better) / len(verdicts)
        if better > EXCLUSION_SHARE * len(verdicts):
            options.append((net, site))
        # several harmed sites that are each materially better off without this one contribution: it explains them
        harmed = [judge for judge in flags if judge != site]
        if len(harmed) >= MIN_OBJECTORS and all(verdicts.get(judge) == BETTER for judge in harmed) and better > worse:
            explaining.append((net, site))
    if options or explaining:
        _, site = min(options or explaining)
        return Decision("exclude", excluded=[site], flags=_reasons(flags))
    if len(flags) >= MIN_OBJECTORS:
        return Decision("stop", flags=_reasons(flags), why=SEVERAL)
    return Decision("accept", flags=_reasons(flags), why=NOT_MOST if flags else "")


def after_exclusion(decision: Decision, flags: Mapping[str, Harm]) -> Decision:
    """An exclusion, judged on the model it keeps: ``flags`` are the harm tests of the candidate made without the
    excluded contribution. :data:`MIN_OBJECTORS` or more of them stop the job (one exclusion does not explain the
    harm: several hostile contributions or a colluding group); fewer are kept on record."""
    if len(flags) >= MIN_OBJECTORS:
        return Decision("stop", excluded=list(decision.excluded), flags=_reasons(flags), why=SEVERAL)
    return Decision("exclude", excluded=list(decision.excluded), flags=_reasons(flags))


def _reasons(flags: Mapping[str, Harm]) -> dict[str, str]:
    return {site: harm.reason() for site, harm in sorted(flags.items())}
