"""torch.nn.utils's names for the gradient clipping that lives in tensorarena.optim (torch code calls
`torch.nn.utils.clip_grad_norm_`; the functions are the same objects)."""

from ..optim.clip import clip_grad_norm_, clip_grad_value_

__all__ = ["clip_grad_norm_", "clip_grad_value_"]
