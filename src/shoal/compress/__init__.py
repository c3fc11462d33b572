"""Gradient compression in the spirit of GRACE: Compressor, Memory, and a per-worker codec.

- ``Compressor`` turns one tensor into a ``Payload`` (the tensors that travel,
  whose bytes are counted exactly) and back.
- ``Memory`` is error feedback: what a compressor dropped is kept per tensor and
  added to the next gradient.
- ``GradientCodec`` applies both to every parameter tensor of a flat gradient,
  for one worker.
"""

from shoal.compress.base import Compressor, Memory, NoMemory, Payload, ResidualMemory
from shoal.compress.codec import GradientCodec, make_compressor
from shoal.compress.gdtopk import GDTopKSchedule

__all__ = [
    "Compressor", "GDTopKSchedule", "GradientCodec", "Memory", "NoMemory", "Payload", "ResidualMemory",
    "make_compressor",
]
