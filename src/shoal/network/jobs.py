"""The jobs file of ``shoal route --jobs``: several training jobs on one network.

```json
{
  "switch_slots": 4096,
  "jobs": [
    {"name": "vision", "ps": "h0.0.0", "workers": ["h0.0.1", "h0.1.0"], "slots": 1024},
    {"name": "speech", "workers": 20}
  ]
}
```

Per job: ``name``; ``ps`` (a host; default: drawn by seed); ``workers`` (a
list of hosts, or a count drawn by seed among the hosts no job names);
``slots``, the aggregator memory units the job holds on each switch it
aggregates at (default 1024); ``ps_gbps`` and ``worker_gbps`` (default the
command's B and T). ``switch_slots`` gives every switch that many units
(``--switch-slots`` wins over it; default: the topology's, else 40,000). A
host belongs to one job only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shoal.errors import ConfigError
from shoal.network.instance import Instance, reachable_hosts, rng_for
from shoal.network.joint import Job
from shoal.network.topology import _pydantic_line, hosts, switches

Name = Annotated[str, Field(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class JobSpec(_Strict):
    name: Name
    ps: Name | None = None
    workers: list[Name] | int  # hosts, or a count drawn by seed (checked in _place: clearer lines than a union's)
    slots: int = Field(1024, ge=1)
    ps_gbps: float | None = Field(None, gt=0)
    worker_gbps: float | None = Field(None, gt=0)


class JobsSpec(_Strict):
    switch_slots: int | None = Field(None, ge=1)
    jobs: list[JobSpec] = Field(min_length=1)


def load_jobs(path: str | Path, graph: nx.Graph, *, seed: int, ps_gbps: float, worker_gbps: float,
              switch_slots: int | None = None) -> list[Job]:
    """Read the jobs file and place every job on ``graph``; bad input is one ConfigError line.

    Every switch's ``slots`` attribute is set to ``switch_slots`` (the command
    line's), else to the file's ``switch_slots``, else left as the topology has it.
    """
    src = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--jobs: {src}: no such file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--jobs: {src}: not UTF-8 text") from None
    except OSError as err:
        raise ConfigError(f"--jobs: {src}: cannot read ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"--jobs: {src}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--jobs: {src}: expected a JSON object with a jobs list")
    try:
        spec = JobsSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_pydantic_line(err, f"--jobs: {src}")) from None
    slots = switch_slots if switch_slots is not None else spec.switch_slots
    if slots is not None:
        for s in switches(graph):
            graph.nodes[s]["slots"] = slots
    return _place(spec, graph, seed, ps_gbps, worker_gbps, src)


def _place(spec: JobsSpec, graph: nx.Graph, seed: int, ps_gbps: float, worker_gbps: float, src: str) -> list[Job]:
    names = [j.name for j in spec.jobs]
    if len(set(names)) != len(names):
        raise ConfigError(f"--jobs: {src}: two jobs are named {next(n for n in names if names.count(n) > 1)!r}")
    all_hosts = set(hosts(graph))
    taken: dict[str, str] = {}
    for job in spec.jobs:  # named hosts first, so that drawn ones avoid them
        for h in ([job.ps] if job.ps else []) + (job.workers if isinstance(job.workers, list) else []):
            if h not in all_hosts:
                raise ConfigError(f"--jobs: {src}: job {job.name!r}: {h!r} is not a host of the topology")
            if h in taken:
                raise ConfigError(f"--jobs: {src}: host {h!r} is in jobs {taken[h]!r} and {job.name!r}")
            taken[h] = job.name
    out = []
    for job in spec.jobs:
        rng = rng_for(seed, f"job:{job.name}")
        free = sorted(all_hosts - set(taken))
        ps = job.ps or (free[int(rng.integers(len(free)))] if free else None)
        if ps is None:
            raise ConfigError(f"--jobs: {src}: job {job.name!r}: no free host left for its PS")
        taken[ps] = job.name
        reach = reachable_hosts(graph, ps)
        if job.workers in (0, []) or (isinstance(job.workers, int) and job.workers < 0):
            raise ConfigError(f"--jobs: {src}: job {job.name!r}: workers must be a non-empty host list or a count >= 1")
        if isinstance(job.workers, int):
            pool = sorted(reach - set(taken))
            if job.workers > len(pool):
                raise ConfigError(f"--jobs: {src}: job {job.name!r} asks for {job.workers} workers; only {len(pool)} free hosts reach its PS")
            workers = sorted(pool[i] for i in rng.choice(len(pool), size=job.workers, replace=False))
        else:
            workers = sorted(job.workers)
            cut = [w for w in workers if w not in reach]
            if cut:
                raise ConfigError(f"--jobs: {src}: job {job.name!r}: no path from worker {cut[0]!r} to its PS {ps!r}")
        taken.update(dict.fromkeys(workers, job.name))
        out.append(Job(job.name, Instance(graph, ps, tuple(workers), job.ps_gbps or ps_gbps, job.worker_gbps or worker_gbps), job.slots))
    return out
