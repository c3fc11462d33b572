"""A planner's time limit: checked between steps, so a planner returns its best plan so far or says it ran out."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field


class TimeLimit(Exception):
    """A planner ran out of time before it had any plan to return."""


@dataclass(frozen=True)
class Deadline:
    """``limit_s`` seconds from creation (math.inf: no limit)."""

    limit_s: float = math.inf
    start: float = field(default_factory=time.perf_counter)

    def remaining(self) -> float:
        return self.limit_s - (time.perf_counter() - self.start)

    def expired(self) -> bool:
        return self.remaining() <= 0

    def share(self, fraction: float) -> Deadline:
        """A deadline for one step: ``fraction`` of the whole limit, never past this one."""
        return Deadline(min(self.remaining(), fraction * self.limit_s))

    def check(self) -> None:
        """Raise TimeLimit once the time is up (planners call it between steps)."""
        if self.expired():
            raise TimeLimit(f"time limit of {self.limit_s:g} s reached")


NO_LIMIT = Deadline()
