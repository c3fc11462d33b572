"""A character-level language model on Python's own standard-library sources, as shoal plug-ins.

    shoal train --config examples/charlm.toml

``data`` cuts the text of a few standard-library modules (already on every
machine with Python) into windows of ``context`` characters: x is a window,
y the same window shifted by one, so the model predicts every next
character. ``build`` is a small GRU over character embeddings that returns
logits of shape (batch, context, vocabulary); shoal's cross-entropy and
perplexity accept that shape.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

MODULES = ("argparse.py", "textwrap.py", "shutil.py", "tempfile.py", "pathlib.py", "string.py")


def data(context: int = 64, train_chars: int = 200_000, test_chars: int = 20_000, seed: int = 0):
    """(train, test) pairs of (x, y) token tensors; the vocabulary is every character of the text (at most 128)."""
    folder = Path(os.__file__).parent
    text = "".join((folder / name).read_text(encoding="utf-8", errors="replace") for name in MODULES
                   if (folder / name).exists())
    text = "".join(c if ord(c) < 128 else "?" for c in text)
    tokens = torch.tensor([ord(c) for c in text], dtype=torch.long)
    train, test = tokens[:train_chars], tokens[train_chars:train_chars + test_chars]

    def windows(seq: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.arange(0, len(seq) - context - 1, step)
        x = torch.stack([seq[s:s + context] for s in starts.tolist()])
        y = torch.stack([seq[s + 1:s + context + 1] for s in starts.tolist()])
        return x, y

    return windows(train, context // 2), windows(test, context)


class CharGRU(nn.Module):
    def __init__(self, vocab: int, embed: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = nn.GRU(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(x))
        return self.head(out)


def build(input_shape: tuple[int, ...], num_classes: int, embed: int = 32, hidden: int = 128) -> nn.Module:
    """``num_classes`` is the vocabulary size shoal derived from the labels (highest character code + 1)."""
    return CharGRU(max(num_classes, 128), embed, hidden)
