"""The feed link's wire (feed/link.py): frames, the handshake, sealed messages."""
from __future__ import annotations

import json
import os
from pathlib import Path

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


# --- the settings that name the link (agent.json) ---------------------------------------------

def test_agent_json_names_the_link_and_each_nodes_own_folder():
    from slurm_plugin.node.config import AgentConfig
    base = AgentConfig(node="(set by SLURMD_NODENAME or --node)", feed_dir=Path("/run/feed/%n"),
                       feed_link_hosts=("ctl1", "ctl2"), feed_link_auth="key:/etc/k",
                       watcher_dir=Path("/var/lib/w"))
    text = base.to_json()
    node = AgentConfig.from_json(text, node="n7")
    assert str(node.feed_dir) == "/run/feed/n7" and node.feed_link_hosts == ("ctl1", "ctl2")
    assert str(node.watcher_feed_dir) == "/var/lib/w"
    # Loaded without a node (the watcher's way): the pattern stays, nothing is guessed.
    assert str(AgentConfig.from_json(text).feed_dir) == "/run/feed/%n"
    for bad in ({"feed_link_auth": "password"}, {"feed_link_auth": "key:relative"},
                {"feed_link_port": 0}, {"feed_link_hosts": [""]}):
        with pytest.raises(ValueError):
            AgentConfig.from_json(text, **bad)


def test_the_watcher_reads_slurmctlds_config_once():
    from slurm_plugin.slurm.parsers import parse_controller_config
    ctl = parse_controller_config(
        "Configuration data as of 2026-11-28T16:00:00\n"
        "AccountingStorageType   = accounting_storage/slurmdbd\n"
        "SlurmUser               = slurm(64030)\nSlurmdUser = root(0)\n"
        "SlurmctldHost[0]        = ctl1(10.0.0.1)\nSlurmctldHost[1]        = ctl2\n"
        "SlurmctldTimeout        = 30 sec\nStateSaveLocation       = /var/spool/slurmctld\n")
    assert (ctl.accounting_storage, ctl.slurm_user_uid, ctl.controllers, ctl.timeout_s,
            ctl.state_save) == ("accounting_storage/slurmdbd", 64030, ("ctl1", "ctl2"), 30.0,
                                "/var/spool/slurmctld")
    assert parse_controller_config("") == type(ctl)()


def test_the_event_file_is_given_to_slurmuser_once(tmp_path):
    from slurm_plugin.feed.store import FeedStore
    store = FeedStore(tmp_path / "w")
    store.prepare()
    store.prepare_events(4242)
    st = os.stat(store.events_file)
    assert (st.st_uid, st.st_mode & 0o777) == (4242, 0o600)
    store.prepare_events(0)              # one the site gave away stays the site's
    assert os.stat(store.events_file).st_uid == 4242
