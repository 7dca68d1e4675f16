"""The caveat of a report that compares asynchronous strategies (FedBuff, FedAsync) with
synchronous ones: an asynchronous "round" is one server update (FedBuff: a buffer of K
client updates; FedAsync: ``fedasync-updates-per-round`` of them), not a round of all the
selected clients, so rounds-to-target do not compare; simulated time and data do."""

from __future__ import annotations

from collections.abc import Mapping

from fedapp.config_keys import ASYNC

ROUND_MARK = "†"  # on the report's "rounds" columns when the caveat applies


def is_async(config: Mapping) -> bool:
    """Whether a run config's strategy is asynchronous."""
    return config.get("strategy") in ASYNC


def mixes_async(configs: Mapping[str, Mapping]) -> bool:
    """Whether the variants (their run configs) mix asynchronous and synchronous strategies
    (variants without a known strategy count as neither)."""
    known = [c for c in configs.values() if c.get("strategy")]
    return any(is_async(c) for c in known) and not all(is_async(c) for c in known)


def server_updates(configs: Mapping[str, Mapping]) -> str:
    """What one "round" of each asynchronous strategy among the variants is: "fedbuff: a
    buffer of K=10 client updates (fedbuff-buffer-size); fedasync: ..."."""
    sizes = {"fedbuff": [], "fedasync": []}
    for config in configs.values():
        key = "fedbuff-buffer-size" if config.get("strategy") == "fedbuff" else \
            "fedasync-updates-per-round"
        if is_async(config) and config.get(key) not in sizes[config["strategy"]]:
            sizes[config["strategy"]].append(config.get(key, "?"))
    parts = []
    if sizes["fedbuff"]:
        parts.append("fedbuff: a buffer of " + " or ".join(f"K={k}" for k in sizes["fedbuff"])
                     + " client updates (fedbuff-buffer-size)")
    if sizes["fedasync"]:
        parts.append("fedasync: " + " or ".join(map(str, sizes["fedasync"]))
                     + " client updates (fedasync-updates-per-round)")
    return "; ".join(parts)


def caveat(configs: Mapping[str, Mapping], clock: bool) -> str:
    """The note above the report's tables (empty when nothing is mixed)."""
    if not mixes_async(configs):
        return ""
    better = ("simulated time (the \"sim\" columns, accuracy_vs_sim_time.png) or data "
              "transferred (the \"MB\" columns, accuracy_vs_bytes.png)" if clock else
              "data transferred (the \"MB\" columns, accuracy_vs_bytes.png)")
    return (f"{ROUND_MARK} Asynchronous and synchronous strategies are compared here. An "
            "asynchronous \"round\" is one server update, not a round of all the selected "
            f"clients ({server_updates(configs)}), so rounds to target do not compare across "
            f"the two: compare them on {better}, or on the client updates until the target "
            "(below).\n\n")


def round_axis(configs: Mapping[str, Mapping]) -> tuple[str, str]:
    """(x-axis label, figure title) of an accuracy-vs-round plot of these variants."""
    if not mixes_async(configs):
        return "round", ""
    return ("round (asynchronous strategies: one server update)",
            "An asynchronous \"round\" is a server update, not a round of all selected "
            "clients: compare on simulated time or data")
