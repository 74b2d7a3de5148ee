"""One declared parameter list per LLVM IR kernel: the single source of the IR's `define`
line, of the numba-side call and of a ctypes caller, so that an argument list that does
not match the kernel is a Python error naming the argument, never a wild pointer.

A kernel's parameters are a typing.NamedTuple class (field order = parameter order, every
parameter an i64: an address or a count / index / stride) wrapped in a KernelSignature.
numba kernels call it as `call_kernel(address, Args(name=value, ...))`: the keywords bind
each value to its parameter by name, and call_kernel checks at compile time (no cost per
call) that every field is a 64-bit integer.
"""

from __future__ import annotations

import ctypes
import numbers
from collections.abc import Callable
from typing import Any

from llvmlite import ir
from numba import types as nt
from numba.core.errors import TypingError

from zinfer.kernels.cpu_fast.numba_types import Typing, intrinsic

_DECLARED: set[type] = set()  # the NamedTuple classes of every KernelSignature


class KernelSignature:
    """The parameters of a `void kernel(i64, ...)`: `args` a NamedTuple class (the
    parameters in order), `addresses` those of its fields that hold addresses (the IR
    turns them into pointers; ctypes passes them as void pointers)."""

    def __init__(self, args: type[tuple[int, ...]], addresses: tuple[str, ...]) -> None:
        fields: tuple[str, ...] = args._fields  # type: ignore[attr-defined]  # a NamedTuple class
        unknown = set(addresses) - set(fields)
        if unknown:
            raise ValueError(f"{args.__name__}: addresses {sorted(unknown)} are not parameters")
        self.args = args
        self.names = fields
        self.addresses = addresses
        _DECLARED.add(args)

    def define(self, symbol: str) -> str:
        """The IR line that opens the kernel `symbol`: `define void @symbol(i64 %W, ...) {`."""
        return f"define void @{symbol}(" + ", ".join(f"i64 %{a}" for a in self.names) + ") {"

    def ctypes_function(self, address: int) -> Callable[..., None]:
        """A Python caller of the kernel at `address`, taking every parameter by keyword;
        a missing, unknown or non-integer argument raises TypeError naming it. For tests and
        tools: a ctypes call costs microseconds, the hot path calls from numba."""
        types = [ctypes.c_void_p if n in self.addresses else ctypes.c_int64 for n in self.names]
        function = ctypes.CFUNCTYPE(None, *types)(address)

        def call(**kwargs: int) -> None:
            bound = self.args(**kwargs)  # TypeError names a missing or unexpected parameter
            for name, value in zip(self.names, bound):
                if not isinstance(value, numbers.Integral):
                    raise TypeError(f"{self.args.__name__}.{name} is {type(value).__name__}, wants an integer")
            function(*(int(v) for v in bound))

        return call


def _declared_class(args: Any) -> Any:
    """The NamedTuple class of numba type `args` when it is a KernelSignature's, else None."""
    if not isinstance(args, nt.BaseNamedTuple):
        return None
    named: Any = args  # numba's annotations omit a NamedTuple type's instance_class
    return named.instance_class if named.instance_class in _DECLARED else None


@intrinsic
def call_kernel(typingctx: Any, address: Any, args: Any) -> Typing:
    """Call the `void f(i64, ...)` machine code at `address` with `args`, an instance of a
    KernelSignature's NamedTuple; numba fails to compile the caller (TypingError naming
    the field) when a field is not a 64-bit integer or args is not such a NamedTuple."""
    if not isinstance(address, nt.Integer):
        raise TypingError(f"call_kernel: the address is {address}, wants an integer")
    cls = _declared_class(args)
    if cls is None:
        raise TypingError(
            f"call_kernel: the arguments are {args}, want a kernel's NamedTuple (keywords bind them by name)"
        )
    for name, ty in zip(cls._fields, args.types):
        if not (isinstance(ty, nt.Integer) and getattr(ty, "bitwidth", 0) == 64):  # numba's annotations omit bitwidth
            raise TypingError(
                f"call_kernel: {cls.__name__}.{name} is {ty}, wants a 64-bit integer (an address: array.ctypes.data)"
            )
    n = len(args)

    def codegen(context: Any, builder: Any, signature: Any, llargs: Any) -> Any:
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)] * n)
        fn = builder.inttoptr(llargs[0], fnty.as_pointer())
        builder.call(fn, [builder.extract_value(llargs[1], i) for i in range(n)])
        return context.get_dummy_value()

    return nt.void(address, args), codegen
