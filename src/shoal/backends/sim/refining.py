"""The `sim` backend's side of run.eval_refine: copies of the evaluated model between evaluations.

The copies are taken beside the training (engine/refine.py says why): by
iterations, when the iteration count passes each of the eval_refine - 1
marks inside a period; by time, at eval_refine - 1 moments the evaluation
clock waits for before its own tick. Neither schedules anything a worker
waits for, so the training and the regular evaluations are those of the
unrefined run. A checkpoint keeps the copies and the marks still to come,
so a resumed run refines as the uninterrupted one does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import simpy
from safetensors.torch import load_file, save_file

from shoal.backends.sim.checkpoints import at
from shoal.engine.refine import Kept, TargetRefiner

REFINE = "refine.safetensors"


class SimRefine:
    """Copies of the evaluated model for ``SimBackend`` (run.eval_refine), and the refined time to target."""

    def _init_refine(self) -> None:
        factor = self.cfg.run.eval_refine
        self.refiner = TargetRefiner(factor) if factor > 1 and self.setup.train_mode else None
        self.refined_evaluations = 0
        self._kept_mark = (0, 0)  # by iterations: (the period's first iteration, the mark inside it) last kept
        self._keep_times: list[float] = []  # by time: the moments in this period still to keep a copy at

    def _keep(self) -> None:
        """A copy of the model an evaluation now would judge, until the target is reached."""
        if self.refiner is not None and self.recorder.time_to_target_s is None:
            self.refiner.keep(self.env.now, self.recorder, self.model_state())

    def _keep_by_iterations(self) -> None:
        """Evaluating every K iterations: keep a copy once the count passes each mark ceil(j K / N), 0 < j < N."""
        every, factor = self.cfg.run.eval_every_iterations, self.cfg.run.eval_refine
        start = self.recorder.iterations // every * every
        mark = (self.recorder.iterations - start) * factor // every
        if mark and (start, mark) > self._kept_mark:
            self._kept_mark = (start, mark)
            self._keep()

    def _keep_until(self, tick: simpy.Event) -> Iterator[simpy.Event]:
        """Evaluating by time: wait for each moment of ``_keep_times`` and keep a copy there, then for ``tick``."""
        while self._keep_times:
            yield at(self.env, self._keep_times[0])
            self._keep_times.pop(0)
            self._keep()
        yield tick

    def _refine_after(self, reached: bool) -> None:
        """After a regular evaluation: file its period's copies and, if the target was just reached, refine."""
        if self.refiner is None:
            return
        self.refiner.evaluated(self.recorder)
        if not reached:
            return
        data, engine = self.setup.dataset, self.setup.engine

        def evaluate(kept: Kept):
            return engine.evaluate(kept.params, kept.buffers, data.x_test, data.y_test, as_model=False)

        target = self.cfg.target()
        assert target is not None  # reached implies a target
        self.refined_evaluations += self.refiner.refine(self.recorder, evaluate, target)

    # -- checkpoints ------------------------------------------------------------

    def _refine_state(self, folder: Path) -> dict[str, Any]:
        """The refiner's part of a checkpoint: the copies' tensors in ``folder``, their points and marks here."""
        if self.refiner is None:
            return {}
        lists = {"since_eval": self.refiner.since_eval, "before_streak": self.refiner.before_streak}
        tensors = {f"{name}.{i}.{part}": getattr(kept, part).contiguous()
                   for name, kept_list in lists.items() for i, kept in enumerate(kept_list)
                   for part in ("params", "buffers")}
        save_file(tensors, str(folder / REFINE))
        return {"refine": {**{name: [k.point() for k in kept_list] for name, kept_list in lists.items()},
                           "kept_mark": list(self._kept_mark), "keep_times": self._keep_times}}

    def _restore_refine(self, folder: Path, state: dict[str, Any]) -> None:
        if self.refiner is None or "refine" not in state:
            return
        saved, refine = load_file(str(folder / REFINE)), state["refine"]
        for name in ("since_eval", "before_streak"):
            setattr(self.refiner, name, [Kept(**point, params=saved[f"{name}.{i}.params"],
                                              buffers=saved[f"{name}.{i}.buffers"])
                                         for i, point in enumerate(refine[name])])
        self._kept_mark = tuple(refine["kept_mark"])
        self._keep_times = list(refine["keep_times"])
