"""The README says every activation module trains on the fused route's captured replay: each one, as torch.

A Linear -> activation -> Linear model per module, 4 fused steps with fused_replay="auto" (the default): every step
must run the captured replay (kernels.calls counts which replay ran), and the parameters after 4 AdamW steps must
equal torch's within float32 tolerances. Added with the README's "What it offers" line on layers; the modules
(c980fb8, 5bc2013) ran captured from the start, so this guards the claim rather than a fix: passing
fused_replay="python" to the Trainer makes all 11 fail on their replay check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorarena as ta
from tensorarena import kernels, nn
from tensorarena.train import Trainer

CASES = {
    "ReLU": (lambda: nn.ReLU(), lambda: torch.nn.ReLU()),
    "GELU": (lambda: nn.GELU(), lambda: torch.nn.GELU()),
    "SiLU": (lambda: nn.SiLU(), lambda: torch.nn.SiLU()),
    "Tanh": (lambda: nn.Tanh(), lambda: torch.nn.Tanh()),
    "Sigmoid": (lambda: nn.Sigmoid(), lambda: torch.nn.Sigmoid()),
    "LeakyReLU": (lambda: nn.LeakyReLU(0.1), lambda: torch.nn.LeakyReLU(0.1)),
    "ELU": (lambda: nn.ELU(), lambda: torch.nn.ELU()),
    "Softplus": (lambda: nn.Softplus(), lambda: torch.nn.Softplus()),
    "Softmax": (lambda: nn.Softmax(dim=-1), lambda: torch.nn.Softmax(dim=-1)),
    "LogSoftmax": (lambda: nn.LogSoftmax(dim=-1), lambda: torch.nn.LogSoftmax(dim=-1)),
    "LayerNorm": (lambda: nn.LayerNorm(16), lambda: torch.nn.LayerNorm(16)),
}


def _replays_ran() -> dict[str, int]:
    return {r: kernels.calls[("fused_replay", r)] for r in ("captured", "python")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_activation_module_trains_captured_as_torch(name):
    ours_act, torch_act = CASES[name]
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(8, 16, rng=rng), ours_act(), nn.Linear(16, 4, rng=rng))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch_act(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for (_, ours), (_, theirs) in zip(model.named_parameters(), reference.named_parameters()):
            theirs.copy_(torch.from_numpy(ours.data.copy()))
    trainer = Trainer(model, ta.optim.AdamW(model.parameters(), lr=1e-2), nn.CrossEntropyLoss(), route="fused")
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    ran = []
    for step in range(4):
        x = rng.standard_normal((16, 8)).astype(np.float32)
        y = rng.integers(0, 4, 16)
        before = _replays_ran()
        report = trainer.step(x, y)
        ran.append([r for r, n in _replays_ran().items() if n > before[r]])
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        assert report.route == "fused"
        np.testing.assert_allclose(report.loss, loss.item(), rtol=1e-5, atol=1e-6, err_msg=f"step {step + 1}")
    assert ran == [["captured"]] * 4, ran
    for (key, ours), (_, theirs) in zip(model.named_parameters(), reference.named_parameters()):
        np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=key)
