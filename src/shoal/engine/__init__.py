"""The training machinery backends share: replicas, gradient steps, cost model, metrics."""
