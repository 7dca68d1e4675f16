"""``fedhetero keys [--strategy NAME]``: the run-config keys, each with its default, what it
accepts and its doc; with ``--strategy NAME`` the keys NAME reads: its own in full, those it
shares with other strategies one line each, and the names of the app's keys (every run
reads them; ``fedhetero keys`` shows them in full). The full table is docs/config.md."""

from __future__ import annotations

import argparse
import re
import textwrap

from fedapp.config import toml_value
from fedapp.config_keys import ALL, APP, KEYS, Key
from strategies.engine.registry import registered


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strategy", choices=ALL, metavar="NAME",
                   help="only the keys the app and this strategy read (fedhetero strategies "
                        "lists the names)")


def plain(doc: str) -> str:
    """The doc as plain text: Markdown links reduced to their text, no backticks."""
    return re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", doc).replace("`", "")


def allowed(key: Key, strategy: str | None) -> str:
    said = key.allowed() if key.type is not bool else "true or false"
    for only in key.only:
        if strategy is None or strategy in only.strategies:
            values = " or ".join(toml_value(v) for v in only.values)
            said += f"; with {strategy or ', '.join(only.strategies)}: {values}"
    return said


def print_in_full(keys: list[Key], strategy: str | None) -> None:
    for key in keys:
        print(f"{key.name} = {toml_value(key.default)}    ({allowed(key, strategy)})")
        print(textwrap.fill(plain(key.doc), width=96, initial_indent="    ",
                            subsequent_indent="    "))


def run(args: argparse.Namespace) -> int:
    footer = "set one with: fedhetero run -c KEY=VALUE (flwr run . --run-config \"KEY=VALUE\")"
    if args.strategy is None:
        print_in_full(list(KEYS), None)
        print(f"\n{len(KEYS)} keys; {footer}")
        return 0
    strategy = args.strategy
    declared = {key.name for key in registered()[strategy].keys}
    own = [k for k in KEYS if k.name in declared]
    shared = [k for k in KEYS if strategy in k.used_by and APP not in k.used_by
              and k.name not in declared]
    app = [k for k in KEYS if APP in k.used_by]
    print(f"# {strategy}'s own keys" if own else f"# {strategy} has no keys of its own")
    print_in_full(own, strategy)
    if shared:
        print(f"\n# keys {strategy} shares with other strategies (fedhetero keys: their docs)")
        for key in shared:
            print(f"{key.name} = {toml_value(key.default)}    ({allowed(key, strategy)})")
    print(f"\n# the app's {len(app)} keys, read whatever the strategy (fedhetero keys: their "
          "docs)")
    print(textwrap.fill(", ".join(k.name for k in app), width=96, break_on_hyphens=False))
    print(f"\n{len(own) + len(shared) + len(app)} keys read with strategy={strategy}; {footer}")
    return 0
