"""Reliability tooling: the in-process fault Grid (virtual time, simulated kill, reply
hooks), malformed-reply corruptions, the faults table and the resume check."""

from .corruptions import CORRUPTIONS, corrupting_hook, malformed_hook
from .grid import FaultGrid, SimulatedKill, VirtualClock, run_inprocess

__all__ = ["CORRUPTIONS", "FaultGrid", "SimulatedKill", "VirtualClock", "corrupting_hook",
           "malformed_hook", "run_inprocess"]
