"""A module and fused training steps against a torch twin: the comparisons several torch-API tests share."""

from __future__ import annotations

import pytest
import torch


def fused_steps_match_torch(trainer, torch_optimizer, torch_loss, batches, rel: float = 1e-5) -> None:
    """steps_match_torch on the fused route."""
    steps_match_torch(trainer, torch_optimizer, torch_loss, batches, rel, route="fused")


def steps_match_torch(trainer, torch_optimizer, torch_loss, batches, rel: float = 1e-5, *, route: str) -> None:
    """Step `trainer` on each (x, y) NumPy batch, asserting `route` ran, and step `torch_optimizer` on
    `torch_loss(x, y)` (the twin's loss tensor for the same batch as torch tensors): the losses agree to `rel`.
    The caller compares the parameters afterwards."""
    for x, y in batches:
        report = trainer.step(x, y)
        assert report.route == route
        torch_optimizer.zero_grad()
        want = torch_loss(torch.from_numpy(x), torch.from_numpy(y))
        want.backward()
        torch_optimizer.step()
        assert report.loss == pytest.approx(want.item(), rel=rel)


def sequential_and_twin(*sizes: int):
    """A tensorarena Linear-ReLU-...-Linear Sequential of these widths and its torch twin holding the same weights
    (float32, torch's layout)."""
    import numpy as np

    import tensorarena as ta

    ours, theirs = [], []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        ours.append(ta.nn.Linear(fan_in, fan_out))
        theirs.append(torch.nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2:
            ours.append(ta.nn.ReLU())
            theirs.append(torch.nn.ReLU())
    model, twin = ta.nn.Sequential(*ours), torch.nn.Sequential(*theirs)
    with torch.no_grad():
        for p, q in zip(twin.parameters(), model.parameters()):
            p.copy_(torch.from_numpy(np.array(q.numpy())))
    return model, twin


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
