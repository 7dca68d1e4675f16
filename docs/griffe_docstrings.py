"""A Griffe extension for the API reference (mkdocs.yml, mkdocstrings' python handler).

The strategies' docstrings are numpy style with Sphinx roles; some things in them would
render wrongly on the API page, so this extension rewrites each docstring's text before
it is parsed and tidies the parsed parameters (the source files are untouched):

* numpy lets one Parameters entry document several names (``lr, batch_size``, or
  ``exploration, exploration_decay, exploration_min : float``); Griffe would give every
  name of such an entry the first name's annotation and default (the page would show
  ``weighted_by_key: int = 1``), and repeat the one description under each name. Such an
  entry stays one entry on the page: the names together, one description, the type they
  share, and each name's own default from the signature (``name=default, ...`` when they
  differ);
* a default that is a module constant (``C.NUM_EXAMPLES``, ``N_ENS``) shows its value
  (``'num-examples'``, ``10``) when the constant is a literal;
* Sphinx roles (``:class:`FedAvg```, ``:func:`~strategies.client.local_sgd```) become
  Markdown code (``FedAvg``, ``local_sgd``);
* a reStructuredText simple table (rows between ``=====  =====`` borders, as in
  ``strategies.client``'s overview) is shown as it is written, in a text block.

Griffe reads the sources without importing them: building the site needs neither the
package's dependencies nor torch.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

from griffe import (
    Docstring,
    DocstringParameter,
    DocstringSection,
    DocstringSectionKind,
    Expr,
    ExprAttribute,
    ExprName,
    Extension,
    Object,
)

_GROUP = re.compile(r"^(\w+(?:, \w+)+)(?: : .*)?$")
_BORDER = re.compile(r"^=+( +=+)+$")
_ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc|obj|const|ref):`(~?)([^`]+)`")


def split_grouped_parameters(text: str) -> tuple[str, list[tuple[str, ...]]]:
    """``text`` (a cleaned numpy docstring) with every grouped Parameters entry split into
    one entry per name (so that Griffe takes each name's annotation and default from the
    signature), and the groups' names, for :func:`merge_groups`."""
    lines = text.split("\n")
    out: list[str] = []
    groups: list[tuple[str, ...]] = []
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
        names = tuple(match.group(1).split(", "))
        groups.append(names)
        kind = line[len(match.group(1)):]  # " : float" or ""
        for name in names:
            out += [name + kind, *body]
    return "\n".join(out), groups


def _text(value: str | Expr | None) -> str:
    return "" if value is None else str(value)


def literal_default(value: str | Expr | None, obj: Object) -> str | Expr | None:
    """A constant's literal value in place of its name (``C.NUM_EXAMPLES`` ->
    ``'num-examples'``); anything else as it is."""
    if not isinstance(value, (ExprName, ExprAttribute)):
        return value
    try:
        target = obj.modules_collection[value.canonical_path]
        while target.is_alias:
            target = target.final_target
        if not target.is_attribute or target.value is None:
            return value
        source = str(target.value)
        ast.literal_eval(source)
    except Exception:  # noqa: BLE001 - unresolvable or not a literal: the name stays
        return value
    return source


def merge_groups(parameters: list[DocstringParameter], groups: Sequence[tuple[str, ...]],
                 obj: Object) -> list[DocstringParameter]:
    """The split entries of each group as one entry again (module docstring)."""
    merged: list[DocstringParameter] = []
    i = 0
    while i < len(parameters):
        names = next((g for g in groups if tuple(p.name for p in parameters[i:i + len(g)])
                      == g), None)
        if names is None:
            parameter = parameters[i]
            parameter.value = (None if parameter.name.startswith("*")  # **kwargs: no "{}"
                               else literal_default(parameter.value, obj))
            merged.append(parameter)
            i += 1
            continue
        run = parameters[i:i + len(names)]
        i += len(names)
        annotations = {_text(p.annotation) for p in run}
        annotation = run[0].annotation if len(annotations) == 1 and "" not in annotations \
            else None
        defaults = [literal_default(p.value, obj) for p in run]
        if len({_text(d) for d in defaults}) == 1:
            default: str | Expr | None = defaults[0]
        else:
            default = ", ".join(f"{p.name}={_text(d)}" for p, d in zip(run, defaults)
                                if d is not None)
        merged.append(DocstringParameter(", ".join(names), annotation=annotation,
                                         value=default or None,
                                         description=run[0].description))
    return merged


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


class TidyDocstring(Docstring):
    """A docstring whose parsed Parameters have their groups merged and constants' values
    (module docstring). Parsed when the page renders the object, as any docstring."""

    groups: tuple[tuple[str, ...], ...] = ()

    def parse(self, parser: Any = None, **options: Any) -> list[DocstringSection]:  # noqa: D102
        sections = super().parse(parser, **options)
        for section in sections:
            if section.kind is DocstringSectionKind.parameters and self.parent is not None:
                section.value = merge_groups(section.value, self.groups, self.parent)
        return sections


class NumpyDocstrings(Extension):
    """Rewrite every docstring's text; its Parameters are tidied when parsed (module
    docstring)."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:  # noqa: D102
        docstring = obj.docstring
        if docstring is None:
            return
        text, groups = split_grouped_parameters(docstring.value)
        docstring.value = tables_as_text(roles_to_code(text))
        docstring.__class__ = TidyDocstring
        docstring.groups = tuple(groups)
