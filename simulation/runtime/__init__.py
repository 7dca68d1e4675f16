"""The runtime: drive ``flwr run`` (start, stream, status), stop process trees by PID,
bring up a Ray cluster. The only part of :mod:`simulation` that ``deploy`` imports.

Public API (everything else is internal to this package):

* overrides: :func:`parse_value`, :func:`parse_overrides`, :func:`to_flwr_config`;
* processes: :func:`free_port`, :func:`descendants`, :func:`process_tree`,
  :func:`is_alive`, :func:`send_signal`, :func:`stop_pids`, :func:`stop_on_sigterm`,
  :func:`interrupt_once`,
  :class:`Started`, :func:`start_process`, :func:`stop_processes`, :func:`wait_for_port`;
* the ``flwr`` CLI: :data:`PROJECT_ROOT`, :func:`flwr_env`, :func:`flwr_run_command`,
  :func:`stream_command`, :func:`run_status`, :func:`submit_run`, :class:`AppRun`;
* the managed local SuperLink: :func:`run_app`, :func:`local_superlink_pids`,
  :func:`stop_local_superlink`, :class:`ForeignSuperLinkError`;
* Ray: :mod:`simulation.runtime.ray_cluster` (``start_head``, ``start_worker``, ...);
* the federation's options: :class:`FederationConfigError`, :func:`federation_value`,
  :func:`client_resources` (the options of ``--num-supernodes`` / ``--*-per-client``),
  :func:`option_type` (an argparse type for an option that sets one),
  :func:`refuse_unfittable` (ClientApps that ask for more than this machine's Ray has),
  :func:`unused_gpus_note` (GPUs here that the ClientApps will not get);
* option types: :func:`at_least` (a count), :func:`fraction` (a number from 0 to 1);
* the tools' ``--help``: :class:`HelpFormatter` (every option's default shown).
"""

from .flwr_cli import (PROJECT_ROOT, AppRun, flwr_env, flwr_run_command, run_id_of, run_status,
                       stream_command, submit_run)
from .federation import (NOTHING_RAN, FederationConfigError, client_resources, federation_value,
                         option_type, refuse_unfittable, unused_gpus_note)
from .help_format import HelpFormatter
from .local_superlink import (ForeignSuperLinkError, local_superlink_pids, run_app,
                              stop_local_superlink)
from .option_types import at_least, fraction
from .overrides import parse_overrides, parse_value, to_flwr_config
from .processes import (Started, descendants, free_port, interrupt_once, is_alive, process_tree,
                        send_signal, start_process, stop_on_sigterm, stop_pids, stop_processes,
                        wait_for_port)

__all__ = [
    "AppRun", "NOTHING_RAN", "at_least", "client_resources", "FederationConfigError",
    "ForeignSuperLinkError", "HelpFormatter", "PROJECT_ROOT", "Started", "descendants",
    "federation_value", "flwr_env", "fraction", "flwr_run_command", "free_port",
    "interrupt_once", "is_alive",
    "local_superlink_pids", "option_type", "parse_overrides", "parse_value", "process_tree",
    "refuse_unfittable", "run_app", "run_id_of", "run_status", "send_signal", "start_process",
    "stop_local_superlink", "stop_on_sigterm", "stop_pids", "stop_processes", "stream_command",
    "submit_run", "to_flwr_config", "unused_gpus_note", "wait_for_port",
]
