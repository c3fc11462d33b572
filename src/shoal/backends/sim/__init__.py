"""The discrete-event backend: simulated workers and servers on a simpy virtual clock, real gradients.

backend.py drives a run (workers, evaluation, stopping); server.py is one
server on the virtual clock; groups.py is GSSP's split, regroups and the
exchange between group servers; membership.py is workers joining and leaving.
It never imports ray (an import-linter contract).
"""

from shoal.backends.sim.backend import SimBackend

__all__ = ["SimBackend"]
