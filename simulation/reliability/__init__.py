"""Reliability tooling: the in-process fault Grid (virtual time, simulated kill, reply
hooks), malformed-reply corruptions, the faults table and the resume check."""

from .corruptions import (CORRUPTIONS, GENERIC_KINDS, STRATEGY_KINDS, corrupting_hook, kinds_for,
                          malformed_hook)
from .grid import FaultGrid, SimulatedKill, VirtualClock, run_inprocess

__all__ = ["CORRUPTIONS", "FaultGrid", "GENERIC_KINDS", "STRATEGY_KINDS", "SimulatedKill",
           "VirtualClock", "corrupting_hook", "kinds_for", "malformed_hook", "run_inprocess"]
