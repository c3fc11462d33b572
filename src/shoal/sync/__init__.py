"""Synchronisation policies: when a worker may start, and which pushes form one update.

Policies are pure state machines (no clocks, threads or I/O), so both
backends and the tests drive the same objects.
"""

from shoal.sync.base import SyncPolicy
from shoal.sync.localsgd import LocalSGD, PeriodicSchedule
from shoal.sync.policies import ASP, BSP, SSP, PacedSSP, make_policy
from shoal.sync.streaming import FragmentSchedule, StreamingDiLoCo, assign_fragments

__all__ = ["ASP", "BSP", "FragmentSchedule", "LocalSGD", "PacedSSP", "PeriodicSchedule", "SSP", "StreamingDiLoCo",
           "SyncPolicy", "assign_fragments", "make_policy"]
