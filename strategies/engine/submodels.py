"""Width-heterogeneous sub-models, a component of the round engine: what HeteroFL, FjORD and
FedRolex share (:mod:`strategies.algorithms.heterofl`, :mod:`strategies.algorithms.fjord`,
:mod:`strategies.algorithms.fedrolex`).

Per round, on the engine's sampling, reply checks and clock (:class:`SubModels`):

* each selected client k gets a width r_k (:class:`WidthRule`): the largest level whose
  round time on the simulated clock, with the client's own sub-model size and compute,
  fits the round deadline; or a fixed level per client; or a fresh draw per round;
* it is sent the sub-model W_k of the global model W: the kept units of every hidden
  layer (:func:`strategies.engine.submodel_math.submodel_indices`: the first ceil(r_k K) units,
  or FedRolex's rolling window), with ``model-width`` = r_k;
* each reply is checked against the sub-model that node was sent (keys, shapes, dtypes);
* W_{t+1}: each entry is the (uniform or example-weighted) mean over the clients whose
  sub-model holds it; the entries no client trained keep their value
  (:func:`strategies.engine.submodel_math.overlap_aggregate`);
* with the label split (HeteroFL's and FedRolex's code, :class:`SubModels`' ``label_split``)
  each client trains with the masked cross-entropy of its own labels and replies them
  (``label-mask``); a client holds an output-layer row only for its labels
  (:func:`strategies.engine.submodel_math.label_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from logging import WARNING

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.common.logger import log

from .. import contract as C
from ..contract import Section, logged
from . import records, submodel_math, trust_gate
from .keys import Key
from .participation import ModelShare, Participation, check_choice
from .round_plan import RoundPlan

__all__ = ["DEFAULT_LEVELS", "SCHEMES", "SUBMODEL_KEYS", "SubModels", "WIDTH_RULES", "WidthRule",
           "WidthSection", "parse_levels", "width_spec_of"]

SCHEMES = submodel_math.SCHEMES

DEFAULT_LEVELS = (1.0, 0.5, 0.25, 0.125, 0.0625)  # HeteroFL's a-e (1, 1/2, ..., 1/16)
WIDTH_RULES = ("deadline", "fixed", "dynamic")
WIDTH_WEIGHTINGS = ("uniform", "examples")
DYNAMIC_TAG = 0x3D7  # rng stream of the "dynamic" rule's draws


@dataclass(frozen=True)
class WidthSection(Section):
    """The round's widths: how they were chosen, each client's, and how many per width."""

    rule: str = logged(C.LOG_WIDTH_RULE, default="")
    client_widths: Mapping[str, float] = logged(C.LOG_CLIENT_WIDTHS, default=None)
    counts: Mapping[str, int] = logged(C.LOG_WIDTH_COUNTS, default=None)


def width_spec_of(axes: Mapping[str, Sequence]) -> submodel_math.WidthSpec:
    """A :class:`~strategies.engine.submodel_math.WidthSpec` from plain tuples: per parameter, per
    axis, None or ``(hidden_dimension, repeat)`` (what ``task.models.width_spec`` returns)."""
    return submodel_math.WidthSpec({
        key: tuple(None if entry is None else submodel_math.HiddenUnits(*entry)
                   if isinstance(entry, (tuple, list)) else entry for entry in entries)
        for key, entries in axes.items()})


class WidthRule:
    """How a client's width is chosen among ``levels`` (sorted, largest first).

    * ``"deadline"``: the largest level whose eq. (1) time on the simulated clock (the
      client's own sub-model bytes and compute) fits the round deadline; the smallest if
      none does (the participation model then cuts or drops it, as any straggler).
    * ``"fixed"``: partition p always trains ``levels[p mod L]`` (equal shares of the
      clients per level, as HeteroFL's fixed assignment).
    * ``"dynamic"``: a uniform draw per round and client from
      ``default_rng([seed, round, p, DYNAMIC_TAG])`` (HeteroFL's dynamic assignment).
    """

    def __init__(self, name: str, levels: Sequence[float], seed: int) -> None:
        check_choice("width_rule", name, WIDTH_RULES)
        if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence) or not levels:
            raise ValueError(f"levels={levels!r} must be a non-empty list of widths in (0, 1], "
                             f"e.g. {list(DEFAULT_LEVELS)}")
        widths = sorted({submodel_math._check_ratio(level, "levels entry") for level in levels},
                        reverse=True)
        self.name, self.levels, self.seed = name, tuple(widths), int(seed)

    def fixed(self, partition_id: int) -> float:
        """``"fixed"``: the level of partition ``partition_id``."""
        return self.levels[int(partition_id) % len(self.levels)]

    def dynamic(self, server_round: int, partition_id: int) -> float:
        """``"dynamic"``: this round's draw for partition ``partition_id``."""
        rng = np.random.default_rng([self.seed, int(server_round), int(partition_id),
                                     DYNAMIC_TAG])
        return self.levels[int(rng.integers(len(self.levels)))]


class SubModels:
    """Each selected client's width, sub-model, reply check and overlap average (module
    docstring); given to the round engine by HeteroFL, FjORD and FedRolex.

    Parameters
    ----------
    scheme : str
        ``"static"`` (the first ceil(r K) units: HeteroFL, FjORD) or ``"rolling"``
        (FedRolex's window, :func:`strategies.engine.submodel_math.unit_indices`).
    width_spec : WidthSpec or mapping, optional
        Which axes of which parameters hold which hidden units
        (:class:`strategies.engine.submodel_math.WidthSpec`, or ``task.models.width_spec``'s
        plain tuples). fedhetero's ServerApp gives it from the model it measured; a library
        user passes it here.
    levels : sequence of float
        The widths a client can get (default 1, 1/2, 1/4, 1/8, 1/16: HeteroFL's levels).
    width_rule : str, optional
        ``"deadline"``, ``"fixed"`` or ``"dynamic"`` (:class:`WidthRule`); default
        ``"deadline"`` with a ``round_deadline``, else ``"fixed"``.
    level_compute : mapping, optional
        Per level, the sub-model's training FLOPs per example over the full model's (the
        clock's compute share); default: its parameter count over the full model's.
    scaler : bool
        Ask the clients for HeteroFL's Scaler (``width-scaler``).
    label_split : bool
        HeteroFL's label split, as the authors' code (and FedRolex's) runs it: ask each
        client to train with the masked cross-entropy of the labels of its own data
        (``label-split`` = True) and to reply them (``label-mask``, one 0/1 entry per
        class); each output-layer row is averaged over the clients holding its label
        (:func:`strategies.engine.submodel_math.label_rows`; the output layer is the
        parameters whose first axis the width spec leaves unscaled,
        :func:`strategies.engine.submodel_math.output_layer`). False: every client trains
        the plain cross-entropy and holds every row of its sub-model.
    """

    def __init__(self, scheme: str = "static", *, width_spec=None,
                 levels: Sequence[float] = DEFAULT_LEVELS, width_rule: str | None = None,
                 level_compute: Mapping[float, float] | None = None,
                 scaler: bool = False, label_split: bool = False) -> None:
        check_choice("scheme", scheme, SCHEMES)
        if not isinstance(scaler, bool):
            raise ValueError(f"scaler={scaler!r} must be True or False")
        if not isinstance(label_split, bool):
            raise ValueError(f"label_split={label_split!r} must be True (the authors' label "
                             f"split) or False (every client holds every output row)")
        self.scheme, self.scaler, self.rule_name = scheme, scaler, width_rule
        self.label_split = label_split
        self.output_keys: tuple[str, ...] = ()  # the output layer (describe, label split)
        self.num_classes = 0
        self.levels = levels
        self.rule: WidthRule | None = None
        self.spec = None if width_spec is None else (
            width_spec if isinstance(width_spec, submodel_math.WidthSpec)
            else width_spec_of(width_spec))
        self.level_compute = level_compute
        self.level_bytes: dict[float, int] = {}
        self.level_params: dict[float, int] = {}
        self.participation: Participation | None = None
        self.owner = "HeteroFL"
        self.warned_no_partition = False  # warn_no_partition, once per run
        self.widths: dict[int, float] = {}  # one round's widths by node (a memo of the rule)
        self.widths_round = 0

    def bind(self, participation: Participation, owner: str) -> None:
        """Join the engine's participation model (the rule's seed and clock)."""
        self.participation, self.owner = participation, owner
        timer, name = participation.timer, self.rule_name
        if name is None:
            name = "deadline" if timer is not None and timer.deadline is not None else "fixed"
        if name == "deadline" and (timer is None or timer.deadline is None):
            raise ValueError(f"{owner}: width_rule='deadline' picks the largest width that fits "
                             f"the round deadline on the simulated clock: pass "
                             f"clock=SimClock(...) and round_deadline=D, or width_rule='fixed'")
        self.rule = WidthRule(name, self.levels, participation.seed)
        if self.level_compute is not None:
            shares = {float(k): float(v) for k, v in self.level_compute.items()}
            missing = [r for r in self.rule.levels if r not in shares]
            bad = {r: v for r, v in shares.items() if not (math.isfinite(v) and v > 0)}
            if missing or bad:
                raise ValueError(f"level_compute needs a finite share > 0 for every level "
                                 f"{list(self.rule.levels)}: missing {missing}, bad {bad}")
            self.level_compute = shares

    def summary_line(self, weighting: str) -> str:
        """The widths' configuration, for the engine's summary."""
        return (f"Widths {', '.join(f'{r:g}' for r in self.rule.levels)}, rule "
                f"'{self.rule.name}', sub-models '{self.scheme}', weighting {weighting}"
                f"{', Scaler' if self.scaler else ''}"
                f"{', label split' if self.label_split else ''}")

    # ------------------------------------------------------------------ widths
    def width_of(self, node_id: int, config: ConfigRecord, work) -> float:
        """r_k of node ``node_id`` this round (:class:`WidthRule`); chosen once per round."""
        server_round = int(config.get(C.SERVER_ROUND, 0))
        if server_round != self.widths_round:
            self.widths, self.widths_round = {}, server_round
        if node_id not in self.widths:
            self.widths[node_id] = self.choose_width(server_round, node_id, config, work)
        return self.widths[node_id]

    def warn_no_partition(self, node_id: int) -> None:
        """One WARNING per run: a node without a partition id trains the largest level."""
        if self.warned_no_partition:
            return
        self.warned_no_partition = True
        log(WARNING, "%s: node %d has no partition id (the client-info query is off or it did "
            "not answer), so width rule '%s' gives it the largest level, %g, as every such "
            "node: register strategies.client.client_info_reply in the ClientApp's "
            "@app.query() and keep query_client_info=True (the width strategies' default)",
            self.owner, node_id, self.rule.name, self.rule.levels[0])

    def choose_width(self, server_round: int, node_id: int, config: ConfigRecord,
                     work) -> float:
        """The rule's width for one node (partition id from the client-info query; a node
        without one gets the largest level under "fixed" / "dynamic")."""
        rule, participation = self.rule, self.participation
        if rule.name != "deadline":
            pid = participation.info(node_id).partition_id
            if pid is None:
                self.warn_no_partition(node_id)
                return rule.levels[0]
            return rule.fixed(pid) if rule.name == "fixed" else rule.dynamic(server_round, pid)
        timer, pid = participation.timer, participation.partition_of(node_id)
        steps = work.full_local_steps(node_id, config)
        per_step = work.examples_per_step(node_id, config)
        for level in rule.levels:
            size = self.level_bytes[level]
            seconds = timer.client_seconds(pid, steps, per_step, size, size,
                                           work.extra_examples(node_id, config),
                                           self.compute_share(level))
            if seconds <= timer.deadline * (1 + 1e-9):
                return level
        return rule.levels[-1]

    def compute_share(self, level: float) -> float:
        """A width's training cost per example over the full model's (``level_compute``,
        else the parameter-count ratio)."""
        if self.level_compute is not None:
            return self.level_compute[level]
        return self.level_params[level] / self.level_params[1.0]

    def model_share(self, node_id: int, config: ConfigRecord, work) -> ModelShare:
        """The clock's view of a client: its sub-model's compute share and bytes."""
        level = self.width_of(node_id, config, work)
        size = self.level_bytes[level]
        return ModelShare(self.compute_share(level), size, size)

    def describe(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Each level's sub-model bytes and parameter count, and with the label split the
        output layer and its number of classes, once (the shapes do not change)."""
        if self.level_bytes:
            return
        if self.spec is None:
            raise ValueError(f"{self.owner} needs your model's width spec: pass "
                             f"width_spec={{parameter name: per axis None or (hidden dimension, "
                             f"repeat)}} (docs/strategies/width.md, 'The change to the "
                             f"template', has the one of Flower's template Net; fedhetero's own "
                             f"models: task.models.width_spec(name, input_shape, num_classes))")
        shapes = {k: tuple(v.shape) for k, v in arrays.items()}
        if self.label_split:
            self.output_keys, self.num_classes = submodel_math.output_layer(self.spec, shapes)
        for level in (*self.rule.levels, 1.0):
            indices = submodel_math.submodel_indices(self.spec, shapes, "static", level)
            sizes = {k: math.prod(shapes[k][a] if isinstance(ix, slice) else len(ix)
                                  for a, ix in enumerate(index))
                     for k, index in indices.items()}
            self.level_bytes[level] = sum(sizes[k] * arrays[k].itemsize for k in sizes)
            self.level_params[level] = sum(sizes[k] for k in sizes
                                           if np.issubdtype(arrays[k].dtype, np.floating))

    # ------------------------------------------------------------------ a round
    def task_keys(self, node_id: int, config: ConfigRecord, work) -> dict[str, object]:
        """A task's ``model-width`` (and ``width-scaler``, ``label-split`` when on)."""
        keys: dict[str, object] = {C.MODEL_WIDTH: self.width_of(node_id, config, work)}
        if self.scaler:
            keys[C.WIDTH_SCALER] = True
        if self.label_split:
            keys[C.LABEL_SPLIT] = True
        return keys

    def attach(self, plan: RoundPlan, messages: list[Message]
               ) -> dict[int, tuple[submodel_math.Indices, dict[str, np.ndarray]]]:
        """Each message carries its client's sub-model W_k instead of W (one extraction per
        width); the round's widths go to its report. Returns what each node was sent."""
        global_arrays = records.to_numpy(plan.arrays)
        shapes = {k: tuple(v.shape) for k, v in global_arrays.items()}
        by_level: dict[float, tuple] = {}
        widths: dict[str, float] = {}
        sent = {}
        for msg in messages:
            node = msg.metadata.dst_node_id
            level = float(msg.content[C.CONFIG][C.MODEL_WIDTH])
            if level not in by_level:
                indices = submodel_math.submodel_indices(
                    self.spec, shapes, self.scheme, level, plan.server_round - 1)
                sub = submodel_math.extract(global_arrays, indices)
                by_level[level] = (indices, sub, records.to_record(sub))
            indices, sub, record = by_level[level]
            msg.content[C.ARRAYS] = record
            sent[node] = (indices, sub)
            widths[self.participation.client_key(node)] = level
        counts = {f"{r:g}": sum(1 for w in widths.values() if w == r) for r in self.rule.levels}
        plan.report.add(WidthSection(self.rule.name, widths, counts))
        return sent

    def gap(self, plan: RoundPlan, reply: Message) -> str | None:
        """A reply whose arrays do not have the shapes of the sub-model sent: the ClientApp
        did not build its model at ``model-width``."""
        sent = (plan.sub_models or {}).get(reply.metadata.src_node_id)
        arrays = reply.content.get(C.ARRAYS)
        if sent is None or not hasattr(arrays, "items"):
            return None
        for key, array in arrays.items():
            if key in sent[1] and tuple(array.shape) != sent[1][key].shape:
                return (f"'{C.ARRAYS}' with the shapes of the sub-model it was sent ('{key}' "
                        f"came back {tuple(array.shape)}, sent {sent[1][key].shape}: build the "
                        f"model at the config's '{C.MODEL_WIDTH}')")
        return None

    def label_problem(self, reply: Message) -> str | None:
        """With the label split, why a reply's ``label-mask`` does not fit the update it
        came with (not a list of 0/1 ints, not one entry per class, no label), else None."""
        return self.labels(reply)[1] if self.label_split else None

    def labels(self, reply: Message) -> tuple[np.ndarray | None, str | None]:
        """(the labels a reply's ``label-mask`` claims, as ascending row indices; None) or
        (None, why the mask is refused: the key, the value and the fix)."""
        metrics = reply.content.get(C.METRICS)
        value = metrics.get(C.LABEL_MASK) if hasattr(metrics, "get") else None
        classes, key = self.num_classes, (self.output_keys or ("the output layer",))[0]
        fix = (f"send one 0/1 entry per class ({classes}, the rows of '{key}'), 1 for each "
               f"label in the client's training data, at least one "
               f"(strategies.client.width.label_mask(y, {classes}))")
        if value is None:
            return None, f"needs the metric '{C.LABEL_MASK}' (label split): {fix}"
        shown = shown_value(value)
        if not isinstance(value, list) or not all(
                isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                for v in value):
            return None, f"metric '{C.LABEL_MASK}'={shown} is not a list of ints: {fix}"
        if len(value) != classes:
            return None, (f"metric '{C.LABEL_MASK}'={shown} has {len(value)} entries, not one "
                          f"per class: {fix}")
        if any(v not in (0, 1) for v in value):
            return None, f"metric '{C.LABEL_MASK}'={shown} has entries other than 0 and 1: {fix}"
        labels = np.flatnonzero(np.asarray(value, dtype=np.int64))
        if labels.size == 0:
            return None, f"metric '{C.LABEL_MASK}'={shown} claims no label: {fix}"
        return labels, None

    def held(self, plan: RoundPlan, reply: Message, model: Mapping[str, np.ndarray]
             ) -> tuple[submodel_math.Indices, Mapping[str, np.ndarray]]:
        """What a reply's client holds of W: the indices of the sub-model it was sent and
        its arrays, with the label split only the output rows of its labels
        (:func:`strategies.engine.submodel_math.label_rows`).

        Raises
        ------
        ValueError
            With the label split, when the reply's ``label-mask`` is refused
            (:meth:`labels`).
        """
        indices = plan.sub_models[reply.metadata.src_node_id][0]
        if not self.label_split:
            return indices, model
        labels, problem = self.labels(reply)
        if problem is not None:
            raise ValueError(problem)
        return submodel_math.label_rows(indices, model, self.output_keys, labels)

    def average(self, plan: RoundPlan, global_arrays: Mapping[str, np.ndarray],
                replies: list[Message], models: list[tuple[int, Mapping[str, np.ndarray]]],
                weights: list[float] | None, server_lr: float
                ) -> tuple[dict[str, np.ndarray] | None, list[int]]:
        """W_{t+1} by :func:`strategies.engine.submodel_math.overlap_aggregate` over what
        each reply's client holds (:meth:`held`) for the replies whose arrays are finite and,
        with the label split, whose labels fit (one log line per other), then w + eta_g
        (W_{t+1} - w); ``weights`` the replies' example counts (None: each holder counts
        once)."""
        updates, used = [], []
        for k, model in models:
            node = replies[k].metadata.src_node_id
            bad = trust_gate.non_finite_key(model)
            if bad is not None:
                log(WARNING, "Reply from node %d rejected: array '%s' has NaN or Inf", node, bad)
                continue
            try:
                indices, held = self.held(plan, replies[k], model)
            except ValueError as exc:
                log(WARNING, "Reply from node %d rejected: %s", node, exc)
                continue
            updates.append((indices, held, None if weights is None else weights[k]))
            used.append(k)
        if not updates:
            return None, []
        new = submodel_math.overlap_aggregate(global_arrays, updates)
        if server_lr != 1.0:
            new = {k: (w + server_lr * (new[k].astype(np.float64) - w)).astype(w.dtype)
                   if np.issubdtype(w.dtype, np.floating) else new[k]
                   for k, w in global_arrays.items()}
        return new, used


def shown_value(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a client's list may be long)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 5]}...{text[-2:]}"


def parse_levels(value: str) -> tuple[float, ...]:
    """``width-levels`` as numbers: comma-separated, each in (0, 1], at least one."""
    try:
        levels = tuple(float(part) for part in value.split(","))
    except ValueError:
        raise ValueError("not comma-separated numbers, e.g. \"1,0.5,0.25\"") from None
    if not all(0.0 < level <= 1.0 for level in levels):
        raise ValueError("every width must be in (0, 1]")
    return levels


def scaler_switch(value: str) -> bool:
    """``width-scaler`` 'on' / 'off' as the Scaler switch (ValueError for anything else)."""
    if value not in ("on", "off"):
        raise ValueError(f"width-scaler={value!r}: use 'auto', 'on' or 'off'")
    return value == "on"


SUBMODEL_KEYS = (
    Key("width-levels", "1,0.5,0.25,0.125,0.0625",
        "the widths r a client of `heterofl`, `fjord` or `fedrolex` can train, comma-separated "
        "(HeteroFL's 1, 1/2, ..., 1/16); each client's model keeps ⌈r·K⌉ units of every hidden "
        "layer", check=parse_levels, note="(numbers in (0, 1])", arg="levels",
        convert=parse_levels),
    Key("width-rule", "auto",
        "how a client's width is chosen: `deadline` (the largest level whose time on the "
        "simulated clock, with its own sub-model's bytes and FLOPs, fits `round-deadline`), "
        "`fixed` (partition p trains level p mod L), `dynamic` (a fresh draw per round); `auto` "
        "= `deadline` with a `round-deadline`, else `fixed`",
        choices=("auto", *WIDTH_RULES), arg="width_rule", auto="auto"),
    Key("width-scaler", "auto",
        "HeteroFL's Scaler (outputs divided by r in training): `on`, `off`; `auto` = on for "
        "`heterofl`, off for `fjord` and `fedrolex`", choices=("auto", "on", "off"),
        arg="scaler", auto="auto", convert=lambda value: scaler_switch(value)),
)
"""The run-config keys of the sub-models (declared here, beside what reads them)."""

