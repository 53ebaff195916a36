"""The frame-limit helper both sides call before sending (`gh_wire.protocol.encode_checked`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gh_wire import protocol


def test_the_limit_counts_utf8_bytes_as_the_peer_does() -> None:
    # websockets' max_size and uvicorn's ws_max_size count the UTF-8 payload, not characters.
    msg = protocol.ErrorMsg(code="internal", message="é" * 600)
    frame = protocol.encode(msg)
    assert protocol.frame_bytes(frame) == len(frame.encode()) > len(frame)
    with pytest.raises(protocol.FrameTooLarge) as caught:
        protocol.encode_checked(msg, limit=len(frame))
    assert caught.value.size == len(frame.encode()) and caught.value.msg_type == "error"
    assert protocol.encode_checked(msg, limit=len(frame.encode())) == frame


def test_a_too_large_answer_becomes_a_typed_refusal_that_fits() -> None:
    big = protocol.MachineResponse(request_id="rq1", ok=True, stdout="x" * 5000)
    with pytest.raises(protocol.FrameTooLarge) as caught:
        protocol.encode_checked(big, limit=4096)
    stand_in = protocol.too_large_reply(big, caught.value)
    assert isinstance(stand_in, protocol.MachineResponse)
    assert stand_in.request_id == "rq1" and not stand_in.ok
    assert stand_in.refusal == protocol.MachineRefusal.RESPONSE_TOO_LARGE
    assert protocol.frame_bytes(protocol.encode_checked(stand_in, limit=4096)) < 4096
    frame = protocol.ReplayFrame(attempt_id="at_1", seq=0, at=datetime.now(UTC), label="last", png_b64="A" * 5000)
    with pytest.raises(protocol.FrameTooLarge) as caught:
        protocol.encode_checked(frame, limit=4096)
    assert protocol.too_large_reply(frame, caught.value) is None  # no stand-in: dropped, logged
