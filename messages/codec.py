"""msgspec codec for bus messages: a msgpack body frame plus one frame per large array.

A message is a msgspec.Struct (or a tagged union of them). Fields typed `np.ndarray`
(also `np.ndarray | None`, lists of arrays, ...) are encoded, as vLLM V1 does, as a
small placeholder in the body, `[dtype, shape, data]`, where `data` is either the
raw bytes inline (arrays under INLINE_MAX bytes) or the index of an extra frame that
carries the array's buffer untouched. Decoding wraps that frame with np.frombuffer:
no copy. Decoded arrays are read-only; copy one before mutating it.

Only numeric dtypes cross (bool, ints, uints, float16/32/64, complex); arrays are
made C-contiguous and native-endian on encode. No pickle anywhere. One Decoder per
codec validates every message: malformed bytes raise msgspec.DecodeError, a body
that does not fit the type (wrong field type, bad placeholder, missing or extra
array frame) raises msgspec.ValidationError; both subclass msgspec.MsgspecError, so
an actor loop can reject the message and carry on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import msgspec
import numpy as np

T = TypeVar("T")

INLINE_MAX = 256
"""Arrays with fewer bytes than this travel inside the body instead of their own frame."""

_DTYPES: dict[str, np.dtype] = {
    np.dtype(t).str: np.dtype(t)
    for t in (
        np.bool_, np.int8, np.int16, np.int32, np.int64,
        np.uint8, np.uint16, np.uint32, np.uint64,
        np.float16, np.float32, np.float64, np.complex64, np.complex128,
    )
}
"""Wire dtype string (numpy `dtype.str`, e.g. '<f4') -> dtype, for every dtype allowed."""


class Codec(Generic[T]):
    """Encodes messages of type T to frames and decodes frames back, validating.

    Build one per socket direction: `Codec(Union[A, B])` for a tagged union of
    Structs, or `Codec(A)`. `encode` and `decode` are synchronous and not reentrant
    (they keep per-call frame state on the codec); share a codec between trio tasks
    freely, not between threads.
    """

    def __init__(self, type_: Any) -> None:
        self.type = type_
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(type_, dec_hook=self._dec_hook)
        self._out: list[memoryview] = []  # array frames of the encode in progress
        self._in: Sequence[Any] = ()  # frames of the decode in progress
        self._used = 0  # array frames referenced by the decode in progress

    def encode(self, msg: T) -> list[bytes | memoryview]:
        """Return the frames of `msg`: the msgpack body, then one per large array.

        Array frames are memoryviews over the arrays themselves (or over a
        contiguous copy when an array was not C-contiguous or native-endian): do
        not mutate those arrays until the frames are sent.
        """
        self._out = []
        try:
            body = self._encoder.encode(msg)
            return [body, *self._out]
        finally:
            self._out = []

    def decode(self, frames: Sequence[Any]) -> T:
        """Rebuild a message from frames as produced by `encode`.

        `frames[0]` is the body; the rest are array frames (bytes, memoryview,
        zmq.Frame: anything with the buffer protocol), wrapped without copying.
        Raises msgspec.DecodeError or msgspec.ValidationError on a malformed message
        (DecodeError too for one nested too deeply to decode).
        """
        if not frames:
            raise msgspec.ValidationError("empty message: no body frame")
        self._in = frames
        self._used = 0
        try:
            try:
                msg = self._decoder.decode(frames[0])
            except RecursionError:  # msgspec recurses even through a field it skips
                raise msgspec.DecodeError("message nested too deeply") from None
            if self._used != len(frames) - 1:
                raise msgspec.ValidationError(
                    f"message has {len(frames) - 1} array frames, body references {self._used}"
                )
            return msg
        finally:
            self._in = ()

    # ------------------------------------------------------------------ hooks

    def _enc_hook(self, obj: Any) -> Any:
        if not isinstance(obj, np.ndarray):
            raise NotImplementedError(f"cannot encode {type(obj).__name__}")
        if obj.dtype.str not in _DTYPES:
            if obj.dtype.isnative or obj.dtype.newbyteorder("=").str not in _DTYPES:
                raise TypeError(f"array dtype {obj.dtype} cannot cross the bus")
            obj = obj.astype(obj.dtype.newbyteorder("="))
        arr = obj if obj.flags.c_contiguous else obj.copy(order="C")  # keeps 0-d arrays 0-d
        if arr.nbytes < INLINE_MAX:
            data: bytes | int = arr.tobytes()
        else:
            data = len(self._out) + 1
            self._out.append(memoryview(arr).cast("B"))
        return (arr.dtype.str, arr.shape, data)

    def _dec_hook(self, type_: type, obj: Any) -> Any:
        if type_ is not np.ndarray:
            raise NotImplementedError(f"cannot decode {type_}")
        # Raising ValueError/TypeError here becomes a msgspec.ValidationError with
        # the field's path.
        if not (isinstance(obj, list) and len(obj) == 3):
            raise ValueError("expected an array placeholder [dtype, shape, data]")
        dtype_str, shape, data = obj
        dtype = _DTYPES.get(dtype_str) if isinstance(dtype_str, str) else None
        if dtype is None:
            raise ValueError(f"array dtype {dtype_str!r} not allowed")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError(f"bad array shape {shape!r}")
        if type(data) is int:
            if not 1 <= data < len(self._in):
                raise ValueError(f"array frame {data} missing")
            self._used += 1
            buf = self._in[data]
        elif isinstance(data, bytes):
            buf = data
        else:
            raise ValueError("array data must be inline bytes or a frame index")
        count = math.prod(shape)
        mv = memoryview(buf)
        if mv.nbytes != count * dtype.itemsize:
            raise ValueError(f"array of {shape} {dtype} needs {count * dtype.itemsize} bytes, got {mv.nbytes}")
        arr = np.frombuffer(mv, dtype=dtype, count=count).reshape(shape)
        arr.flags.writeable = False
        return arr
