"""Every documented user change is executed: README.md, docs/**/*.md, examples/*/README.md.

A fenced ``python`` block preceded by ``<!-- exec: KIND STRATEGY [nodes=N] -->`` runs in
the flat user project of tests/user_project.py:

* ``client-train``: the block replaces the template ClientApp's ``@app.train()`` handler;
* ``client-query``: the block is the ClientApp's ``@app.query()`` handler;
* ``server``: the block is the body of the ServerApp's ``@app.main()``, with ``grid``,
  ``context``, ``initial_arrays`` (= ``arrays``) and ``num_rounds`` defined; the ClientApp
  is the one with every helper.

The client blocks of one file and strategy run together, against the project's ServerApp
(which then asks the client-info query only when a query block is given) and must learn.
A ``python`` or ``diff`` block preceded by ``<!-- checked: PATH -->`` must have each of its
added lines (``+``; every line of a python block) in PATH, a file that a test runs. Any
other block that uses ``strategies`` fails the check below.
"""

from __future__ import annotations

import re
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

from tests import user_project

REPO = user_project.REPO
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("**/*.md"),
               *(REPO / "examples").glob("*/README.md")])
FENCE = re.compile(r"(?:<!--\s*(exec|checked):\s*([^>]*?)\s*-->\s*\n)?```(\w*)\n(.*?)```", re.S)


def blocks(path: Path) -> list[tuple[str | None, str, str, str]]:
    """(marker kind, marker args, language, code) of every fenced block of a file."""
    return [(m.group(1), m.group(2) or "", m.group(3), m.group(4))
            for m in FENCE.finditer(path.read_text())]


def exec_blocks() -> dict[tuple[str, str, int], dict[str, str]]:
    """{(file, strategy, nodes): {kind: code}} of every exec-marked block."""
    found: dict[tuple[str, str, int], dict[str, str]] = defaultdict(dict)
    for path in DOCS:
        for marker, args, _, code in blocks(path):
            if marker != "exec":
                continue
            kind, strategy, *rest = args.split()
            nodes = int(dict(r.split("=") for r in rest)
                        .get("nodes", user_project.QUICKSTART_SUPERNODES))
            group = (str(path.relative_to(REPO)), strategy,
                     nodes if kind == "server" else user_project.QUICKSTART_SUPERNODES)
            assert kind not in found[group], f"two {kind} blocks for {group}"
            found[group][kind] = code
    return dict(found)


EXEC = exec_blocks()
CLIENT_KINDS = {"client-train", "client-query"}
CLIENT_GROUPS = sorted(g for g, kinds in EXEC.items() if set(kinds) & CLIENT_KINDS)
SERVER_GROUPS = sorted(g for g, kinds in EXEC.items() if "server" in kinds)


def server_main(body: str) -> str:
    return ('\n@app.main()\ndef main(grid: Grid, context: Context) -> None:\n'
            '    initial_arrays = arrays = ArrayRecord(Net().state_dict())\n'
            '    num_rounds = context.run_config["num-server-rounds"]\n'
            '    central_evaluate(0, initial_arrays)\n'
            + textwrap.indent(body, "    ") + '    write_summary(context)\n')


ACCURACY_MARGIN = 0.02  # a snippet's accuracy after 3 rounds >= Flower's FedAvg's - 2 points
# ... but for two algorithms that measurably cannot in 3 rounds (their pages give the numbers):
MARGINS = {"feddyn": 0.16,  # docs/strategies/feddyn.md: Algorithm 1's doubled first step
           # (0.639 after round 3 against FedAvg's 0.755; 0.823 against 0.827 after round 8;
           # on an AVX-512 CPU, whose rounding moves the unstable first rounds, 0.617 against
           # 0.761)
           # docs/strategies/width.md: one of the two clients trains half the model (0.735,
           # FjORD 0.701, against 0.755 when measured); FjORD's full-width client too half
           # of its steps
           "heterofl": 0.05, "fjord": 0.10}
FEDVECA_FLOOR = 0.45  # alpha 0.8, tau plain-SGD steps (eq. 1), chance 0.10: docs/strategies/fedveca.md


@pytest.fixture(scope="module")
def flower_fedavg_accuracy(tmp_path_factory) -> float:
    """Accuracy after 3 rounds of Flower's own FedAvg with the quickstart's stock ClientApp
    (SGD momentum 0.9, lr 0.01, batch 32, 1 local epoch) on the same project and seed."""
    project = user_project.build(tmp_path_factory.mktemp("baseline") / "userproj",
                                 train=user_project.CLIENT_SECTIONS["train"], query="")
    summary = user_project.run_inprocess(project, {"strategy": "flower-fedavg",
                                                   "query-client-info": False})
    return summary["history"][-1]["accuracy"]


@pytest.mark.parametrize("group", CLIENT_GROUPS, ids=lambda g: f"{g[0]}:{g[1]}")
@pytest.mark.usefixtures("processes")
def test_documented_client_change_runs_and_learns(tmp_path, group, flower_fedavg_accuracy):
    """Each client snippet, pasted verbatim into the quickstart-shaped ClientApp, trains 3
    rounds to at least Flower's FedAvg's accuracy minus two points."""
    source, strategy, nodes = group
    kinds = EXEC[group]
    project = user_project.build(
        tmp_path / "userproj",
        train=kinds.get("client-train", user_project.CLIENT_SECTIONS["train"]),
        query=kinds.get("client-query", ""))
    summary = user_project.run_inprocess(
        project, {"strategy": strategy, "query-client-info": "client-query" in kinds}, nodes)
    output = summary["output"]
    assert "Traceback" not in output and "ClientApp error" not in output, output[-4000:]
    assert "rejected" not in output, output[-4000:]
    history = summary["history"]
    assert [h["round"] for h in history] == [0, 1, 2, 3]
    accuracy = history[-1]["accuracy"]
    floor = (FEDVECA_FLOOR if strategy == "fedveca"
             else flower_fedavg_accuracy - MARGINS.get(strategy, ACCURACY_MARGIN))
    assert accuracy >= floor, (f"{source} ({strategy}): accuracy {accuracy:.3f} after 3 rounds, "
                               f"Flower's FedAvg {flower_fedavg_accuracy:.3f}: {history}")


@pytest.mark.parametrize("group", SERVER_GROUPS, ids=lambda g: f"{g[0]}:{g[1]}")
@pytest.mark.usefixtures("processes")
def test_documented_server_change_runs(tmp_path, group):
    source, strategy, nodes = group
    project = user_project.build(tmp_path / "userproj",
                                 server_main=server_main(EXEC[group]["server"]))
    summary = user_project.run_inprocess(project, {"strategy": strategy}, nodes)
    output = summary["output"]
    assert "Traceback" not in output and "ClientApp error" not in output, output[-4000:]
    assert summary["history"], f"{source}: no central evaluation ran"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_user_change_snippet_is_executed_or_checked(path):
    found = blocks(path)
    if path.name == "README.md" and path.parent == REPO and not any(m for m, *_ in found):
        pytest.skip("README.md has no exec markers yet (lead-owned; see the v2 report)")
    for marker, args, language, code in found:
        if marker == "checked":
            target = (REPO / args).read_text()
            lines = [ln[1:] if language == "diff" else ln for ln in code.splitlines()
                     if (ln.startswith("+") or language != "diff")]
            missing = [ln for ln in lines if ln.strip() and ln.strip() not in target]
            assert not missing, f"{path.name}: lines not in {args}: {missing}"
        elif marker is None and language in ("python", "diff"):
            assert "strategies" not in code, (
                f"{path.relative_to(REPO)}: a {language} block that uses 'strategies' is neither "
                f"executed (<!-- exec: ... -->) nor checked (<!-- checked: FILE -->):\n{code}")


def test_the_documents_do_have_executed_snippets():
    sources = {g[0] for g in EXEC}
    assert {"docs/strategies/fedveca.md", "docs/strategies/dynamicfl.md",
            "docs/strategies/async.md", "docs/strategies/fedprox-fednova.md",
            "docs/strategies/scaffold.md", "docs/strategies/feddyn.md",
            "docs/strategies/moon.md", "docs/strategies/selection.md", "docs/clock.md",
            "docs/your-project.md"} <= sources
