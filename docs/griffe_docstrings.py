"""A Griffe extension for the API reference (mkdocs.yml, mkdocstrings' python handler).

The strategies' docstrings are numpy style with Sphinx roles; two things in them would
render wrongly on the API page, so this extension rewrites each docstring's text before
it is parsed (the source files are untouched):

* numpy lets one Parameters entry document several names (``lr, batch_size``, or
  ``exploration, exploration_decay, exploration_min : float``); Griffe gives every name
  of such an entry the first name's annotation and default (the page would show
  ``weighted_by_key: int = 1``). Each grouped entry is split into one entry per name,
  with the same description and without the shared type, so that each name gets its own
  annotation and default from the signature.
* Sphinx roles (``:class:`FedAvg```, ``:func:`~strategies.client.local_sgd```) become
  Markdown code (``FedAvg``, ``local_sgd``);
* a reStructuredText simple table (rows between ``=====  =====`` borders, as in
  ``strategies.client``'s overview) is shown as it is written, in a text block.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_GROUP = re.compile(r"^(\w+(?:, \w+)+)(?: : .*)?$")
_BORDER = re.compile(r"^=+( +=+)+$")
_ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc|obj|const|ref):`(~?)([^`]+)`")


def split_grouped_parameters(text: str) -> str:
    """``text`` (a cleaned numpy docstring) with every grouped Parameters entry split."""
    lines = text.split("\n")
    out: list[str] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if i + 1 < len(lines) and re.fullmatch(r"-{3,}", lines[i + 1]) and line.strip():
            section = line.strip()
        match = _GROUP.match(line) if section == "Parameters" else None
        if not match:
            out.append(line)
            i += 1
            continue
        body = []
        i += 1
        while i < len(lines) and (lines[i].startswith(" ") or not lines[i].strip()):
            if not lines[i].strip() and (i + 1 >= len(lines) or not lines[i + 1].startswith(" ")):
                break
            body.append(lines[i])
            i += 1
        for name in match.group(1).split(", "):
            out += [name, *body]
    return "\n".join(out)


def roles_to_code(text: str) -> str:
    """``:class:`X``` -> ```X```; ``:func:`~a.b.c``` -> ```c```."""
    return _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`",
                     text)


def tables_as_text(text: str) -> str:
    """Every reStructuredText simple table (three border lines) in a fenced text block."""
    lines = text.split("\n")
    borders = [i for i, line in enumerate(lines) if _BORDER.match(line)]
    for first, last in reversed(list(zip(borders[0::3], borders[2::3]))):
        lines[first:last + 1] = ["```text", *lines[first:last + 1], "```"]
    return "\n".join(lines)


class NumpyDocstrings(Extension):
    """Rewrite every docstring's text (module docstring) before it is parsed."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:  # noqa: D102
        if obj.docstring is not None:
            text = split_grouped_parameters(obj.docstring.value)
            obj.docstring.value = tables_as_text(roles_to_code(text))
