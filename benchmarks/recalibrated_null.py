"""How often the paired loss tests reject a true null on a site's validation images: the harm test's two halves (the
losses as they are, and once each model is recalibrated in the large, ``evaluation.metrics.recalibrated_probabilities``)
and the intersection-union test the server runs on them (``core.judging.harm_of``: p the larger of the two).

Not a test. Two models of one site are drawn alike (the same ranking signal, independent noise), so that neither
ranks better in expectation, and each draw gives the one-sided p of each paired difference (``paired_loss_difference``
and the normal approximation the server uses), at a difference of 0: the server's margins move where a null lies, not
the standard errors. With ``same`` intercepts the two models share one miscalibration of each finding, and no test's
null is false; with ``own`` intercepts each model has its own, so the losses as they are differ (that null is false)
and only the recalibrated null holds; ``shifted``: the first model's intercepts 2.5 logits above the second's, so the
losses as they are always tell it worse and the recalibrated half decides the server's test alone. The recalibrated
half's standard error takes each model's fitted intercepts as known; the table shows what that does at small
validation sizes, beside what the normal approximation does to the losses as they are. ``--student-t`` adds each
test's rates under Student's t with n - 1 degrees of freedom (n the validation images: the small-sample test of a mean
of independent normal differences, which the recalibrated half's fitted intercepts are not), a test the server does not
use (``docs/server-checks.md`` says why).

    python benchmarks/recalibrated_null.py --draws 2000
    python benchmarks/recalibrated_null.py --draws 20000 --settings 10x1@0.1 10x7@0.15 20x7@0.15 --student-t
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np
from scipy.stats import norm, t

from surgical_aggregation.evaluation.metrics import image_losses, paired_loss_difference, recalibrated_probabilities
from surgical_aggregation.experiments.grid_run import machine

SETTINGS = ((20, 1, 0.1), (20, 7, 0.15), (50, 1, 0.1), (50, 7, 0.15), (200, 7, 0.15), (1000, 7, 0.15))
LEVELS = (0.05, 0.01, 0.001)


INTERCEPTS = ("same", "own", "shifted")
SHIFT = 2.5  # logits: the first model's intercepts above the second's under ``shifted``


def setting_of(text: str) -> tuple[int, int, float]:
    """``IMAGESxFINDINGS@PREVALENCE`` (the record's names without the intercepts), e.g. ``10x7@0.15``."""
    try:
        size, prevalence = text.split("@")
        images, classes = size.split("x")
        return int(images), int(classes), float(prevalence)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a setting is IMAGESxFINDINGS@PREVALENCE, e.g. 10x7@0.15") from None


def tails(images: int, student_t: bool) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """The upper tails a z-score is read under, by the suffix of the tests' names: the normal (the server's), and
    with ``student_t`` Student's t with ``images - 1`` degrees of freedom."""
    return {"": norm.sf} | ({" (t)": lambda z: t.sf(z, images - 1)} if student_t else {})


def null_rates(
    images: int,
    classes: int,
    prevalence: float,
    draws: int,
    rng: np.random.Generator,
    intercepts: str,
    student_t: bool = False,
) -> dict:
    """Rejection rates at each of :data:`LEVELS` of the test on the losses as they are, recalibrated, and both; with
    ``student_t``, each again under Student's t with ``images - 1`` degrees of freedom (the names end in " (t)")."""
    z_scores = {"as they are": [], "recalibrated": []}
    for _ in range(draws):
        labels = (rng.random((images, classes)) < prevalence).astype(float)
        signal = 1.5 * (2.0 * labels - 1.0)
        shared = rng.normal(-1.0, 0.5, classes)
        offsets = {
            "same": (shared, shared),
            "own": (rng.normal(-1.0, 0.5, classes), rng.normal(-1.0, 0.5, classes)),
            "shifted": (shared + SHIFT, shared),
        }[intercepts]
        scores = [1.0 / (1.0 + np.exp(-(signal + rng.normal(0.0, 1.5, labels.shape) + offset))) for offset in offsets]
        pairs = {
            "as they are": [image_losses(labels, score) for score in scores],
            "recalibrated": [image_losses(labels, recalibrated_probabilities(labels, score)) for score in scores],
        }
        for name, (first, second) in pairs.items():
            difference, error = paired_loss_difference(first, second)
            z_scores[name].append(difference / error if error > 0 else -np.inf)
    rates = {}
    for suffix, tail in tails(images, student_t).items():
        raw, again = (tail(np.array(z_scores[name])) for name in ("as they are", "recalibrated"))
        for name, values in (
            ("as they are", raw),
            ("recalibrated", again),
            ("both (the server's)", np.maximum(raw, again)),
        ):
            rates[name + suffix] = {str(level): float(np.mean(values <= level)) for level in LEVELS}
    return rates


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--settings",
        nargs="+",
        type=setting_of,
        default=list(SETTINGS),
        metavar="IMAGESxFINDINGS@PREVALENCE",
        help="the validation sets drawn (default: the record's six, 20 to 1,000 images)",
    )
    parser.add_argument("--student-t", action="store_true", help="each test's rates under Student's t too")
    parser.add_argument("--out", help="write the rates as JSON here too")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started, results = time.time(), {}
    levels = " | ".join(f"level {level:g}" for level in LEVELS)
    print(f"| images | findings | prevalence | intercepts | test | {levels} |")
    print("| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in LEVELS) + " |")
    for images, classes, prevalence in args.settings:
        for intercepts in INTERCEPTS:
            rates = null_rates(images, classes, prevalence, args.draws, rng, intercepts, args.student_t)
            results[f"{images}x{classes}@{prevalence}/{intercepts}"] = rates
            for name, by_level in rates.items():
                if intercepts != "same" and name.startswith("as they are"):
                    continue  # its null is false: the models' base rates differ
                shown = " | ".join(f"{by_level[str(level)]:.4f}" for level in LEVELS)
                print(f"| {images} | {classes} | {prevalence:g} | {intercepts} | {name} | {shown} |", flush=True)
    print(f"{args.draws} draws a setting, seed {args.seed}, {time.time() - started:.0f} s")
    if args.out:
        with open(args.out, "w") as handle:
            record = {"draws": args.draws, "seed": args.seed, "seconds": round(time.time() - started)}
            json.dump({**record, "machine": machine(), "rates": results}, handle, indent=1)
    return results


if __name__ == "__main__":
    main()
