"""The feed link's wire: each node's agent and the cluster's watcher over one TCP connection,
so no node needs a shared file system (nor root on it: root squash is fine) and nothing in
slurmctld's locks or a job's launch path waits on one.

A connection opens with a handshake that proves both ends are root on a host of the site and
agrees a session key no one else knows; every later frame carries an HMAC-SHA256 under that
key over its direction, its number in the stream and its bytes, so a frame cannot be forged,
changed, replayed or reordered. Two ways to prove it (``LinkAuth``):

- ``MungeAuth``: what every auth/munge site has. Each side sends a MUNGE credential only root
  may decode (uid restriction 0) carrying its nonce and a random secret half; munged checks
  the sender was root and refuses a replayed credential. The session key hashes both halves.
- ``KeyAuth``: a key file only root reads on every host (auth/slurm sites, or no munge):
  HMACs of the nonces under the key.

Frames: a 4-byte big-endian length, then the body. The handshake's bodies are JSON; after
it, a body is the 32-byte HMAC then a JSON object (``Session.seal``). Pure, but for the socket
options both ends set (``keepalive``).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import struct
from dataclasses import dataclass
from typing import Iterator, Protocol

from malleable_protocol import ProtocolError, check_node_name
from malleable_protocol.errors import FixableError
from malleable_protocol.records import decode_json_bounded

from slurm_plugin.feed.model import MAX_FEED_BYTES
from slurm_plugin.feed.munge import Munge, MungeError

VERSION = b"malleable-feed-link/1"
DEFAULT_PORT = 6826              # Slurm's own are 6817-6819 (and slurmrestd's 6820)
MAX_FRAME_BYTES = MAX_FEED_BYTES * 2 + 4096   # a feed file as JSON text inside a message
MAX_HANDSHAKE_BYTES = 4096
NONCE_BYTES = 32
_LENGTH = struct.Struct(">I")
_MAC_BYTES = 32


class LinkError(ProtocolError):
    """The other end broke the protocol (a bad frame, a bad MAC): the connection is closed."""


class LinkAuthError(LinkError):
    """The other end did not prove it is root on a host of the site."""


def keepalive(sock: "socket.socket") -> None:
    """A peer whose host went away is noticed within about 30 s, idle (the kernel's probes) or
    not (unacknowledged data: TCP_USER_TIMEOUT), not after the kernel's 15 minutes."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", 30_000)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def frame(body: bytes) -> bytes:
    return _LENGTH.pack(len(body)) + body


class FrameReader:
    """Splits a byte stream into frame bodies, refusing any over ``max_bytes`` before reading
    it (a peer cannot make the reader hold more). Pure."""

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES):
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[bytes]:
        self._buf += data
        while len(self._buf) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buf)
            if length > self.max_bytes:
                raise LinkError(f"a frame of {length} bytes (at most {self.max_bytes})")
            if len(self._buf) < _LENGTH.size + length:
                return
            body = bytes(self._buf[_LENGTH.size:_LENGTH.size + length])
            del self._buf[:_LENGTH.size + length]
            yield body

    def take_rest(self) -> bytes:
        """The bytes after the last frame given (the handshake's reader hands the stream's
        first frames, sent right behind the handshake, to the session's)."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest


class Session:
    """One side of an open connection: seals what it sends, opens what it receives, each
    direction numbered from 0. Pure."""

    def __init__(self, key: bytes, *, client: bool):
        self._key = key
        self._out_dir, self._in_dir = (b"c", b"s") if client else (b"s", b"c")
        self._out_seq = 0
        self._in_seq = 0

    def _mac(self, direction: bytes, seq: int, body: bytes) -> bytes:
        return hmac.new(self._key, direction + seq.to_bytes(8, "big") + body,
                        hashlib.sha256).digest()

    def seal(self, message: dict) -> bytes:
        body = json.dumps(message, sort_keys=True, separators=(",", ":")).encode()
        mac = self._mac(self._out_dir, self._out_seq, body)
        self._out_seq += 1
        return frame(mac + body)

    def open(self, body: bytes) -> dict:
        if len(body) < _MAC_BYTES or not hmac.compare_digest(
                body[:_MAC_BYTES], self._mac(self._in_dir, self._in_seq, body[_MAC_BYTES:])):
            raise LinkError("a frame whose MAC does not match (forged, changed or replayed)")
        self._in_seq += 1
        try:
            message = decode_json_bounded(body[_MAC_BYTES:], max_bytes=MAX_FRAME_BYTES,
                                          max_depth=3)
        except ProtocolError as exc:
            raise LinkError(f"a bad message: {exc}") from None
        if not isinstance(message.get("t"), str):
            raise LinkError("a message without a type")
        return message


def message_data(message: dict) -> bytes:
    """A file message's bytes (its ``data``, JSON text); LinkError without them."""
    data = message.get("data")
    if not isinstance(data, str):
        raise LinkError("a message without its data")
    return data.encode()


# --- authentication -----------------------------------------------------------------------

class LinkAuth(Protocol):
    """How each end proves it is root on a host of the site. ``client_token`` and
    ``server_token`` return (what is sent, this side's secret half); the checks return the
    other side's secret half or raise LinkAuthError."""

    def client_token(self, node: str, client_nonce: bytes) -> tuple[bytes, bytes]: ...
    def check_client(self, node: str, client_nonce: bytes, token: bytes) -> bytes: ...
    def server_token(self, node: str, client_nonce: bytes,
                     server_nonce: bytes) -> tuple[bytes, bytes]: ...
    def check_server(self, node: str, client_nonce: bytes, server_nonce: bytes,
                     token: bytes) -> bytes: ...


def _join(*parts: bytes) -> bytes:
    return b"".join(_LENGTH.pack(len(p)) + p for p in parts)


class KeyAuth:
    """A key file only root reads, the same on every host."""

    def __init__(self, key: bytes):
        if len(key) < 32:
            raise ValueError("a feed link key of fewer than 32 bytes")
        self._key = key

    def _tag(self, *parts: bytes) -> bytes:
        return hmac.new(self._key, _join(VERSION, *parts), hashlib.sha256).digest()

    def client_token(self, node, client_nonce):
        n = node.encode()
        return self._tag(b"client", n, client_nonce), self._tag(b"client-half", n, client_nonce)

    def check_client(self, node, client_nonce, token):
        mine, half = self.client_token(node, client_nonce)
        if not hmac.compare_digest(mine, token):
            raise LinkAuthError(f"node {node}: the link key does not match")
        return half

    def server_token(self, node, client_nonce, server_nonce):
        n = node.encode()
        return (self._tag(b"server", n, client_nonce, server_nonce),
                self._tag(b"server-half", n, client_nonce, server_nonce))

    def check_server(self, node, client_nonce, server_nonce, token):
        mine, half = self.server_token(node, client_nonce, server_nonce)
        if not hmac.compare_digest(mine, token):
            raise LinkAuthError("the watcher's link key does not match")
        return half


class MungeAuth:
    """MUNGE credentials, decodable by root only, carrying the nonces and a secret half."""

    def __init__(self, munge: Munge, *, uid: int = 0, ttl: int = 60):
        self._munge, self._uid, self._ttl = munge, uid, ttl

    def _encode(self, *parts: bytes) -> tuple[bytes, bytes]:
        half = os.urandom(32)
        try:
            cred = self._munge.encode(_join(VERSION, *parts, half), uid_restriction=self._uid,
                                      ttl=self._ttl)
        except MungeError as exc:
            raise LinkAuthError(f"munge: {exc}") from None
        return cred, half

    def _decode(self, token: bytes, *parts: bytes) -> bytes:
        try:
            got = self._munge.decode(token)
        except MungeError as exc:       # replayed, expired, not the site's key, munged down
            raise LinkAuthError(f"munge: {exc}") from None
        if got.uid != self._uid:
            raise LinkAuthError(f"a credential of uid {got.uid}, not {self._uid}")
        head = _join(VERSION, *parts)
        rest = got.payload[len(head):]
        if not got.payload.startswith(head) or len(rest) != _LENGTH.size + 32:
            raise LinkAuthError("a credential for another connection")
        return rest[_LENGTH.size:]

    def client_token(self, node, client_nonce):
        return self._encode(b"client", node.encode(), client_nonce)

    def check_client(self, node, client_nonce, token):
        return self._decode(token, b"client", node.encode(), client_nonce)

    def server_token(self, node, client_nonce, server_nonce):
        return self._encode(b"server", node.encode(), client_nonce, server_nonce)

    def check_server(self, node, client_nonce, server_nonce, token):
        return self._decode(token, b"server", node.encode(), client_nonce, server_nonce)


def session_key(node: str, client_nonce: bytes, server_nonce: bytes, client_half: bytes,
                server_half: bytes) -> bytes:
    return hashlib.sha256(_join(VERSION, node.encode(), client_nonce, server_nonce,
                                client_half, server_half)).digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(value: object, what: str, max_bytes: int = MAX_HANDSHAKE_BYTES) -> bytes:
    if not isinstance(value, str) or len(value) > max_bytes:
        raise LinkAuthError(f"a bad {what}")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise LinkAuthError(f"a bad {what}") from None


def _handshake_body(body: bytes) -> dict:
    try:
        d = decode_json_bounded(body, max_bytes=MAX_HANDSHAKE_BYTES, max_depth=1)
    except ProtocolError as exc:
        raise LinkAuthError(f"a bad handshake: {exc}") from None
    if d.get("v") != VERSION.decode():
        raise LinkAuthError(f"another protocol: {str(d.get('v'))[:40]!r} (this is "
                            f"{VERSION.decode()})")
    return d


@dataclass
class ClientHandshake:
    """The agent's side: ``hello()`` to send, then ``finish(reply)`` gives the Session."""

    node: str
    auth: LinkAuth

    def hello(self) -> bytes:
        self._nonce = os.urandom(NONCE_BYTES)
        token, self._half = self.auth.client_token(self.node, self._nonce)
        return frame(json.dumps({"v": VERSION.decode(), "node": self.node,
                                 "nonce": _b64(self._nonce), "token": _b64(token)}).encode())

    def finish(self, body: bytes) -> Session:
        d = _handshake_body(body)
        if "error" in d:
            raise LinkAuthError(f"the watcher refused: {str(d['error'])[:200]}")
        server_nonce = _unb64(d.get("nonce"), "nonce")
        half = self.auth.check_server(self.node, self._nonce, server_nonce,
                                      _unb64(d.get("token"), "token"))
        return Session(session_key(self.node, self._nonce, server_nonce, self._half, half),
                       client=True)


def server_handshake(body: bytes, auth: LinkAuth) -> tuple[str, bytes, Session]:
    """The watcher's side: the client's hello -> (its node, the reply to send, the Session)."""
    d = _handshake_body(body)
    try:
        node = check_node_name(d.get("node"))
    except ValueError as exc:
        raise LinkAuthError(str(exc)) from None
    nonce = _unb64(d.get("nonce"), "nonce")
    if len(nonce) != NONCE_BYTES:
        raise LinkAuthError("a bad nonce")
    client_half = auth.check_client(node, nonce, _unb64(d.get("token"), "token"))
    server_nonce = os.urandom(NONCE_BYTES)
    token, half = auth.server_token(node, nonce, server_nonce)
    reply = frame(json.dumps({"v": VERSION.decode(), "nonce": _b64(server_nonce),
                              "token": _b64(token)}).encode())
    return node, reply, Session(session_key(node, nonce, server_nonce, client_half, half),
                                client=False)


def refusal(reason: str) -> bytes:
    return frame(json.dumps({"v": VERSION.decode(), "error": reason[:200]}).encode())


class LinkKeyError(FixableError):
    """The link's key file cannot be used: which, and why."""


def load_key(path: str) -> bytes:
    """A key file: root's, readable by no one else (refused otherwise), at least 32 bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_uid != 0 or st.st_mode & 0o077:
            raise LinkKeyError(f"{path}: the feed link key must be root's and readable by "
                                f"no one else (chmod 600), not mode {st.st_mode & 0o777:o} "
                                f"uid {st.st_uid}")
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    if len(data.strip()) < 32:
        raise LinkKeyError(f"{path}: a feed link key of fewer than 32 bytes (make one with "
                           "`head -c 48 /dev/urandom | base64 > FILE`)")
    return data.strip()


def link_auth(setting: str, munge_socket: str | None = None) -> LinkAuth:
    """The authentication an agent.json names: "munge" or "key:PATH"."""
    if setting == "munge":
        try:
            return MungeAuth(Munge(munge_socket))
        except MungeError as exc:
            raise LinkKeyError(str(exc)) from None
    if setting.startswith("key:"):
        return KeyAuth(load_key(setting[4:]))
    raise LinkKeyError(f"feed_link_auth {setting!r}: munge or key:PATH")
