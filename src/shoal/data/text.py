"""Text data: byte windows of the Python standard library's own sources, with whole modules held out.

Every machine with Python has the sources (about 12 MB of ``.py`` files
without the test suites), so this language workload needs no download. The
data is the running interpreter's library: results compare across machines
with the same Python version.

- Tokens are bytes (a vocabulary of 256); a sample is a window of
  ``context`` bytes and its target the same window shifted by one byte.
  Windows never cross a file's end.
- Validation: whole modules (files), chosen by a hash of their path (about
  ``holdout`` of them), never windows of a training file, so the metric
  measures generalisation to unseen code. The split depends on no seed: every
  run and every scheme is judged on the same modules.
- ``max_bytes`` caps the training text; modules are taken whole in hash
  order (spread over packages) until the cap.
- Each training window records its top-level package (``json`` for
  ``json/decoder.py``, ``argparse`` for ``argparse.py``), which the
  ``by_source`` partition deals out to workers: natural non-IID data.
"""

from __future__ import annotations

import functools
import os
import zlib
from pathlib import Path

import numpy as np
import torch

from shoal.data.sources import Dataset
from shoal.errors import ConfigError

SKIPPED_FOLDERS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
VOCABULARY = 256


def library_root() -> Path:
    """The folder of the running interpreter's standard library."""
    return Path(os.__file__).parent


@functools.lru_cache(maxsize=4)
def library_files(root: Path) -> tuple[tuple[str, bytes], ...]:
    """(relative path, contents) of every source file, test suites and installed packages left out, sorted."""
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIPPED_FOLDERS.intersection(rel.parts[:-1]):
            continue
        try:
            files.append((rel.as_posix(), path.read_bytes()))
        except OSError:
            continue
    return tuple(files)


def is_held_out(rel: str, holdout: float) -> bool:
    """Whether module ``rel`` belongs to the validation set: a stable hash of its path, no seed."""
    return zlib.crc32(rel.encode()) % 10_000 < holdout * 10_000


def top_level(rel: str) -> str:
    """The top-level package or module a file belongs to."""
    return rel.split("/", 1)[0].removesuffix(".py")


def windows(data: bytes, context: int) -> np.ndarray:
    """Non-overlapping (context + 1)-byte windows of one file, stepping by ``context`` (the tail is dropped)."""
    n = (len(data) - 1) // context
    if n <= 0:
        return np.zeros((0, context + 1), dtype=np.uint8)
    raw = np.frombuffer(data, dtype=np.uint8)
    starts = np.arange(n) * context
    return raw[starts[:, None] + np.arange(context + 1)]


def stdlib(seed: int = 0, samples: int = 0, *, context: int = 64, max_bytes: int = 4_000_000,
           holdout: float = 0.05, test_windows: int = 5_000) -> Dataset:
    """The stdlib language data set (see the module docstring); ``seed`` and ``samples`` do not change it."""
    if not isinstance(context, int) or context < 2:
        raise ConfigError(f"data.options.context: a whole number >= 2, got {context!r}")
    if not isinstance(max_bytes, int) or max_bytes < 10 * context:
        raise ConfigError(f"data.options.max_bytes: a whole number >= {10 * context}, got {max_bytes!r}")
    if not 0 < holdout < 1:
        raise ConfigError(f"data.options.holdout: a fraction between 0 and 1, got {holdout!r}")
    if not isinstance(test_windows, int) or test_windows < 1:
        raise ConfigError(f"data.options.test_windows: a whole number >= 1, got {test_windows!r}")
    files = library_files(library_root())
    if not files:
        raise ConfigError(f"no Python sources found under {library_root()}")
    ordered = sorted(files, key=lambda f: (zlib.crc32(f[0].encode(), 1), f[0]))
    train, test, packages = [], [], []
    used = 0
    for rel, data in ordered:
        if is_held_out(rel, holdout):
            test.append(windows(data, context))
        elif used < max_bytes:
            train.append(windows(data, context))
            packages.append(top_level(rel))
            used += len(data)
    return _dataset(train, test, packages, test_windows, context)


def _dataset(train: list[np.ndarray], test: list[np.ndarray], packages: list[str], test_windows: int,
             context: int) -> Dataset:
    names = tuple(sorted(set(packages)))
    index = {name: i for i, name in enumerate(names)}
    sources = np.concatenate([np.full(len(w), index[p], dtype=np.int64) for w, p in zip(train, packages)])
    train_windows = np.concatenate(train)
    test_all = np.concatenate(test)
    if len(train_windows) < 2 or len(test_all) < 1:
        raise ConfigError(f"data set stdlib: too little text for windows of {context} bytes")
    test_rows = test_all[np.linspace(0, len(test_all) - 1, min(test_windows, len(test_all))).astype(np.int64)]
    return Dataset(
        name="stdlib",
        x_train=torch.from_numpy(np.ascontiguousarray(train_windows[:, :-1])),
        y_train=torch.from_numpy(train_windows[:, 1:].astype(np.int64)),
        x_test=torch.from_numpy(np.ascontiguousarray(test_rows[:, :-1])),
        y_test=torch.from_numpy(test_rows[:, 1:].astype(np.int64)),
        num_classes=VOCABULARY,
        sources=sources,
        source_names=names,
    )
