"""Codec round trips: tagged unions, numpy arrays as zero-copy frames, rejection of bad input."""

from __future__ import annotations

from typing import Any, Union

import hypothesis.extra.numpy as hnp
import msgspec
import msgspec.inspect as mi
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zinfer.messages import client, engine
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


def test_deep_nesting_is_a_decode_error_not_a_crash():
    """A frame nested 100,000 deep (msgspec recurses even through the field it skips while
    looking for the tag) raises DecodeError, which every actor loop catches."""
    from zinfer.messages.client import ClientRequest

    deep = b"\x91" * 100_000 + b"\x90"  # [[[...[]...]]]
    body = b"\x82\xa6prompt" + deep + b"\xa4type\xa8generate"  # {"prompt": deep, "type": "generate"}
    with pytest.raises(msgspec.DecodeError, match="nested too deeply"):
        Codec(ClientRequest).decode([body])


# ---- the real message unions ------------------------------------------------------------

BUS_UNIONS = {  # every type a Codec decodes on the bus (actors/, gateway/client.py, gateway/stdio.py)
    "ExecutorInbox": engine.ExecutorInbox,
    "SamplerInbox": engine.SamplerInbox,
    "SchedulerInbox": engine.SchedulerInbox,
    "FrontDoorInbox": engine.FrontDoorInbox,
    "KvInbox": engine.KvInbox,
    "KvReply": engine.KvReply,
    "ClientRequest": client.ClientRequest,
    "ClientEvent": client.ClientEvent,
}
_INT64 = (-(2**63), 2**63 - 1)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(*_INT64) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
_ARRAYS = hnp.arrays(
    st.sampled_from([np.float32, np.float16, np.int64, np.int32, np.uint8, np.bool_]),
    hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=6),
)


def _bounded(lo: Any, hi: Any, gt: Any, ge: Any, lt: Any, le: Any) -> tuple[Any, Any, bool, bool]:
    """(min, max, exclude_min, exclude_max) of a msgspec numeric constraint."""
    lo, ex_lo = (gt, True) if gt is not None else (ge, False) if ge is not None else (lo, False)
    hi, ex_hi = (lt, True) if lt is not None else (le, False) if le is not None else (hi, False)
    return lo, hi, ex_lo, ex_hi


def strategy_of(t: mi.Type) -> st.SearchStrategy:
    """Values valid for a msgspec type, constraints (Meta) included, small enough to be quick."""
    if isinstance(t, mi.StructType):
        required = {f.name: strategy_of(f.type) for f in t.fields if f.required}
        optional = {f.name: strategy_of(f.type) for f in t.fields if not f.required}
        return st.fixed_dictionaries(required, optional=optional).map(lambda kw: t.cls(**kw))
    if isinstance(t, mi.UnionType):
        return st.one_of([strategy_of(u) for u in t.types])
    if isinstance(t, mi.ListType):
        return st.lists(strategy_of(t.item_type), min_size=t.min_length or 0, max_size=min(t.max_length or 3, 3))
    if isinstance(t, mi.TupleType):
        return st.tuples(*(strategy_of(u) for u in t.item_types))
    if isinstance(t, mi.DictType):
        return st.dictionaries(strategy_of(t.key_type), strategy_of(t.value_type), min_size=t.min_length or 0,
                               max_size=min(t.max_length or 3, 3))
    if isinstance(t, mi.IntType):
        assert t.multiple_of is None, t
        lo, hi, ex_lo, ex_hi = _bounded(*_INT64, t.gt, t.ge, t.lt, t.le)
        return st.integers(lo + ex_lo, hi - ex_hi)
    if isinstance(t, mi.FloatType):
        lo, hi, ex_lo, ex_hi = _bounded(None, None, t.gt, t.ge, t.lt, t.le)
        return st.floats(lo, hi, exclude_min=ex_lo, exclude_max=ex_hi, allow_nan=False)
    if isinstance(t, mi.StrType):
        lo, hi = t.min_length or 0, min(t.max_length or 12, 12)
        if t.pattern is not None:
            return st.from_regex(t.pattern, fullmatch=True).filter(
                lambda v: (t.min_length or 0) <= len(v) <= (t.max_length or len(v)))
        return st.text(min_size=lo, max_size=max(lo, hi))
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.CustomType) and t.cls is np.ndarray:
        return _ARRAYS
    simple = {mi.BoolType: st.booleans(), mi.NoneType: st.none(), mi.AnyType: _JSON}
    assert type(t) in simple, f"no strategy for {t}: add one here"
    return simple[type(t)]


def same(a: Any, b: Any) -> bool:
    """a == b, with numpy arrays compared by dtype, shape and bytes (NaN included)."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, msgspec.Struct):
        return type(a) is type(b) and all(same(getattr(a, f), getattr(b, f)) for f in a.__struct_fields__)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _members(union: Any) -> list[type]:
    info = mi.type_info(union)
    return [u.cls for u in info.types] if isinstance(info, mi.UnionType) else [info.cls]


BUS_MESSAGES = [(name, cls) for name, union in BUS_UNIONS.items() for cls in _members(union)]


@pytest.mark.parametrize("name,cls", BUS_MESSAGES, ids=[f"{n}-{c.__name__}" for n, c in BUS_MESSAGES])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_bus_message_round_trips(name, cls, data):
    """Every Struct of every union the bus decodes, with any valid field values (arrays
    of every shape and dtype included), decodes through its union's codec to what was encoded."""
    codec = Codec(BUS_UNIONS[name])
    msg = data.draw(strategy_of(mi.type_info(cls)), label="message")
    got = codec.decode([bytes(f) for f in codec.encode(msg)])
    assert same(got, msg), (got, msg)
