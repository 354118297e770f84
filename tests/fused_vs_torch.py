"""A module and fused training steps against a torch twin: the comparisons several torch-API tests share."""

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


def module_matches_torch(ours, theirs, x, g, *, tol: float) -> None:
    """Our module and its torch twin on the same float64 input `x`, backward from the upstream gradient `g`: the
    outputs and the input's gradient agree to `tol` (the parameters' gradients are left in .grad to compare)."""
    import numpy as np

    import tensorarena as ta

    ours_x, theirs_x = ta.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, want = ours(ours_x), theirs(theirs_x)
    (out * ta.tensor(g)).sum().backward()
    (want * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(ours_x.grad), theirs_x.grad.numpy(), rtol=tol, atol=tol)
