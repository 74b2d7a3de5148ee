"""Codec round trips: tagged unions, numpy arrays as zero-copy frames, rejection of bad input."""

from __future__ import annotations

import time
from typing import Union

import msgspec
import numpy as np
import pytest

from zinfer.messages.codec import INLINE_MAX, Codec


class Tokens(msgspec.Struct, array_like=True, tag=True, omit_defaults=True, gc=False):
    request_id: str
    token_ids: list[int]
    traceparent: str = ""
    finished: bool = False


class Logits(msgspec.Struct, array_like=True, tag=True, omit_defaults=True, gc=False):
    round_id: int
    logits: np.ndarray  # [rows, vocab]
    rows: list[str] = []


class Extras(msgspec.Struct, array_like=True, tag=True, omit_defaults=True, gc=False):
    arrays: list[np.ndarray]
    maybe: np.ndarray | None = None


Msg = Union[Tokens, Logits, Extras]


@pytest.fixture
def codec() -> Codec:
    return Codec(Msg)


def _base_shares(arr: np.ndarray, frame) -> bool:
    return np.shares_memory(arr, np.frombuffer(frame, np.uint8))


def test_tokens_round_trip(codec):
    msg = Tokens("req-1", list(range(32)), traceparent="00-ab-cd-01")
    frames = codec.encode(msg)
    assert len(frames) == 1
    assert codec.decode(frames) == msg


def test_defaults_are_omitted_on_the_wire(codec):
    short = codec.encode(Tokens("r", [1]))[0]
    full = codec.encode(Tokens("r", [1], traceparent="x", finished=True))[0]
    assert len(short) < len(full)
    assert codec.decode([short]) == Tokens("r", [1])


def test_large_logits_travel_as_a_frame_without_copy(codec):
    logits = np.random.default_rng(0).standard_normal((4, 49152), dtype=np.float32)
    frames = codec.encode(Logits(7, logits, rows=["a", "b", "c", "d"]))
    assert len(frames) == 2
    assert len(frames[1]) == logits.nbytes
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), logits)  # encode: no copy
    out = codec.decode(frames)
    assert isinstance(out, Logits) and out.round_id == 7 and out.rows == ["a", "b", "c", "d"]
    assert out.logits.dtype == np.float32 and out.logits.shape == (4, 49152)
    np.testing.assert_array_equal(out.logits, logits)
    assert _base_shares(out.logits, frames[1])  # decode: no copy
    assert not out.logits.flags.writeable


def test_decode_from_received_bytes_frames_shares_memory(codec):
    arr = np.arange(10_000, dtype=np.int32)
    body, raw = codec.encode(Logits(1, arr))
    received = [bytes(body), bytearray(raw)]  # what a socket hands back
    out = codec.decode(received)
    np.testing.assert_array_equal(out.logits, arr)
    assert _base_shares(out.logits, received[1])


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(2048, dtype=np.int32).reshape(32, 64),
        np.linspace(-3, 3, 1000).astype(np.float16),
        np.random.default_rng(1).random(999) > 0.5,
        np.array(2.5, dtype=np.float64),  # 0-d
        np.zeros((3, 0, 5), dtype=np.float32),  # empty
        np.arange(4000, dtype=np.float32).reshape(40, 100)[::3, 1::2],  # non-contiguous slice
        np.arange(6, dtype=np.uint8),  # small: inline
        np.arange(1000, dtype=">i8"),  # big-endian: made native
        np.array([1 + 2j, 3 - 4j], dtype=np.complex64),
    ],
    ids=["int32", "float16", "bool", "0-d", "empty", "noncontig", "inline-u8", "big-endian", "complex"],
)
def test_array_round_trip(codec, arr):
    frames = codec.encode(Logits(0, arr))
    assert len(frames) == (1 if arr.nbytes < INLINE_MAX else 2)
    out = codec.decode(frames).logits
    assert out.shape == arr.shape
    assert out.dtype == arr.dtype.newbyteorder("=")
    np.testing.assert_array_equal(out, arr)
    if len(frames) == 2:
        assert _base_shares(out, frames[1])


def test_arrays_nested_in_lists_and_optional(codec):
    a, b = np.ones(100, np.float64), np.arange(3, dtype=np.int16)
    out = codec.decode(codec.encode(Extras([a, b], maybe=np.full(64, 7, np.int64))))
    assert [x.tolist() for x in out.arrays] == [a.tolist(), b.tolist()]
    assert out.maybe.tolist() == [7] * 64
    assert codec.decode(codec.encode(Extras([]))).maybe is None


def test_single_type_codec():
    c = Codec(Tokens)
    assert c.decode(c.encode(Tokens("x", [5]))) == Tokens("x", [5])
    with pytest.raises(msgspec.ValidationError):
        c.decode(Codec(Msg).encode(Logits(1, np.zeros(2))))


def test_object_arrays_are_refused(codec):
    with pytest.raises(TypeError):
        codec.encode(Logits(0, np.array(["a", None], dtype=object)))


@pytest.mark.parametrize(
    "frames",
    [
        [b"\xc1\xff\x00garbage"],
        [b""],
        [],
    ],
    ids=["garbage", "empty-body", "no-frames"],
)
def test_malformed_frames_raise_msgspec_errors(codec, frames):
    with pytest.raises(msgspec.MsgspecError):
        codec.decode(frames)


def test_wrong_field_type_and_unknown_tag_raise_validation_error(codec):
    enc = msgspec.msgpack.encode
    with pytest.raises(msgspec.ValidationError):
        codec.decode([enc(["Tokens", "req", "not-a-list"])])
    with pytest.raises(msgspec.ValidationError):
        codec.decode([enc(["Nope", 1])])


@pytest.mark.parametrize(
    "placeholder, extra",
    [
        (["|O", [2], b"\x00" * 16], []),  # object dtype
        (["<f4", [4], b"\x00" * 15], []),  # wrong byte count
        (["<f4", [-1], b""], []),  # negative dim
        (["<f4", [1000], 1], []),  # frame index with no frame
        (["<f4", [10], 1], [b"\x00" * 40, b"extra"]),  # an unreferenced frame
        (["<f4", [10], 1], [b"\x00" * 39]),  # frame too short
        (["<f4", [10], 0], [b"\x00" * 40]),  # points at the body
        ([1, 2], []),  # not a placeholder
        (["<f4", [10], 1.5], [b"\x00" * 40]),  # data neither bytes nor index
    ],
)
def test_bad_array_placeholders_raise_validation_error(codec, placeholder, extra):
    body = msgspec.msgpack.encode(["Logits", 1, placeholder])
    with pytest.raises(msgspec.ValidationError):
        codec.decode([body, *extra])


def test_codec_keeps_working_after_a_rejected_message(codec):
    with pytest.raises(msgspec.ValidationError):
        codec.decode([msgspec.msgpack.encode(["Logits", 1, ["<f4", [4], 1]])])
    arr = np.ones(1000, np.float32)
    np.testing.assert_array_equal(codec.decode(codec.encode(Logits(2, arr))).logits, arr)


def _us_per_call(fn, n: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def test_report_codec_speed(codec):
    """Prints µs per encode/decode; asserts only that the calls work."""
    tok = Tokens("req-123", list(range(32)), traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    tok_frames = codec.encode(tok)
    big = Logits(1, np.zeros(1 << 20, np.float32))  # 4 MiB
    big_frames = codec.encode(big)
    enc_t = _us_per_call(lambda: codec.encode(tok), 20_000)
    dec_t = _us_per_call(lambda: codec.decode(tok_frames), 20_000)
    enc_b = _us_per_call(lambda: codec.encode(big), 2_000)
    dec_b = _us_per_call(lambda: codec.decode(big_frames), 2_000)
    print(
        f"\ncodec: 32-token message encode {enc_t:.2f} µs, decode {dec_t:.2f} µs; "
        f"4 MiB array encode {enc_b:.2f} µs, decode {dec_b:.2f} µs"
    )
    assert codec.decode(big_frames).logits.nbytes == 4 << 20


def test_deep_nesting_is_a_decode_error_not_a_crash():
    """A frame nested 100,000 deep (msgspec recurses even through the field it skips while
    looking for the tag) raises DecodeError, which every actor loop catches."""
    from zinfer.messages.client import ClientRequest

    deep = b"\x91" * 100_000 + b"\x90"  # [[[...[]...]]]
    body = b"\x82\xa6prompt" + deep + b"\xa4type\xa8generate"  # {"prompt": deep, "type": "generate"}
    with pytest.raises(msgspec.DecodeError, match="nested too deeply"):
        Codec(ClientRequest).decode([body])
