"""``fedhetero keys [--strategy NAME]``: the run-config keys (all of them, or those the app
and strategy NAME read), each with its default, what it accepts and its doc; the
full table is docs/config.md."""

from __future__ import annotations

import argparse
import re
import textwrap

from fedapp.config import toml_value
from fedapp.config_keys import ALL, APP, KEYS, Key


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


def run(args: argparse.Namespace) -> int:
    keys = [k for k in KEYS
            if args.strategy is None or APP in k.used_by or args.strategy in k.used_by]
    for key in keys:
        print(f"{key.name} = {toml_value(key.default)}    ({allowed(key, args.strategy)})")
        print(textwrap.fill(plain(key.doc), width=96, initial_indent="    ",
                            subsequent_indent="    "))
    said = f" read with strategy={args.strategy}" if args.strategy else ""
    print(f"\n{len(keys)} keys{said}; set one with: fedhetero run -c KEY=VALUE "
          "(flwr run . --run-config \"KEY=VALUE\")")
    return 0
