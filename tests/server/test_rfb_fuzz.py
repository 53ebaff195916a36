"""The viewer's RFB parser (gh_server/live/rfb.py ClientStream) under hypothesis: whatever a viewer sends,
however its bytes are split into WebSocket messages, the parser gives the same messages or the same
refusal, passes on exactly the bytes it consumed, holds no more than one unfinished message, and a
read-only stream's dropped key and pointer events are exactly the ones a writable stream would have
given."""

from __future__ import annotations

import itertools
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from gh_server.live.rfb import MAX_CUT_TEXT, ClientStream, Kind, Message, RfbError

HANDSHAKE = b"RFB 003.008\n" + b"\x01" + b"\x01"  # ClientInit shared: passed on as it is

# One whole client message of each kind the parser accepts, its fields drawn by hypothesis.
u8, u16, u32 = st.integers(0, 0xFF), st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF)
MESSAGES = st.one_of(
    st.binary(min_size=19, max_size=19).map(lambda b: b"\x00" + b),
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40).map(
        lambda es: struct.pack(">BxH", 2, len(es)) + b"".join(struct.pack(">i", e) for e in es)),
    st.tuples(u8, u16, u16, u16, u16).map(lambda f: struct.pack(">BBHHHH", 3, *f)),
    st.tuples(u8, u32).map(lambda f: struct.pack(">BBxxI", 4, *f)),
    st.tuples(u8, u16, u16).map(lambda f: struct.pack(">BBHH", 5, *f)),
    st.binary(max_size=300).map(lambda t: struct.pack(">BxxxI", 6, len(t)) + t),
    st.binary(max_size=300).map(lambda t: struct.pack(">Bxxxi", 6, -len(t)) + t),
    st.tuples(u8, u16, u16, u16, u16).map(lambda f: struct.pack(">BBHHHH", 150, *f)),
    st.binary(max_size=64).map(lambda p: struct.pack(">BxxxIB", 248, 0, len(p)) + p),
    st.lists(st.binary(min_size=16, max_size=16), max_size=16).map(
        lambda ss: struct.pack(">BxHHBx", 251, 800, 600, len(ss)) + b"".join(ss)),
    st.tuples(u16, u32, u32).map(lambda f: struct.pack(">BBHII", 255, 0, *f)),
)
DROPPED = {Kind.KEY, Kind.POINTER}


def parse(stream: bytes, cuts: list[int], drop_input: bool = False) -> tuple[list[Message], str | None, int, int]:
    """Feed `stream` split at `cuts`: the messages, the refusal (if any), the bytes left buffered, and
    how many events were dropped."""
    s = ClientStream(drop_input=drop_input)
    out: list[Message] = []
    bounds = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    try:
        for a, b in itertools.pairwise(bounds):
            out += s.feed(stream[a:b])
    except RfbError as e:
        return out, str(e), s.buffered, s.dropped
    return out, None, s.buffered, s.dropped


@settings(max_examples=300, deadline=None, database=None)
@given(stream=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_any_bytes_any_split_give_the_same_messages_or_the_same_refusal(stream: bytes, cuts: list[int]) -> None:
    whole = parse(HANDSHAKE + stream, [])
    split = parse(HANDSHAKE + stream, [c + len(HANDSHAKE) for c in cuts])
    if whole[1] is None and split[1] is None:
        assert [(m.kind, m.data) for m in whole[0]] == [(m.kind, m.data) for m in split[0]]
        consumed = len(HANDSHAKE) + len(stream) - whole[2]
        assert sum(len(m.data) for m in whole[0]) == consumed  # every byte consumed is passed on, once
    else:  # a refusal ends the stream at the same message, however it was split
        assert whole[1] == split[1]


@settings(max_examples=300, deadline=None, database=None)
@given(messages=st.lists(MESSAGES, max_size=30), cuts=st.lists(st.integers(0, 20000), max_size=8))
def test_whole_messages_come_out_as_sent_and_a_read_only_stream_drops_only_key_and_pointer_events(
        messages: list[bytes], cuts: list[int]) -> None:
    stream = HANDSHAKE + b"".join(messages)
    out, refused, left, _ = parse(stream, cuts)
    assert refused is None and left == 0
    assert [m.data for m in out[3:]] == messages
    dropping, refused, left, dropped = parse(stream, cuts, drop_input=True)
    assert refused is None and left == 0
    kept = [m for m in out if m.kind not in DROPPED]
    assert [(m.kind, m.data) for m in dropping] == [(m.kind, m.data) for m in kept]
    assert dropped == len(out) - len(kept)


@settings(max_examples=100, deadline=None, database=None)
@given(length=st.integers(MAX_CUT_TEXT + 1, 2**31 - 1), negative=st.booleans())
def test_a_clipboard_over_its_bound_is_refused_from_its_header(length: int, negative: bool) -> None:
    header = struct.pack(">Bxxxi", 6, -length if negative else length)
    _, refused, _, _ = parse(HANDSHAKE + header, [])
    assert refused is not None and "ClientCutText" in refused
