"""The feed link's wire (feed/link.py): frames, the handshake, sealed messages."""
from __future__ import annotations

import json
import os

import pytest

from slurm_plugin.feed.link import (ClientHandshake, FrameReader, KeyAuth, LinkAuthError,
                                    LinkError, LinkKeyError, frame, load_key, server_handshake)

KEY = b"k" * 40


def _open_pair(client_auth=KeyAuth(KEY), server_auth=KeyAuth(KEY), node="n1"):
    hand = ClientHandshake(node, client_auth)
    hello = hand.hello()
    (body,) = FrameReader().feed(hello)
    got_node, reply, server = server_handshake(body, server_auth)
    (reply_body,) = FrameReader().feed(reply)
    return got_node, hand.finish(reply_body), server


def test_frames_split_a_stream_at_any_byte():
    stream = frame(b"one") + frame(b"") + frame(b"three" * 100)
    reader = FrameReader()
    got = [body for i in range(len(stream)) for body in reader.feed(stream[i:i + 1])]
    assert got == [b"one", b"", b"three" * 100]


def test_a_frame_over_the_limit_is_refused_before_it_is_read():
    with pytest.raises(LinkError, match="a frame of"):
        list(FrameReader(max_bytes=10).feed((11).to_bytes(4, "big")))


def test_both_ends_agree_a_key_and_messages_go_both_ways():
    node, client, server = _open_pair()
    assert node == "n1"
    for m in ({"t": "poke"}, {"t": "offers", "data": "{}"}):
        (body,) = FrameReader().feed(client.seal(m))
        assert server.open(body) == m
    (body,) = FrameReader().feed(server.seal({"t": "polled", "at": 1.5}))
    assert client.open(body) == {"t": "polled", "at": 1.5}


def test_a_changed_replayed_reordered_or_reflected_frame_is_refused():
    _, client, server = _open_pair()
    first = next(FrameReader().feed(client.seal({"t": "poke"})))
    second = next(FrameReader().feed(client.seal({"t": "ping"})))
    changed = first[:-2] + b"x}"
    with pytest.raises(LinkError, match="MAC"):
        server.open(changed)
    with pytest.raises(LinkError, match="MAC"):
        server.open(second)                   # out of order
    server.open(first)
    with pytest.raises(LinkError, match="MAC"):
        server.open(first)                    # replayed
    # A frame the client sent, sent back to the client (another direction): refused.
    _, client2, _ = _open_pair()
    own = next(FrameReader().feed(client2.seal({"t": "poke"})))
    with pytest.raises(LinkError, match="MAC"):
        client2.open(own)


def test_another_key_is_refused_on_either_side():
    with pytest.raises(LinkAuthError, match="does not match"):
        _open_pair(client_auth=KeyAuth(b"x" * 40))
    hand = ClientHandshake("n1", KeyAuth(KEY))
    (body,) = FrameReader().feed(hand.hello())
    _, reply, _ = server_handshake(body, KeyAuth(KEY))
    impostor = ClientHandshake("n1", KeyAuth(b"y" * 40))
    impostor._nonce, impostor._half = hand._nonce, hand._half
    with pytest.raises(LinkAuthError, match="watcher's link key"):
        impostor.finish(next(FrameReader().feed(reply)))


def test_a_hello_for_another_node_or_version_is_refused():
    hand = ClientHandshake("n1", KeyAuth(KEY))
    d = json.loads(next(FrameReader().feed(hand.hello())))
    with pytest.raises(LinkAuthError, match="does not match"):
        server_handshake(json.dumps({**d, "node": "n2"}).encode(), KeyAuth(KEY))
    with pytest.raises(LinkAuthError, match="another protocol"):
        server_handshake(json.dumps({**d, "v": "x"}).encode(), KeyAuth(KEY))
    with pytest.raises(LinkAuthError):
        server_handshake(json.dumps({**d, "node": "../x"}).encode(), KeyAuth(KEY))
    with pytest.raises(LinkAuthError):
        server_handshake(b"\xff" * 10, KeyAuth(KEY))


def test_a_replayed_hello_gives_a_session_its_sender_cannot_use():
    """Key mode keeps no replay cache: the replayer gets a reply, but the session key needs
    the link key, so its first frame fails."""
    hand = ClientHandshake("n1", KeyAuth(KEY))
    (hello,) = FrameReader().feed(hand.hello())
    server_handshake(hello, KeyAuth(KEY))
    _, _, server = server_handshake(hello, KeyAuth(KEY))
    from slurm_plugin.feed.link import Session
    guess = Session(b"\0" * 32, client=True)
    with pytest.raises(LinkError, match="MAC"):
        server.open(next(FrameReader().feed(guess.seal({"t": "poke"}))))


def test_key_files_must_be_roots_alone_and_long(tmp_path):
    path = tmp_path / "link.key"
    path.write_bytes(b"z" * 48 + b"\n")
    os.chmod(path, 0o644)
    with pytest.raises(LinkKeyError, match="chmod 600"):
        load_key(str(path))
    os.chmod(path, 0o600)
    assert load_key(str(path)) == b"z" * 48
    path.write_bytes(b"short")
    with pytest.raises(LinkKeyError, match="fewer than 32"):
        load_key(str(path))
