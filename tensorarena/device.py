"""torch's `device=`: tensorarena has one device, the CPU; a ported `device=x.device` or "cpu" is taken, any other
device is refused by name (there is no GPU copy to make)."""

from __future__ import annotations

CPU_NAMES = ("cpu", "cpu:0")


def check_cpu(device, what: str, then: str = "") -> None:
    """Refuse `device` unless it is None or the CPU ("cpu", "cpu:0", torch.device("cpu"), a tensor's .device)."""
    if device is not None and str(device) not in CPU_NAMES:
        raise ValueError(f"{what}: tensorarena runs on the CPU only, got device {str(device)!r}; pass 'cpu' or leave "
                         f"the device out{then}")
