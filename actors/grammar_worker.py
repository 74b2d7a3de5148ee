"""The grammar worker: a child process that compiles each client grammar once, with the
model's vocabulary, before the engine accepts the request.

llguidance is native code: a grammar that overflows its stack ends the process it runs in.
Grammars therefore meet llguidance first here, on a thread with a stack of PROBE_STACK,
a quarter of the COMPILE_STACK the engine's own compiles get (actors/constraints.py): a
grammar that compiles here compiles there, the same code on the same input using the same
stack. If this process dies or overruns its time, the request is refused and only this
process is lost (actors/grammar_checker.py starts another).

Run as `python -m zinfer.actors.grammar_worker MODEL`. Protocol on stdin/stdout: frames
of a 4-byte big-endian length and a msgpack body; the first frame out is `Ready` (or
`Verdict(ok=False)` saying why the vocabulary did not load); then one `Verdict` for each
`Constraint` in.
"""

from __future__ import annotations

import struct
import sys
from typing import BinaryIO

import msgspec

from zinfer.actors.constraints import GrammarProbe, on_thread
from zinfer.messages.params import Constraint

PROBE_STACK = 4 << 20
"""Bytes of stack the worker compiles on: a quarter of constraints.COMPILE_STACK."""


class Ready(msgspec.Struct, tag="ready"):
    """The worker has the vocabulary and takes constraints."""


class Verdict(msgspec.Struct, tag="verdict"):
    """A constraint's outcome: ok with the constraint the engine should run (GBNF comes
    back as Lark), or not ok with one line saying why."""

    ok: bool
    message: str = ""
    constraint: Constraint | None = None


Reply = Ready | Verdict
HEADER = struct.Struct(">I")


def write_frame(out: BinaryIO, msg: msgspec.Struct) -> None:
    body = msgspec.msgpack.encode(msg)
    out.write(HEADER.pack(len(body)) + body)
    out.flush()


def read_frame(inp: BinaryIO) -> bytes | None:
    """One frame's body, or None at the end of the stream."""
    head = inp.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    body = inp.read(HEADER.unpack(head)[0])
    return body if len(body) == HEADER.unpack(head)[0] else None


def main(model: str) -> None:
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    try:
        probe = GrammarProbe.for_model(model)
    except Exception as exc:
        why = f"constraints are unavailable: the model's vocabulary did not load into llguidance: {exc}"
        write_frame(out, Verdict(False, why))
        return
    write_frame(out, Ready())
    decoder = msgspec.msgpack.Decoder(Constraint)
    while (body := read_frame(inp)) is not None:
        try:
            constraint = on_thread(PROBE_STACK, probe.check, decoder.decode(body))
        except (ValueError, msgspec.MsgspecError) as exc:
            write_frame(out, Verdict(False, str(exc)))
        else:
            write_frame(out, Verdict(True, constraint=constraint))


if __name__ == "__main__":
    main(sys.argv[1])
