"""gh_server/live's pure parts: the viewer's RFB stream parsed (rfb.py) and view tickets (tickets.py)."""

from __future__ import annotations

import struct

import pytest

from gh_server.live.rfb import INPUT_KINDS, ClientStream, Kind, RfbError
from gh_server.live.tickets import Tickets, TooManyTickets

HANDSHAKE = b"RFB 003.008\n" + b"\x01" + b"\x00"  # version, security None, ClientInit asking for exclusive


def ready() -> ClientStream:
    s = ClientStream()
    kinds = [m.kind for m in s.feed(HANDSHAKE)]
    assert kinds == [Kind.VERSION, Kind.SECURITY, Kind.CLIENT_INIT]
    return s


def test_the_handshake_is_passed_on_with_the_display_shared() -> None:
    msgs = ClientStream().feed(HANDSHAKE)
    assert b"".join(m.data for m in msgs) == b"RFB 003.008\n\x01\x01"  # ClientInit's 0 became 1 (shared)


def test_messages_split_across_and_within_frames_come_out_whole_and_in_order() -> None:
    s = ready()
    pixel_format = b"\x00\x00\x00\x00" + struct.pack(">BBBBHHHBBB3x", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)
    encodings = struct.pack(">BxH", 2, 3) + struct.pack(">iii", 0, -223, -258)
    request = struct.pack(">BBHHHH", 3, 1, 0, 0, 720, 400)
    key = struct.pack(">BBxxI", 4, 1, ord("a"))
    pointer = struct.pack(">BBHH", 5, 1, 10, 20)
    cut = struct.pack(">BxxxI", 6, 5) + b"hello"
    cont = struct.pack(">BBHHHH", 150, 1, 0, 0, 720, 400)
    fence = struct.pack(">BxxxIB", 248, 0x80000000, 3) + b"abc"
    size = struct.pack(">BxHHBx", 251, 800, 600, 1) + bytes(16)
    qkey = struct.pack(">BBHII", 255, 0, 1, ord("a"), 30)
    stream = pixel_format + encodings + request + key + pointer + cut + cont + fence + size + qkey
    out = []
    for i in range(0, len(stream), 3):  # three bytes at a time: every message split somewhere
        out += s.feed(stream[i:i + 3])
    assert [m.kind for m in out] == [Kind.SET_PIXEL_FORMAT, Kind.SET_ENCODINGS, Kind.UPDATE_REQUEST, Kind.KEY,
                                     Kind.POINTER, Kind.CUT_TEXT, Kind.CONTINUOUS_UPDATES, Kind.FENCE,
                                     Kind.SET_DESKTOP_SIZE, Kind.QEMU_KEY]
    assert b"".join(m.data for m in out) == stream
    assert out[3].key_down and out[9].key_down
    assert s.buffered == 0


def test_input_kinds_are_what_changes_the_machine() -> None:
    assert INPUT_KINDS == {Kind.KEY, Kind.POINTER, Kind.CUT_TEXT, Kind.QEMU_KEY, Kind.SET_DESKTOP_SIZE}


def test_a_key_release_is_not_a_press() -> None:
    [msg] = ready().feed(struct.pack(">BBxxI", 4, 0, 0xFF0D))
    assert msg.kind is Kind.KEY and not msg.key_down


@pytest.mark.parametrize("data, what", [
    (b"RFB 003.003\n", "version"),
    (b"GET / HTTP/1.1\r\n", "not 3.8"),
    (b"GET /", "not an RFB"),
])
def test_other_versions_and_protocols_are_refused(data: bytes, what: str) -> None:
    with pytest.raises(RfbError, match=what):
        ClientStream().feed(data)


def test_a_security_type_other_than_none_is_refused() -> None:
    with pytest.raises(RfbError, match="security type 2"):
        ClientStream().feed(b"RFB 003.008\n\x02")


@pytest.mark.parametrize("msg, what", [
    (b"\x07", "type 7"),  # FileTransfer and friends: not ours
    (b"\xff\x01\x00\x00", "subtype 1"),  # QEMU audio
    (struct.pack(">BxxxI", 6, 2 * 1024 * 1024), "over the"),  # a 2 MiB paste
    (struct.pack(">BxxxI", 6, (-2 * 1024 * 1024) & 0xFFFFFFFF), "over the"),  # the extended clipboard's form
    (struct.pack(">BxxxIB", 248, 0, 65), "payload"),
    (struct.pack(">BxHHBx", 251, 1, 1, 200), "screens"),
    (struct.pack(">BxH", 2, 5000), "encodings"),
])
def test_unknown_and_oversized_messages_end_the_stream(msg: bytes, what: str) -> None:
    with pytest.raises(RfbError, match=what):
        ready().feed(msg)


def test_a_ticket_is_taken_once() -> None:
    t = Tickets()
    ticket = t.issue(key_id="ak_1", key_name="me", read_only=True, start_state_id="ss_1")
    assert ticket.value.startswith("lv_") and len(ticket.value) > 40
    assert t.take(ticket.value) == ticket
    assert t.take(ticket.value) is None
    assert t.take("lv_unknown") is None


def test_a_ticket_expires() -> None:
    now = [100.0]
    t = Tickets(ttl=30, clock=lambda: now[0])
    ticket = t.issue(key_id="ak_1", key_name="me", read_only=False, start_state_id="ss_1")
    now[0] += 30
    assert t.take(ticket.value) is None


def test_tickets_are_bounded_and_expired_ones_make_room() -> None:
    now = [0.0]
    t = Tickets(ttl=30, clock=lambda: now[0], limit=2)
    for _ in range(2):
        t.issue(key_id="ak_1", key_name="me", read_only=False, start_state_id="ss_1")
    with pytest.raises(TooManyTickets):
        t.issue(key_id="ak_1", key_name="me", read_only=False, start_state_id="ss_1")
    now[0] += 31
    t.issue(key_id="ak_1", key_name="me", read_only=False, attempt_id="at_1")


def test_a_ticket_is_for_one_machine() -> None:
    with pytest.raises(ValueError):
        Tickets().issue(key_id="ak_1", key_name="me", read_only=False)
    with pytest.raises(ValueError):
        Tickets().issue(key_id="ak_1", key_name="me", read_only=False, start_state_id="ss_1", attempt_id="at_1")


def test_tickets_are_bounded_per_key() -> None:
    """One key cannot take the others' tickets: its own run out at MAX_TICKETS_PER_KEY (the pool was one
    4,096 across every key), and a ticket whose purpose was refused is discarded."""
    t = Tickets(per_key=3)
    issued = [t.issue(key_id="ak_1", key_name="me", read_only=True, attempt_id="at_1") for _ in range(3)]
    with pytest.raises(TooManyTickets):
        t.issue(key_id="ak_1", key_name="me", read_only=True, attempt_id="at_1")
    t.issue(key_id="ak_2", key_name="you", read_only=True, attempt_id="at_1")
    t.discard(issued[0].value)
    assert t.take(issued[0].value) is None
    t.issue(key_id="ak_1", key_name="me", read_only=True, attempt_id="at_1")


def test_tickets_per_key_default_leaves_room_for_other_keys() -> None:
    from gh_server.live.tickets import MAX_TICKETS_PER_KEY

    t = Tickets()
    for _ in range(MAX_TICKETS_PER_KEY):
        t.issue(key_id="ak_1", key_name="me", read_only=True, attempt_id="at_1")
    with pytest.raises(TooManyTickets):
        t.issue(key_id="ak_1", key_name="me", read_only=True, attempt_id="at_1")
    assert MAX_TICKETS_PER_KEY < 4096


def test_one_key_is_given_watchers_tickets_at_its_rate() -> None:
    """Issue 49: a key that opens and drops views in a loop is admitted for a watcher's ticket at
    TICKETS_PER_KEY_PER_S after a burst of TICKET_BURST_PER_KEY; another key is not held back by it, nor is a
    view that drives (issued without `admit`)."""
    from gh_server.live.tickets import TICKET_BURST_PER_KEY, TICKETS_PER_KEY_PER_S

    now = [0.0]
    t = Tickets(clock=lambda: now[0])
    for _ in range(TICKET_BURST_PER_KEY):
        t.admit("ak_1")
    with pytest.raises(TooManyTickets, match="the next in"):
        t.admit("ak_1")
    t.admit("ak_2")
    t.issue(key_id="ak_1", key_name="me", read_only=False, attempt_id="at_1")  # a takeover's holder's
    now[0] += 1 / TICKETS_PER_KEY_PER_S
    t.admit("ak_1")
    with pytest.raises(TooManyTickets):
        t.admit("ak_1")
