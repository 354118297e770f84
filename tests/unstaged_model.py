"""A model with no stream_stages(), for the tests of what happens to one (route choice, refusals, whole-step traces).

These tests used models.MLP until it could stream (Sequential.stream_stages, tests/test_sequential_streaming.py);
`Unstaged(MLP(...))` computes the same with its forward of its own and no stages.
"""

from __future__ import annotations

from tensorarena.nn import Module


class Unstaged(Module):
    """`inner` behind a forward of its own, with no stream_stages(): the streaming route cannot cut it."""

    def __init__(self, inner: Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)
