"""The ray backend: real processes on Ray actors, split by role.

driver.py runs a run (loop, records, evaluation, summary) with its roles in
mixins: start.py (creating the actors), membership.py (GSSP's split and
regroups, joins and leaves), recovery.py (worker failures, checkpoints,
resume), server_recovery.py (a dead group server replaced). The actors:
server.py (a group server), worker.py, evaluator.py, switch.py (software
aggregation switches); collective*.py (all-reduce groups); data.py,
placement.py, session.py (starting or joining Ray), wire.py (messages).
Ray is an optional extra (``shoal[ray]``): this door imports it once, and
without it importing any module of the package is one ConfigError that says
how to install it (exit 2 on the command line). The modules then import ray
at their top like any dependency; nothing outside this package imports it.
"""

from shoal.errors import ConfigError

try:
    import ray  # noqa: F401  (the one place the optional extra is checked)
except ImportError:
    raise ConfigError("backend.name = \"ray\": Ray is not installed; pip install 'shoal[ray]' "
                      "(make setup installs it)") from None

from typing import TYPE_CHECKING, Any  # noqa: E402

if TYPE_CHECKING:
    from shoal.backends.ray.driver import DRAIN_S, RayBackend

__all__ = ["DRAIN_S", "RayBackend"]


def __getattr__(name: str) -> Any:
    """The driver loads on first use: an actor process imports its own module (worker.py, server.py, ...) through
    this package, and should not import the driver and all it needs (the network planners among them)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from shoal.backends.ray import driver

    return getattr(driver, name)
