"""The server's checks: every rule a site's answers must pass before they touch the federation, one function each,
in a module per thing judged; this package's top holds their registry.

The controller calls these in seven places (the registry's stages):

* ``handshake`` (:mod:`.handshake`): a site's class names (count, length, characters, look-alikes of other
  classes), its declared training-set size and its preprocessing;
* ``result`` (:mod:`.result`): a training result's structure and values (keys, class names, shapes, dtypes,
  finite values, valid BatchNorm statistics, its sample count);
* ``update`` and ``aggregation`` (:mod:`.update`): the size of each part of a result's update (backbone weights,
  BatchNorm statistics, each head row), against references no single site controls, and how updates are clipped
  and weighted; the robust rules per part are :mod:`surgical_aggregation.core.robust`'s;
* ``metrics`` (:mod:`.metrics`): the validation metrics a site reports (documented keys, numbers, finite, in range);
* ``model`` (:mod:`.model`): the candidate global model of a round, before it replaces the last good one (finite,
  valid BatchNorm statistics, finite outputs on a fixed probe input), and any model the job starts from or
  publishes;
* ``screening``: the statistical judging of each round's model by the sites' validation
  (:mod:`surgical_aggregation.core.judging`).

Each check is a function registered with :func:`server_check`, with the rule it enforces and an example of
the reason it gives; ``docs/server-checks.md`` lists them from the registry (``python -m
surgical_aggregation.core.checks docs/server-checks.md`` rewrites its tables, a test keeps them in step). The
registry imports none of its checks' modules: :func:`registered_checks` loads them (:data:`CHECK_MODULES`), so they
import it and not the other way round. A reason names the site's own figures only, never another site's. Plain
NumPy and PyTorch, no FLARE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import import_module
from typing import Any

Reasons = list[str]
NameNormalizer = Callable[[str], str]

STAGES: dict[str, str] = {
    "handshake": "At the handshake",
    "result": "In every training result",
    "update": "The size of every update",
    "metrics": "In the validation metrics",
    "model": "The candidate global model",
    "aggregation": "How the round's updates are aggregated",
    "screening": "The sites' validation of each round's model",
}


@dataclass(frozen=True)
class ServerCheck:
    """One rule of the server, as the docs list it."""

    stage: str
    name: str
    rule: str
    reason: str  # an example of the reason text it gives
    module: str = ""  # the module that registered it: the registry lists checks in CHECK_MODULES' order


CHECKS: list[ServerCheck] = []  # in the order the controller applies them
# every check of a result's values, ``(state, layout) -> reasons``, in order: check_result runs them all
VALUE_CHECKS: list[Callable[[Mapping[str, Any], Any], list[str]]] = []


def server_check(stage: str, rule: str, reason: str, on_values: bool = False) -> Callable[[Callable], Callable]:
    """Register a check function with the rule it enforces and an example of its reason text. ``on_values``: a check
    of a training result's values, ``(state, layout) -> reasons``, that :func:`.result.check_result` runs with the
    others (a new one needs its module and its line in :data:`CHECK_MODULES`)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; one of {list(STAGES)}")
    if on_values and stage != "result":
        raise ValueError(f"a check of a result's values belongs to the result stage, not {stage!r}")

    def register(function: Callable) -> Callable:
        CHECKS.append(ServerCheck(stage, function.__name__, rule, reason, function.__module__))
        if on_values:
            VALUE_CHECKS.append(function)
        return function

    return register


def at_most(reasons: Reasons, shown: int, noun: str = "") -> Reasons:
    """The first ``shown`` reasons, and how many more there are (one message stays readable)."""
    extra = len(reasons) - shown
    return reasons[:shown] + ([f"and {extra} more{noun}"] if extra > 0 else [])


def cut_short(value: Any, limit: int = 40) -> str:
    """``str`` of something a site sent, cut short."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown_repr(value: Any, limit: int = 60) -> str:
    """``repr`` of something a site sent, cut short: a reason never repeats a megabyte of it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# every module that registers checks, in the order the controller applies them (a new one: its line here)
CHECK_MODULES: tuple[str, ...] = (
    f"{__name__}.handshake",
    f"{__name__}.result",
    f"{__name__}.update",
    f"{__name__}.metrics",
    f"{__name__}.model",
    "surgical_aggregation.core.robust",
    "surgical_aggregation.core.robust_lr",
    "surgical_aggregation.core.noise",
    "surgical_aggregation.core.judging",
)


@cache
def _load(modules: tuple[str, ...]) -> None:
    """Import each module once (check_result asks on every result; the registry it fills is kept)."""
    for module in modules:
        import_module(module)


def registered_checks() -> list[ServerCheck]:
    """Every rule of the server, each module of :data:`CHECK_MODULES` loaded."""
    _load(CHECK_MODULES)
    order = {module: index for index, module in enumerate(CHECK_MODULES)}
    # whichever module a process imported first, the order the controller applies them (a stable sort)
    return sorted(CHECKS, key=lambda check: order.get(check.module, len(order)))


def value_checks() -> list[Callable[[Mapping[str, Any], Any], list[str]]]:
    """Every check of a training result's values, in order, each module of :data:`CHECK_MODULES` loaded."""
    _load(CHECK_MODULES)
    return VALUE_CHECKS


# --- the documentation -----------------------------------------------------------------------------------------


def checks_table(stage: str) -> str:
    """The Markdown table of one stage's checks, as ``docs/server-checks.md`` shows it."""
    lines = ["| check | rule | reason text (example) |", "| --- | --- | --- |"]
    for check in registered_checks():
        if check.stage == stage:
            reason = check.reason.replace("|", "\\|")
            lines.append(f"| `{check.name}` | {check.rule} | `{reason}` |")
    return "\n".join(lines)


def _begin(stage: str) -> str:
    return f"<!-- checks:{stage} (generated from the registry of core/checks) -->"


_END = "<!-- /checks -->"


def document_checks(text: str) -> str:
    """``text`` with each stage's generated table between its markers replaced by the registry's."""
    for stage in STAGES:
        begin = _begin(stage)
        start = text.index(begin) + len(begin)
        end = text.index(_END, start)
        text = text[:start] + "\n" + checks_table(stage) + "\n" + text[end:]
    return text
