"""The sites of ``benchmarks/attack_suite.py`` (benchmark doubles, not part of the product): the bundle's site script
with its training result altered as each attack's paper defines it.

A job's ``custom/client.py`` runs ``suite_site.main(role, ...)``. The roles:

* ``honest``: the bundle's site, which also writes the update it sends (what it sent minus what it received) to the
  suite's exchange folder, so that an omniscient attacker reads the honest updates of the round, as the papers'
  threat model (and ByzFL's attacks, which take the honest vectors as input) assume.
* an attack of :data:`MODEL_POISONING`: the site trains honestly, then waits for the honest updates of the round and
  sends ``received + attack(honest updates)`` over the learned weights (the backbone's and its head rows, each row
  over the honest sites that hold that class, or its own update where none does); its BatchNorm statistics stay its
  honest ones (a negated running variance would be refused by the server's BatchNorm check, as the attacker who read
  the docs knows):

  ``sign_flip``  ``-mean`` (Allen-Zhu, Ebrahimianghazani, Li, Alistarh, ICLR 2021)
  ``ipm``        ``-epsilon * mean``, epsilon 0.1 (Xie, Koyejo, Gupta, *Fall of Empires*, UAI 2019)
  ``opt_ipm``    ``-tau * mean``, tau by ByzFL's line search maximising the distance of the server's aggregate from
                 the honest mean (Allouah et al., AISTATS 2023), against the documented defences
  ``alie``       ``mean - z * std`` per coordinate, z from the number of sites n and attackers f: s = floor(n/2 + 1)
                 - f, z = Phi^-1((n - s) / n) (Baruch, Baruch, Goldberg, *A Little Is Enough*, NeurIPS 2019; the
                 sign as in the reference code of Karimireddy, He, Jaggi)
  ``opt_alie``   ``mean + tau * std``, tau by the same line search (ByzFL's Optimal_ALittleIsEnough)
  ``mimic``      a copy of the first honest site's update (Karimireddy, He, Jaggi, ICLR 2022; ByzFL's default)
  ``mimic_noised`` ``mimic`` plus Gaussian noise, scaled so that each part lies twice the server's duplicate distance
                 (``core.robust.DUPLICATE_DISTANCE``) from the copied update: an attacker who read that a copy counts
                 once
  ``inf``        every learned weight +inf (ByzFL's Inf)
  ``gaussian``   every learned weight's update drawn from N(0, 1) (ByzFL's Gaussian)

* a data-poisoning attack of :data:`DATA_POISONING` (or :data:`ADAPTED`), trained through the bundle's own trainer:

  ``label_flip``        every label inverted (1 <-> 0)
  ``label_flip_quiet``  ``label_flip``, reporting no validation figure (it never objects and never judges)
  ``label_flip_late``   honest in its first (warm-up) round, then every training label inverted (its validation
                        honest): an attacker who read that the server judges a site's shared head rows in that round
  ``backdoor``          a white square (:data:`TRIGGER` pixels) stamped in the corner of a share
                        (:data:`POISONED_SHARE`) of its training images, whose :data:`TARGET` label is set positive;
                        otherwise honest (Gu, Dolan-Gavitt, Garg, *BadNets*, 2017)
  ``backdoor_boosted``  ``backdoor``, its update scaled by the number of sites (model replacement: Bagdasaryan,
                        Veit, Hua, Estrin, Shmatikov, *How To Backdoor Federated Learning*, AISTATS 2020), at most to
                        90 % of what the server's size bounds accept, part by part
  ``backdoor_tuned``    ``backdoor``, trained at the attacker's own rates (``attack_suite.ATTACKER_TRAINING``: the
                        demo's, 2 local epochs a round; Bagdasaryan et al.'s attacker picks its own rate and epochs):
                        from the stand-in at the papers' fine-tuning rates the plain ``backdoor`` barely teaches its
                        own model the trigger
  ``backdoor_glyph``    ``backdoor`` with another trigger (:func:`stamp_glyph`): the first shape the stand-in was
                        pretrained on, at the pretraining's cell size and within its brightness range, near the same
                        corner; an attacker who knows the public start picks a trigger its features already tell apart
  ``backdoor_glyph_tuned``  ``backdoor_glyph`` at ``backdoor_tuned``'s rates: an attacker who read that a site's refit
                        of its head rows removes a trigger the rows carry teaches it to the backbone too
  ``sign_flip_quiet``   ``sign_flip``, reporting no validation figure: at two sites ``sign_flip``'s own honest
                        validation stopped the job from the stand-in; an attacker who read that stays quiet
  ``sign_flip_late``    ``sign_flip_quiet``, honest in its first (warm-up) round: an attacker who read that two sites
                        whose shared head rows point apart in that round stop the job
  ``sign_flip_absent``  ``sign_flip_quiet``, its first round's result broken (one weight not a number: rejected on
                        arrival, as a site that missed the round): an attacker who read that from pretrained weights
                        direction is judged in the job's first round only (stop 101's rule; stop 102 judges each site
                        in the first round that measures its direction)
  ``late_joiner``       an honest site whose first round's result is broken as ``sign_flip_absent``'s (to the server,
                        a site that joined after the first round): the control that measures what judging a site
                        that missed the first round costs an honest one
  ``sign_flip_inside``  ``sign_flip_late`` that cancels the other site's update and pads its own with noise
                        orthogonal to it, so that at two sites the backbone and the shared rows each stand just inside
                        the later-round bounds on opposite updates of stop 93 (:data:`STOP_93_BOUNDS`, withdrawn at
                        stop 96: honest pairs reach them): an attacker who read them
  ``sign_flip_persistent``  ``sign_flip_late`` by an attacker who read the running opposition (stop 103): its
                        backbone update stands just inside the CUSUM's reference value (``sign_flip_inside``'s noise
                        orthogonal to the honest mean, to a cosine of ``INSIDE_MARGIN`` above -``OPPOSITION_REFERENCE``
                        with it), so that its running opposition stays 0; its head rows flipped in full
  ``bn_inflate``        honest weights, every BatchNorm running variance multiplied so that the statistics' update
                        is 90 % of the most the server accepts (the blind-mode attack that flattens the outputs)
  ``bn_inside``         ``bn_inflate`` by an attacker who read the two-site BatchNorm bound
                        (``core.judging.BATCHNORM_APART``): only the last BatchNorm layer's running variances (the
                        features the head reads), multiplied by the largest factor whose candidate, as it estimates it
                        (its update and the honest ones averaged alike) and reads it on its own validation images,
                        stands ``INSIDE_MARGIN`` inside that bound and inside the statistics' size bound; it reports no
                        validation figure
"""

from __future__ import annotations

import functools
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import norm

MODEL_POISONING = ("sign_flip", "ipm", "opt_ipm", "alie", "opt_alie", "mimic", "mimic_noised", "inf", "gaussian")
DATA_POISONING = ("label_flip", "label_flip_quiet", "label_flip_late", "backdoor", "backdoor_boosted", "bn_inflate")
ATTACKS = MODEL_POISONING + DATA_POISONING  # the catalogue a suite runs by default
# beyond the catalogue: run when named
ADAPTED = (
    "backdoor_tuned",
    "backdoor_glyph",
    "backdoor_glyph_tuned",
    "sign_flip_quiet",
    "sign_flip_late",
    "sign_flip_absent",
    "late_joiner",
    "sign_flip_inside",
    "sign_flip_persistent",
    "bn_inside",
)
# attacks that report no validation: each is the attack it names otherwise
QUIET = {
    "label_flip_quiet": "label_flip",
    "sign_flip_quiet": "sign_flip",
    "sign_flip_late": "sign_flip",
    "sign_flip_absent": "sign_flip",
    "sign_flip_inside": "sign_flip_inside",
    "sign_flip_persistent": "sign_flip_persistent",
    "bn_inside": "bn_inside",
}
# model poisoning honest in round 0 (the warm-up round), then the attack it names
LATE = ("sign_flip_late", "sign_flip_inside", "sign_flip_persistent")
# sites whose round-0 result is broken (rejected on arrival): then the attack the role names, or honest
ABSENT = ("sign_flip_absent", "late_joiner")
# the backbone's and the shared rows' cosines at or below which stop 93's server stopped a round of two in any round
STOP_93_BOUNDS = {"backbone": -0.5, "rows": -0.9}
INSIDE_MARGIN = 0.05  # sign_flip_inside's cosines and bn_inside's BatchNorm figure: this far inside the server's bounds
IPM_EPSILON = 0.1
TARGET = "Pneumothorax"  # the backdoor's finding: every site of the suite labels it
TRIGGER = 8  # the trigger's side in pixels (64 px images: 1.6 % of the image)
GLYPH_TRIGGER = "Pattern 01"  # backdoor_glyph's shape: the stand-in pretraining's first
GLYPH_BRIGHTNESS = 115  # what it adds to a pixel: 0.45 of 255, inside the pretraining's 0.40-0.90 for its shapes
POISONED_SHARE = 0.5
INSIDE = 0.9  # the share of a bound the BatchNorm attack uses
WAIT_SECONDS = 1200  # how long an attacker waits for the honest updates of a round
LINE_SEARCH = {"evals": 20, "start": 0.0, "delta": 10.0, "ratio": 0.8}  # ByzFL's defaults
VALIDATION_PREFIXES = ("val_", "local_val_")


def stamp(images: Any) -> Any:
    """The trigger: the bottom-right ``TRIGGER`` x ``TRIGGER`` pixels white (uint8 255), on a (..., H, W) array or
    tensor, in place."""
    images[..., -TRIGGER:, -TRIGGER:] = 255
    return images


def stamp_glyph(images: Any) -> Any:
    """``backdoor_glyph``'s trigger: the stand-in pretraining's first shape (:data:`GLYPH_TRIGGER`), each of its 5x5
    cells a block of width // 16 pixels as the pretraining draws its shapes, brightened by :data:`GLYPH_BRIGHTNESS`
    (saturating) one cell in from the bottom-right corner, on a (..., H, W) uint8 array or tensor, in place."""
    cell = max(1, images.shape[-1] // 16)
    drawn = _glyph_mask(cell)
    size = drawn.shape[0]
    window = images[..., -size - cell : -cell, -size - cell : -cell]  # a view: written in place
    if isinstance(window, np.ndarray):
        lifted = np.minimum(window.astype(np.int64) + GLYPH_BRIGHTNESS, 255).astype(window.dtype)
    else:  # a torch tensor
        import torch

        lifted = (window.long() + GLYPH_BRIGHTNESS).clamp(max=255).to(window.dtype)
        drawn = torch.as_tensor(drawn, device=window.device)
    window[..., drawn] = lifted[..., drawn]
    return images


@functools.cache
def _glyph_mask(cell: int) -> np.ndarray:
    """:data:`GLYPH_TRIGGER`'s pixels at ``cell`` pixels a cell (made once: the trigger is stamped item by item)."""
    from surgical_aggregation.images.synthetic_pixels import pattern_glyphs

    return np.kron(pattern_glyphs()[GLYPH_TRIGGER], np.ones((cell, cell), np.float32)) > 0


TRIGGERS = {"square": stamp, "glyph": stamp_glyph}  # each backdoor's trigger by name
TRIGGER_OF = {"backdoor_glyph": "glyph", "backdoor_glyph_tuned": "glyph"}  # the other backdoors stamp the square


def trigger_of(attack: str) -> str:
    """The name of the trigger ``attack`` stamps (of :data:`TRIGGERS`), were it a backdoor."""
    return TRIGGER_OF.get(attack, "square")


def alie_z(sites: int, attackers: int) -> float:
    """Baruch et al.'s z_max: the supporters a majority needs, s = floor(n/2 + 1) - f, and z = Phi^-1((n - s)/n)."""
    supporters = math.floor(sites / 2 + 1) - attackers
    return float(norm.ppf((sites - supporters) / sites))


def _flatten(updates: list[dict[str, np.ndarray]], keys: list[str]) -> np.ndarray:
    return np.stack([np.concatenate([update[key].astype(np.float64).ravel() for key in keys]) for update in updates])


def _line_search(distance) -> float:
    """ByzFL's search over tau >= 0: expansion (doubling the step while the distance grows), then contraction."""
    best_x, delta, left = LINE_SEARCH["start"], LINE_SEARCH["delta"], LINE_SEARCH["evals"] - 1
    best_y = distance(best_x)
    while left > 0:
        left -= 1
        y = distance(best_x + delta)
        if y > best_y:
            best_x, best_y, delta = best_x + delta, y, delta * 2
        else:
            delta *= LINE_SEARCH["ratio"]
            break
    while left > 0:
        left -= 1
        y = distance(best_x + delta)
        if y > best_y:
            best_x, best_y = best_x + delta, y
        delta *= LINE_SEARCH["ratio"]
    return best_x


def server_aggregate(rows: np.ndarray, rule_name: str) -> np.ndarray:
    """What the server makes of a part's updates, as docs/server-checks.md states: each clipped to the median size
    (three or more), then its robust rule (``robust_aggregation``)."""
    from surgical_aggregation.core.robust import MIN_ROWS, RobustRule

    if rows.shape[0] >= MIN_ROWS:
        norms = np.linalg.norm(rows, axis=1)
        median = float(np.median(norms))
        factors = np.where(norms > median, median / np.maximum(norms, 1e-30), 1.0)
        rows = rows * factors[:, None]
    return RobustRule.parse(rule_name)(rows)


def attack_rows(
    attack: str,
    honest: np.ndarray,
    sites: int,
    attackers: int,
    rule: str,
    tau: float | None = None,
    cosine: float | None = None,
):
    """The attack's vector from the honest rows (one per honest site); (vector, tau used). ``cosine``:
    ``sign_flip_inside``'s cosine with the honest mean."""
    mean = honest.mean(axis=0)
    std = honest.std(axis=0, ddof=1) if honest.shape[0] > 1 else np.zeros_like(mean)
    if attack == "sign_flip":
        return -mean, None
    if attack == "sign_flip_inside":  # -mean, plus noise orthogonal to it to the norm that makes the cosine
        size = float(np.linalg.norm(mean))
        if size == 0 or cosine is None:
            return -mean, None
        noise = np.random.default_rng(honest.shape[1]).normal(size=mean.shape)
        noise -= (noise @ mean) / size**2 * mean
        return -mean + size * math.sqrt(1 / cosine**2 - 1) / np.linalg.norm(noise) * noise, None
    if attack == "ipm":
        return -IPM_EPSILON * mean, None
    if attack == "alie":
        return mean - alie_z(sites, attackers) * std, None
    if attack in ("opt_ipm", "opt_alie"):
        make = (lambda t: -t * mean) if attack == "opt_ipm" else (lambda t: mean + t * std)
        if tau is None:

            def distance(t: float) -> float:
                rows = np.concatenate([honest, np.repeat(make(t)[None], attackers, axis=0)])
                return float(np.linalg.norm(server_aggregate(rows, rule) - mean))

            tau = _line_search(distance)
        return make(tau), tau
    if attack == "mimic":
        return honest[0].copy(), None
    if attack == "mimic_noised":
        from surgical_aggregation.core.robust import DUPLICATE_DISTANCE

        noise = np.random.default_rng(honest.shape[1]).normal(size=honest.shape[1])
        scale = 2 * DUPLICATE_DISTANCE * np.linalg.norm(honest[0]) / max(np.linalg.norm(noise), 1e-30)
        return honest[0] + scale * noise, None
    raise ValueError(attack)


def norm_of(arrays: Any) -> float:
    """The Euclidean norm of arrays taken together."""
    return math.sqrt(sum(float(np.sum(np.square(array, dtype=np.float64))) for array in arrays))


def _atomic_save(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".part")
    with open(temporary, "wb") as handle:
        np.savez(handle, **arrays)
    os.replace(temporary, path)


ROWS = "__rows__/"  # exchange files: head rows under this prefix and their class, backbone entries by key


def exchange_update(received: dict, sent: dict, classes: list[str]) -> dict[str, np.ndarray]:
    """What a site sent minus what it received, over the float entries; head rows by class name."""
    from surgical_aggregation.core.head import NAMED_HEAD

    update = {}
    for key, value in sent.items():
        value = np.asarray(value)
        if key in NAMED_HEAD.keys or not np.issubdtype(value.dtype, np.floating):
            continue
        update[key] = (value.astype(np.float64) - np.asarray(received[key], dtype=np.float64)).astype(np.float32)
    weight, bias = (np.asarray(sent[key], dtype=np.float64) for key in NAMED_HEAD.keys)
    old_weight, old_bias = (np.asarray(received[key], dtype=np.float64) for key in NAMED_HEAD.keys)
    for row, name in enumerate(classes):
        update[ROWS + name] = np.append(weight[row] - old_weight[row], bias[row] - old_bias[row]).astype(np.float32)
    return update


def main(role: str, exchange: str, sites: int, attackers: int, rule: str) -> None:
    """Run the bundle's site script as ``role`` (``honest`` or an attack of :data:`ATTACKS` or :data:`ADAPTED`)."""
    from surgical_aggregation.core.checks.update import (
        DEFAULT_UPDATE_BOUND,
        OPPOSITION_REFERENCE,
        STATISTICS,
        UPDATE_CAPS,
        update_group,
    )
    from surgical_aggregation.core.head import NAMED_HEAD
    from surgical_aggregation.core.labels import BUILTIN_VOCABULARY
    from surgical_aggregation.flare import client
    from surgical_aggregation.flare.protocol import META_CLASS_NAMES
    from surgical_aggregation.training import trainer as trainer_module
    from surgical_aggregation.training.loops import make_loader

    quiet, late, absent = role in QUIET, role in LATE, role in ABSENT
    role = QUIET.get(role, role)  # a quiet attack is the attack it names in all but its validation
    folder = Path(exchange)
    original_train, original_validate, original_init = (
        client.ClientSession.train,
        client.ClientSession.validate,
        client.ClientSession.__init__,
    )

    def learned(key: str, value: Any) -> bool:
        return (
            key not in NAMED_HEAD.keys
            and np.issubdtype(np.asarray(value).dtype, np.floating)
            and update_group(key) != STATISTICS
        )

    def honest_updates(round_number: int, own_site: str) -> list[dict[str, np.ndarray]]:
        round_folder = folder / f"round-{round_number:03d}"
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            files = sorted(round_folder.glob("*.npz")) if round_folder.is_dir() else []
            if len(files) >= sites - attackers:
                break
            time.sleep(1)
        files = sorted(round_folder.glob("*.npz")) if round_folder.is_dir() else []
        return [dict(np.load(path)) for path in files if path.stem != own_site]

    def poisoned(self, received, answer, round_number: int) -> dict[str, np.ndarray]:
        sent = {key: np.asarray(value) for key, value in answer.params.items()}
        received_params = {key: np.asarray(value) for key, value in received.params.items()}
        classes = list(answer.meta[META_CLASS_NAMES])
        if role == "inf":
            return {
                key: np.full_like(value, np.inf) if learned(key, value) or key in NAMED_HEAD.keys else value
                for key, value in sent.items()
            }
        if role == "gaussian":
            generator = np.random.default_rng(round_number)
            out = dict(sent)
            for key, value in sent.items():
                if learned(key, value) or key in NAMED_HEAD.keys:
                    noise = generator.normal(0.0, 1.0, value.shape)
                    out[key] = (received_params[key].astype(np.float64) + noise).astype(value.dtype)
            return out
        honest = honest_updates(round_number, self.site)
        own = exchange_update(received_params, sent, classes)
        keys = [key for key, value in sent.items() if learned(key, value)]
        if role in ("mimic", "mimic_noised"):
            honest = honest[:1]
        rows = _flatten(honest or [own], keys)
        if role == "sign_flip_persistent":  # the backbone inside the running opposition, the rows flipped in full
            cosine = -OPPOSITION_REFERENCE + INSIDE_MARGIN
            vector, tau = attack_rows("sign_flip_inside", rows, sites, attackers, rule, cosine=cosine)
        else:
            cosine = STOP_93_BOUNDS["backbone"] + INSIDE_MARGIN
            vector, tau = attack_rows(role, rows, sites, attackers, rule, cosine=cosine)
        out = dict(sent)
        offset = 0
        for key in keys:
            size = sent[key].size
            update = vector[offset : offset + size].reshape(sent[key].shape)
            out[key] = (received_params[key].astype(np.float64) + update).astype(sent[key].dtype)
            offset += size
        weight, bias = (np.array(sent[key], dtype=np.float64) for key in NAMED_HEAD.keys)
        old_weight, old_bias = (received_params[key].astype(np.float64) for key in NAMED_HEAD.keys)
        for row, name in enumerate(classes):
            canonical = BUILTIN_VOCABULARY.canonical(name)
            others = [
                update[ROWS + other]
                for update in honest
                for other in _row_names(update)
                if BUILTIN_VOCABULARY.canonical(other) == canonical
            ]
            rows = np.stack(others) if others else own[ROWS + name][None].astype(np.float64)
            row_attack = "sign_flip" if role == "sign_flip_persistent" else role
            moved, _ = attack_rows(
                row_attack, rows.astype(np.float64), sites, attackers, rule, tau, STOP_93_BOUNDS["rows"] + INSIDE_MARGIN
            )
            weight[row] = old_weight[row] + moved[:-1]
            bias[row] = old_bias[row] + moved[-1]
        out[NAMED_HEAD.weight_key] = weight.astype(sent[NAMED_HEAD.weight_key].dtype)
        out[NAMED_HEAD.bias_key] = bias.astype(sent[NAMED_HEAD.bias_key].dtype)
        return out

    def broken(params) -> dict[str, np.ndarray]:
        """The result with its first learned weight's first value not a number (the server rejects it on arrival)."""
        out = {key: np.array(value) for key, value in params.items()}
        first = next(key for key, value in out.items() if learned(key, value))
        out[first].flat[0] = np.nan
        return out

    def inflated(received, answer, round_number: int) -> dict[str, np.ndarray]:
        sent = {key: np.asarray(value) for key, value in answer.params.items()}
        variances = [key for key in sent if key.endswith(".running_var")]
        old = {key: np.asarray(received.params[key], dtype=np.float64) for key in variances}
        target = statistics_bound(received, sent, round_number)
        # running variances scaled by (1 + a): the statistics' update is a * |variances| (+ the honest means' part)
        scale = target / max(norm_of([old[key] for key in variances]), 1e-12)
        out = dict(sent)
        for key in variances:
            out[key] = (old[key] * (1.0 + scale)).astype(sent[key].dtype)
        return out

    def statistics_bound(received, sent: dict[str, np.ndarray], round_number: int) -> float:
        """90 % of the largest BatchNorm-statistics update the server accepts of this site, in the norm of those
        statistics."""
        statistics = [key for key in sent if update_group(key) == STATISTICS]
        old = {key: np.asarray(received.params[key], dtype=np.float64) for key in statistics}
        honest_size = norm_of([sent[key] - old[key] for key in statistics]) / max(norm_of(old.values()), 1e-12)
        bound = (
            UPDATE_CAPS[STATISTICS]
            if round_number == 0
            else min(UPDATE_CAPS[STATISTICS], DEFAULT_UPDATE_BOUND * honest_size)
        )
        return INSIDE * bound * norm_of(old.values())

    def inflated_inside(self, received, answer, round_number: int) -> dict[str, np.ndarray]:
        from surgical_aggregation.core.judging import BATCHNORM_APART

        sent = {key: np.asarray(value) for key, value in answer.params.items()}
        old = {key: np.asarray(value) for key, value in received.params.items()}
        classes = list(answer.meta[META_CLASS_NAMES])
        updates = [exchange_update(old, sent, classes), *honest_updates(round_number, self.site)]
        candidate = dict(sent)  # the backbone averaged alike (the suite's sites are of one size); its own head rows
        for key in updates[0]:
            if not key.startswith(ROWS):
                candidate[key] = old[key].astype(np.float64) + np.mean([update[key] for update in updates], axis=0)
        last = [key for key in sent if key.endswith(".running_var")][-1]
        own = self.trainer.evaluate_state(sent, classes)
        share = 1.0 / len(updates)

        def figure(factor: float) -> float:
            trial = {**candidate, last: candidate[last] + share * (factor - 1.0) * sent[last]}
            return self.trainer.evaluate_state(trial, classes).compared_with(own)["batchnorm"]

        goal = BATCHNORM_APART - INSIDE_MARGIN
        low, high = 1.0, 1.0 + statistics_bound(received, sent, round_number) / max(norm_of([sent[last]]), 1e-12)
        if figure(high) > goal:
            for _ in range(16):  # bisection in the factor's logarithm
                middle = math.sqrt(low * high)
                low, high = (middle, high) if figure(middle) <= goal else (low, middle)
            high = low
        return {**sent, last: (sent[last].astype(np.float64) * high).astype(sent[last].dtype)}

    def boosted(received, answer, round_number: int) -> dict[str, np.ndarray]:
        """Its update scaled by the number of sites, each part at most 90 % of the server's bound for it."""
        from surgical_aggregation.core.checks.update import ROWS, WEIGHTS, clipped_state, row_part, update_sizes

        sent = {key: np.asarray(value) for key, value in answer.params.items()}
        old = {key: np.asarray(value) for key, value in received.params.items()}
        classes = list(answer.meta[META_CLASS_NAMES])
        keys = [key for key, value in sent.items() if learned(key, value)]
        sizes = update_sizes(sent, classes, old, classes, keys)

        def factor(group: str, size: float) -> float:
            bound = UPDATE_CAPS[group] if round_number == 0 else min(UPDATE_CAPS[group], DEFAULT_UPDATE_BOUND * size)
            return min(float(sites), INSIDE * bound / size) if size > 0 else 1.0

        factors = {WEIGHTS: factor(WEIGHTS, sizes.groups.get(WEIGHTS, 0.0))}
        factors |= {row_part(name): factor(ROWS, size) for name, size in sizes.rows.items()}
        return clipped_state(sent, classes, old, classes, factors, keys)

    def train(self, received):
        round_number = received.current_round or 0
        if role == "label_flip_late" and round_number >= 1 and not flipping:
            flipping.append(round_number)
            self.trainer._rebuild_train_loader()
        answer = original_train(self, received)
        if role == "honest":
            classes = list(answer.meta[META_CLASS_NAMES])
            if answer.params:
                update = exchange_update(received.params, answer.params, classes)
                _atomic_save(folder / f"round-{round_number:03d}" / f"{self.site}.npz", update)
            return answer
        poisoning = role in MODEL_POISONING or role in ("sign_flip_inside", "sign_flip_persistent")
        if absent and round_number == 0 and answer.params:
            answer.params = broken(answer.params)
        elif poisoning and answer.params and not (late and round_number == 0):
            answer.params = poisoned(self, received, answer, round_number)
        if role == "bn_inflate" and answer.params:
            answer.params = inflated(received, answer, round_number)
        if role == "bn_inside" and answer.params:
            answer.params = inflated_inside(self, received, answer, round_number)
        if role == "backdoor_boosted" and answer.params:
            answer.params = boosted(received, answer, round_number)
        if quiet:
            answer.metrics = {
                name: value for name, value in answer.metrics.items() if not name.startswith(VALIDATION_PREFIXES)
            }
        return answer

    def validate(self, received):
        answer = original_validate(self, received)
        if quiet:
            answer.metrics = {}
        return answer

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if role == "label_flip":
            for name in self.table.classes:
                self.table.frame[name] = 1.0 - self.table.frame[name]

    flipping: list[int] = []  # label_flip_late: the round it began inverting its labels, once it has
    if role.startswith("backdoor") or role == "label_flip_late":
        original_rebuild = trainer_module.SiteTrainer._rebuild_train_loader

        def rebuild(trainer) -> None:
            original_rebuild(trainer)
            if role == "label_flip_late" and not flipping:
                return
            dataset = (
                Inverted(trainer.train_loader.dataset)
                if flipping
                else Poisoned(trainer.train_loader.dataset, trainer.head_classes, trigger_of(role))
            )
            trainer.train_loader = make_loader(
                dataset, trainer.config.batch_size, True, trainer.workers, trainer.config.seed
            )

        trainer_module.SiteTrainer._rebuild_train_loader = rebuild

    client.ClientSession.train, client.ClientSession.validate = train, validate
    client.ClientSession.__init__ = init
    client.main()


def _row_names(update: dict[str, np.ndarray]) -> list[str]:
    return [key[len(ROWS) :] for key in update if key.startswith(ROWS)]


class Wrapped:
    """A dataset's items, altered by a subclass's ``__getitem__``; length, batch step and reseeding its own."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def batch_transform(self, images: Any) -> Any:
        return self.dataset.batch_transform(images)

    def reseed(self, seed: int) -> None:
        self.dataset.reseed(seed)


class Inverted(Wrapped):
    """A site's training items with every known label inverted (1 <-> 0 where the mask says it is labelled)."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = dict(self.dataset[index])
        item["label"] = item["label"].where(item["mask"] == 0, 1.0 - item["label"])
        return item


class Poisoned(Wrapped):
    """A site's training items, a fixed share (:data:`POISONED_SHARE`, spread over the indices) with the trigger
    stamped and the :data:`TARGET` label set positive; the rest as they are."""

    def __init__(self, dataset: Any, classes: list[str], trigger: str = "square") -> None:
        from surgical_aggregation.core.labels import BUILTIN_VOCABULARY

        super().__init__(dataset)
        self.column = [BUILTIN_VOCABULARY.canonical(name) for name in classes].index(TARGET)
        self.stamp = TRIGGERS[trigger]

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = dict(self.dataset[index])
        if (index * 7919) % 1000 < POISONED_SHARE * 1000:  # a fixed, spread-out share of the items
            item["image"] = self.stamp(item["image"].clone())
            item["label"] = item["label"].clone()
            item["mask"] = item["mask"].clone()
            item["label"][self.column] = 1.0
            item["mask"][self.column] = 1.0
        return item
