"""Fused training steps against a torch twin, step for step: the loop several torch-API tests share."""

from __future__ import annotations

import pytest
import torch


def fused_steps_match_torch(trainer, torch_optimizer, torch_loss, batches, rel: float = 1e-5) -> None:
    """Step `trainer` on each (x, y) NumPy batch, asserting the fused route ran, and step `torch_optimizer` on
    `torch_loss(x, y)` (the twin's loss tensor for the same batch as torch tensors): the losses agree to `rel`.
    The caller compares the parameters afterwards."""
    for x, y in batches:
        report = trainer.step(x, y)
        assert report.route == "fused"
        torch_optimizer.zero_grad()
        want = torch_loss(torch.from_numpy(x), torch.from_numpy(y))
        want.backward()
        torch_optimizer.step()
        assert report.loss == pytest.approx(want.item(), rel=rel)
