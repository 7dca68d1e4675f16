"""Quiet, honest logs (#58 item 4): what a launch shows of flwr run's stream, and the
ServerApp's own lines."""

from __future__ import annotations

import logging

import numpy as np
from flwr.app import ConfigRecord
from flwr.common.logger import FLOWER_LOGGER

from fedapp.flower_logs import SkippedLines, quiet_flower_lines
from simulation.runtime.stream_filter import StreamFilter
from strategies import FedAvg
from strategies.engine.rounds import run_rounds
from tests.inprocess import InProcessGrid, adding_app
from tests.messages import record

# as a real `fedhetero run` streamed them (flwr 1.42, Ray 2.x)
STREAM = [
    "\x1b[92mINFO \x1b[0m:      Starting Flower Simulation\n",
    "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n",
    "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (2 simulated SuperNodes)\n",
    "\x1b[92mINFO \x1b[0m:      To change federation size, use the following command:\n",
    "\x1b[92mINFO \x1b[0m:      \tflwr federation simulation-config @none/default <superlink> "
    "--num-supernodes <N>\n",
    "/x/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions of Ray, Ray will no "
    "longer override accelerator visible devices env var if num_gpus=0\n",
    "  warnings.warn(\n",
    "\x1b[92mINFO \x1b[0m:      [ROUND 1/3]\n",
    "  warnings.warn(\n",  # not after a dropped warning: shown
]


def test_the_stream_leaves_out_what_does_not_apply_and_colour_when_not_a_terminal():
    plain = [line for line in map(StreamFilter(colour=False), STREAM) if line is not None]
    assert plain == ["INFO :      Starting Flower Simulation\n",
                     "INFO :      Federation `@none/default` (2 simulated SuperNodes)\n",
                     "INFO :      [ROUND 1/3]\n", "  warnings.warn(\n"]
    coloured = [line for line in map(StreamFilter(colour=True), STREAM) if line is not None]
    assert coloured[0] == STREAM[0] and len(coloured) == 4


def test_the_app_drops_flowers_skipped_evaluation_line_a_library_user_keeps_it(caplog):
    installed = [f for f in FLOWER_LOGGER.filters if isinstance(f, SkippedLines)]
    for f in installed:  # an in-process ServerApp run earlier in this process installed it
        FLOWER_LOGGER.removeFilter(f)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        FedAvg(fraction_evaluate=0.0)
    assert "Federated evaluation will be skipped" in caplog.text
    caplog.clear()
    quiet_flower_lines()
    quiet_flower_lines()  # once
    try:
        assert sum(isinstance(f, SkippedLines) for f in FLOWER_LOGGER.filters) == 1
        with caplog.at_level(logging.WARNING, logger="flwr"):
            FedAvg(fraction_evaluate=0.0)
        assert "Federated evaluation will be skipped" not in caplog.text
    finally:
        for f in [f for f in FLOWER_LOGGER.filters if isinstance(f, SkippedLines)]:
            FLOWER_LOGGER.removeFilter(f)
        for f in installed:
            FLOWER_LOGGER.addFilter(f)


def test_no_none_results_are_logged(caplog):
    with caplog.at_level(logging.INFO, logger="flwr"):
        run_rounds(FedAvg(fraction_evaluate=0.0), InProcessGrid(adding_app(), 2, {}),
                   record({"w": np.zeros(1)}), num_rounds=2,
                   train_config=ConfigRecord({"local-steps": 1}),
                   evaluate_fn=lambda server_round, arrays: None)
    assert "None" not in "\n".join(r.getMessage() for r in caplog.records
                                   if "evaluation" in r.getMessage() or "MetricRecord" in
                                   r.getMessage())
    assert "Initial global evaluation" not in caplog.text


def test_help_text_has_no_rst_markup():
    from simulation.runtime.help_format import plain  # noqa: PLC0415

    assert plain("the ``flwr run`` of :mod:`simulation.preflight`, :class:`~a.b.RunWatch`, "
                 ":func:`x.y`") == "the flwr run of simulation.preflight, RunWatch, x.y"
    assert plain(None) is None and plain("") == ""


def test_every_tools_help_is_plain(capsys):
    import pytest  # noqa: PLC0415

    from simulation.cli import main  # noqa: PLC0415

    for tool in ("run", "sweep", "report", "bench", "keys", "strategies"):
        with pytest.raises(SystemExit):
            main([tool, "--help"])
        text = capsys.readouterr().out
        assert "usage:" in text
        assert "``" not in text and ":mod:`" not in text and ":func:`" not in text, tool
