"""The command-line tools' ``--help`` layout, shared by ``fedhetero``, ``python -m
simulation`` and ``python -m deploy``."""

from __future__ import annotations

import argparse
import copy
import re

ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|obj|exc):`~?([^`]+)`")
LITERAL = re.compile(r"``([^`]+)``")


def plain(text: str | None) -> str | None:
    """``text`` (a docstring) without reStructuredText markup: ``x`` and :role:`x` as x
    (a ``~`` role shows its last name, as Sphinx does)."""
    if not text:
        return text
    text = ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1] if m.group(0).count("~") else
                    m.group(1), text)
    return LITERAL.sub(r"\1", text)


def help_with_default(action: argparse.Action) -> str | None:
    """``action``'s help followed by ``(default: ...)``, unless the help already names its
    default or there is none to name (a positional, a flag, an empty list, no default)."""
    text, default = plain(action.help), action.default
    if (text == argparse.SUPPRESS or not action.option_strings or "default" in (text or "")
            or isinstance(default, bool) or default in (None, "", [], argparse.SUPPRESS)):
        return text
    shown = (" ".join(str(item).replace("%", "%%") for item in default)
             if isinstance(default, list | tuple) else "%(default)s")
    return f"{text or ''} (default: {shown})".lstrip()


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (their lists and examples keep their lines) and every
    option's default in its help (:func:`help_with_default`), also where the option has no
    help text of its own (argparse's ``ArgumentDefaultsHelpFormatter`` shows none there)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return super()._fill_text(plain(text), width, indent)

    def add_argument(self, action: argparse.Action) -> None:
        shown = copy.copy(action)  # the parser's own action keeps its help
        shown.help = help_with_default(action)
        super().add_argument(shown)
