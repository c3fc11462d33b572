"""The ray backend: real processes on Ray actors, split by role.

driver.py runs a run (loop, records, evaluation, summary) with its roles in
mixins: start.py (creating the actors), membership.py (GSSP's split and
regroups, joins and leaves), recovery.py (worker failures, checkpoints,
resume), server_recovery.py (a dead group server replaced). The actors:
server.py (a group server), worker.py, evaluator.py, switch.py (software
aggregation switches); collective*.py (all-reduce groups); data.py,
placement.py, session.py (starting or joining Ray), wire.py (messages).
The modules import ray inside the functions that need it, so this package
imports without ray installed; the driver says how to install it.
"""

from shoal.backends.ray.driver import DRAIN_S, RayBackend

__all__ = ["DRAIN_S", "RayBackend"]
