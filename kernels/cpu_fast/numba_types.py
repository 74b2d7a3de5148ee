"""Types for writing numba kernels under strict mypy: the scalars a kernel takes, and typed
faces of the numba API whose own annotations do not fit how compiled code calls it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from numba import carray as numba_carray
from numba import extending

F = TypeVar("F", bound=Callable[..., Any])
Float = float | np.floating[Any]  # a scalar argument a kernel reads as a float
Int = int | np.integer[Any]  # a scalar argument a kernel reads as an integer
Codegen = Callable[[Any, Any, Any, Any], Any]  # an intrinsic's (context, builder, signature, args) -> LLVM value
Typing = tuple[Any, Codegen] | None  # an intrinsic's typing: (its signature, its codegen), or None: no such overload


def intrinsic(typing: Callable[..., Typing]) -> Callable[..., Any]:
    """numba.extending.intrinsic, typed as compiled code calls it: without the typing context
    (numba's annotations count it as an argument)."""
    compiled: Callable[..., Any] = extending.intrinsic(typing)
    return compiled

# numba.carray (in compiled code, an array over an address), for shapes of any length (numba's
# annotations allow two). The same object: compiled code resolves it as numba's own.
carray: Callable[..., np.ndarray] = numba_carray
