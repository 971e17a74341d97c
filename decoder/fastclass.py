"""Build frozen slotted dataclass instances fast, for the per-packet and per-frame paths."""

from __future__ import annotations

from dataclasses import fields, make_dataclass

__all__ = ["fast_constructor"]


def fast_constructor(cls: type) -> type:
    """Return a mutable twin of frozen slotted dataclass `cls` for building instances fast.

    A frozen dataclass's `__init__` stores every field through `object.__setattr__`: 1.4 us for
    TcpSegment's nine fields against 0.26 us for a plain slotted class. The twin has the identical slot
    layout, so after `obj = Twin(...)`, `obj.__class__ = cls` turns it into a genuine, immutable `cls`
    (0.4 us in all). Used on the per-packet paths only; everything else calls `cls(...)`.
    """
    twin = make_dataclass(
        f"_{cls.__name__}Builder", [(f.name, f.type) for f in fields(cls)], slots=True, eq=False, repr=False
    )
    if twin.__slots__ != cls.__slots__:  # pragma: no cover - would mean dataclasses changed layout rules
        raise TypeError(f"cannot build a twin of {cls.__name__}")
    return twin
