"""The robust learning rate: a per-value vote on the direction of the round's aggregate, a defence against backdoors.

Ozdayi, Kantarcioglu and Gel (*Defending against Backdoors in Federated Learning with Robust Learning Rate*, AAAI
2021): for each value of the model, the server's learning rate is ``+1`` where the signs of the sites' updates agree
enough, ``|sum_k sign(u_k)| >= theta``, and ``-1`` where they do not, so the aggregate is taken where the sites agree
and turned back where they do not. A backdoor moves values the honest sites leave alone or move either way; its
push there is reversed. Their code (``compute_robustLR``) multiplies the aggregate (their mean or coordinate-wise
median) by that vector; here it multiplies the round's aggregate after the robust rule, before any noise.

As in the paper it applies to the learned values: the backbone's weights as one vector, and each head row (weights and
bias, matched by name) over the sites that sent it. The BatchNorm statistics (measured averages, not learned) keep
their aggregate. A part fewer than ``max(theta, 2)`` distinct updates moved keeps it too: with fewer updates than
``theta`` no value could reach the vote and every value would be turned back (a row one site holds), and one update
has nothing to agree with. Two updates vote, so that a candidate the round makes without one site (the exclusion's
leave-one-out candidates) is voted as the round's own is: a two-site candidate that took no vote beat the voted
three-site round in the attack suite, and the honest site was left out. With two voting it was still left out, in the
clean run too: measured, the robust learning rate is no defence of this bundle at three sites, and it is off by
default (docs/server-checks.md). A copy of another site's update counts once, as for the robust rule. Plain NumPy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .checks import server_check
from .checks.update import WEIGHTS, row_part
from .head import NAMED_HEAD, HeadSpec, cast_like, to_numpy
from .robust import distinct_rows, flat_values, group_keys, row_updates, unflat_values

MIN_VOTERS = 2  # one update has nothing to agree with


def learning_rates(rows: np.ndarray, threshold: int) -> np.ndarray:
    """Per value: ``+1`` where ``|sum of the rows' signs| >= threshold``, else ``-1`` (``rows``: one per site)."""
    votes = np.abs(np.sign(np.asarray(rows, dtype=np.float64)).sum(axis=0))
    return np.where(votes >= threshold, 1.0, -1.0)


def voted_update(aggregate: np.ndarray, rows: np.ndarray, threshold: int) -> tuple[np.ndarray, float | None]:
    """``aggregate`` (the part's update) turned back where the distinct ``rows`` do not agree, and the share of values
    turned back; unchanged (share None) where fewer than ``max(threshold, 2)`` distinct rows moved the part."""
    distinct = distinct_rows(rows)
    if distinct.shape[0] < max(threshold, MIN_VOTERS):
        return aggregate, None
    rates = learning_rates(distinct, threshold)
    return aggregate * rates, float(np.mean(rates < 0))


@server_check(
    "aggregation",
    "with `robust_learning_rate` theta of 1 or more, after the robust rule each value of the backbone's learned "
    "weights and of each head row (over the sites that hold it) keeps the round's aggregate where the signs of the "
    "sites' (clipped) updates agree, |sum of signs| at least theta, and is turned back (learning rate -1) where they "
    "do not: the robust learning rate of Ozdayi, Kantarcioglu and Gel (AAAI 2021), against backdoors; a part fewer "
    "than max(theta, 2) distinct updates moved, and the BatchNorm statistics, keep their aggregate. Off (0) by default",
    "(recorded in the round's `robust_learning_rate`: the share of each part's values turned back)",
)
def voted_state(
    state: Mapping[str, Any],
    global_state: Mapping[str, Any],
    global_classes: Sequence[str],
    sent: Sequence[tuple[Mapping[str, Any], Sequence[str]]],
    averaged_keys: Sequence[str],
    threshold: int,
    head: HeadSpec = NAMED_HEAD,
    normalize: Callable[[str], str] | None = None,
) -> tuple[dict[str, Any], dict[str, float]]:
    """``state`` (the round's aggregate) with each learned part's update from ``global_state`` multiplied by the
    robust learning rates of the sites' updates, and part -> the share of its values turned back. ``sent``: each
    contributor's (clipped) state and its head rows' names."""
    normalize = normalize or (lambda name: name)
    voted, shares = dict(state), {}
    if threshold < 1:
        return voted, shares
    keys = group_keys(averaged_keys, global_state, WEIGHTS, head)
    if keys:
        base = flat_values(global_state, keys)
        rows = np.stack([flat_values(site, keys) - base for site, _ in sent])
        moved, share = voted_update(flat_values(state, keys) - base, rows, threshold)
        if share is not None:
            shares[WEIGHTS] = share
            voted.update(unflat_values(base + moved, keys, state))
    old_weight, old_bias = (to_numpy(global_state[key]).astype(np.float64) for key in head.keys)
    new_weight, new_bias = (to_numpy(state[key]).astype(np.float64).copy() for key in head.keys)
    positions = {normalize(name): index for index, name in enumerate(global_classes)}
    for canonical, rows in row_updates(sent, global_state, global_classes, head, normalize).items():
        index = positions[canonical]
        old = np.append(old_weight[index], old_bias[index])
        aggregate = np.append(new_weight[index], new_bias[index]) - old
        moved, share = voted_update(aggregate, np.stack(rows), threshold)
        if share is None:
            continue
        shares[row_part(canonical)] = share
        new_weight[index], new_bias[index] = (old + moved)[:-1], (old + moved)[-1]
    voted[head.weight_key] = cast_like(state[head.weight_key], new_weight)
    voted[head.bias_key] = cast_like(state[head.bias_key], new_bias)
    return voted, shares
