"""An evaluation of a state equal to the last one evaluated reuses its answer, and a run's records stay bit for bit."""

from __future__ import annotations

from typing import Any

import pytest

import shoal.engine.gradients as gradients
from shoal.backends.sim import SimBackend
from shoal.engine.metrics import RunRecorder
from shoal.engine.setup import build_setup


def _counting_forwards(engine) -> list[int]:
    calls = [0]
    engine.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_the_same_state_is_evaluated_once_and_a_changed_one_again(fast_config):
    setup = build_setup(fast_config())
    engine, data = setup.engine, setup.dataset
    calls = _counting_forwards(engine)
    params, buffers = engine.initial_state()
    first = engine.evaluate(params, buffers, data.x_test, data.y_test)
    passes = calls[0]
    assert passes > 0
    assert engine.evaluate(params.clone(), buffers.clone(), data.x_test, data.y_test) == first  # equal by value
    assert calls[0] == passes and engine.evaluations_skipped == 1
    params.add_(0.01)  # the caller changes its own tensor in place: a new state, evaluated anew
    moved = engine.evaluate(params, buffers, data.x_test, data.y_test)
    assert calls[0] == 2 * passes and moved != first
    engine.evaluate(params, buffers, data.x_test[:100], data.y_test[:100])  # other examples: evaluated
    assert calls[0] > 2 * passes and engine.evaluations_skipped == 1


@pytest.mark.parametrize("scheme", ["localsgd", "diloco"])
def test_a_local_sgd_run_skips_the_evaluations_between_syncs_and_records_the_same(fast_config, monkeypatch, scheme):
    """Evaluations every 4 iterations, a sync every 8 steps of 4 workers: most see the model of the last sync."""
    cfg = fast_config(f"sync.scheme={scheme}", f"sync.{scheme}.local_steps=8", "run.eval_every_iterations=4",
                      "run.stop_at_target=false", "run.max_iterations=160")

    def events(reuse: bool) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
        if not reuse:
            monkeypatch.setattr(gradients.LastEvaluation, "answers", lambda *_: False)
        setup = build_setup(cfg)
        recorder = RunRecorder()
        summary = SimBackend(setup, recorder).run()
        return list(recorder.evals), summary, setup.engine.evaluations_skipped

    reused, summary, skipped = events(reuse=True)
    again, summary_again, none = events(reuse=False)
    assert none == 0 and skipped >= len(reused) // 2
    assert reused == again  # every evaluation's time, value and loss, bit for bit
    assert {k: v for k, v in summary.items() if k != "wall_s"} == {k: v for k, v in summary_again.items()
                                                                   if k != "wall_s"}
