"""The one warning per tensor type a device keeps as f32 for want of a kernel of its own."""

from __future__ import annotations

import structlog

log = structlog.get_logger("zinfer.devices")


class F32Fallbacks:
    """Tensor types a device has fallen back to f32 for; `note` warns on a type's first tensor."""

    def __init__(self, device: str):
        self.device = device
        self.seen: set[str] = set()

    def note(self, tensor: str, type_name: str, values: int, stored_bytes: int, why: str) -> None:
        """Record that `tensor` (`values` values, `stored_bytes` in its file) of type
        `type_name` is kept as f32 because `why`; a warning on the type's first tensor,
        with what f32 costs per value and for that tensor. Mutates self.seen."""
        if type_name in self.seen:
            return
        self.seen.add(type_name)
        log.warning(
            "tensor type kept as f32",
            device=self.device,
            type=type_name,
            becomes="F32",
            why=why,
            bytes_per_value=f"{stored_bytes / values:.3g} -> 4",
            first_tensor=tensor,
            first_tensor_bytes=f"{stored_bytes} -> {values * 4}",
        )
