"""One hostile ClientApp among honest ones, for a real ``flwr run`` of the trust gate.

:data:`app` is fedhetero's ClientApp (``fedapp.client_app``: the same train, evaluate and
query handlers) except that partition :data:`HOSTILE_PARTITION` sends a crafted train reply
in the rounds of :data:`ATTACKS` (classes of :mod:`simulation.reliability.corruptions`): a
1-element ``.npy`` payload declared with a layer's shape (broadcast silently into the layer
before the gate), then ``num-examples`` = 10^12 (weight inflation). It never runs in a
normal run: :func:`hostile_project` copies the app into a folder whose pyproject names
this module as the ClientApp, and ``flwr run`` is pointed at that folder.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedapp import client_app as honest
from strategies import contract as C

from .corruptions import CORRUPTIONS

HOSTILE_PARTITION = 1
ATTACKS = {1: "npy-one-element", 2: "num-examples-huge"}  # server round -> class
PACKAGES = ("fedapp", "strategies", "task", "simulation")
CLIENTAPP = "simulation.reliability.hostile_client:app"

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """The honest train reply, crafted by partition HOSTILE_PARTITION in ATTACKS' rounds."""
    reply = honest.train(msg, context)
    server_round = int(msg.content[C.CONFIG].get(C.SERVER_ROUND, 0))
    hostile = int(context.node_config["partition-id"]) == HOSTILE_PARTITION
    if hostile and server_round in ATTACKS and not reply.has_error():
        return CORRUPTIONS[ATTACKS[server_round]](reply, msg)
    return reply


app.evaluate()(honest.evaluate_local)
app.query()(honest.query)


def hostile_project(destination: Path, source: Path | None = None) -> Path:
    """A copy of the app in ``destination`` (pyproject.toml and the packages) whose
    ClientApp is :data:`app`; returns ``destination``."""
    source = Path(source or Path(__file__).resolve().parents[2])
    destination.mkdir(parents=True, exist_ok=True)
    for package in PACKAGES:
        shutil.copytree(source / package, destination / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    text = (source / "pyproject.toml").read_text()
    text, count = re.subn(r'(?m)^clientapp = ".*"$', f'clientapp = "{CLIENTAPP}"', text)
    if count != 1:
        raise ValueError(f"{source / 'pyproject.toml'} names no clientapp to replace")
    text = re.sub(r'(?m)^fab-exclude = .*\n', "", text)  # the copy has no docs/ to leave out
    (destination / "pyproject.toml").write_text(text)
    for extra in ("README.md", "LICENSE"):
        if (source / extra).is_file():
            shutil.copy2(source / extra, destination / extra)
    return destination
