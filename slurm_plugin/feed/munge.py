"""MUNGE credentials through libmunge (ctypes): what every Slurm site with auth/munge already
runs, so the feed link needs no key of its own there (docs/FACTS.md, "MUNGE from Python").

A credential carries a payload, encrypted and signed with the site's munge key, and the uid
and gid of whoever encoded it; ``uid_restriction`` lets only that uid decode it. Calls go to
munged over its socket and may block (10 s with munged hung): never call them on a loop
that serves anything else.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import enum
from dataclasses import dataclass

_OPT_TTL, _OPT_SOCKET, _OPT_UID_RESTRICTION = 4, 8, 9


class MungeStatus(enum.IntEnum):
    SUCCESS = 0
    SOCKET = 6
    BAD_CRED = 8
    CRED_INVALID = 14
    CRED_EXPIRED = 15
    CRED_REWOUND = 16
    CRED_REPLAYED = 17
    CRED_UNAUTHORIZED = 18


class MungeError(OSError):
    """libmunge refused: ``status`` is its error number."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Decoded:
    payload: bytes
    uid: int
    gid: int


_lib: ctypes.CDLL | None = None


def _libmunge() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("munge") or "libmunge.so.2"
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            raise MungeError(-1, f"libmunge is not installed ({exc}): install munge's "
                             "library (Debian: libmunge2, RHEL: munge-libs), or give the feed "
                             "link a key file") from None
        lib.munge_ctx_create.restype = ctypes.c_void_p
        lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
        lib.munge_ctx_strerror.restype = ctypes.c_char_p
        lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
        lib.munge_strerror.restype = ctypes.c_char_p
        lib.munge_strerror.argtypes = [ctypes.c_int]
        lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_int]
        lib.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.POINTER(ctypes.c_int),
                                     ctypes.POINTER(ctypes.c_uint),
                                     ctypes.POINTER(ctypes.c_uint)]
        # munge_ctx_set is variadic: each call below gives its argument's C type itself.
        lib.free.argtypes = [ctypes.c_void_p]
        _lib = lib
    return _lib


class Munge:
    """Encode and decode through one munged (``socket``: its socket, None: munge's default).
    A context per call: decoding into a context changes it for a later encode."""

    def __init__(self, socket: str | None = None):
        self.socket = socket
        self._lib = _libmunge()

    def _context(self, uid_restriction: int | None = None, ttl: int | None = None) -> int:
        lib = self._lib
        ctx = lib.munge_ctx_create()
        if not ctx:
            raise MungeError(5, "munge_ctx_create failed")
        try:
            if self.socket is not None:
                self._check(ctx, lib.munge_ctx_set(ctypes.c_void_p(ctx), ctypes.c_int(_OPT_SOCKET),
                                                   ctypes.c_char_p(self.socket.encode())))
            if uid_restriction is not None:
                self._check(ctx, lib.munge_ctx_set(ctypes.c_void_p(ctx),
                                                   ctypes.c_int(_OPT_UID_RESTRICTION),
                                                   ctypes.c_uint(uid_restriction)))
            if ttl is not None:
                self._check(ctx, lib.munge_ctx_set(ctypes.c_void_p(ctx), ctypes.c_int(_OPT_TTL),
                                                   ctypes.c_int(ttl)))
        except MungeError:
            lib.munge_ctx_destroy(ctx)
            raise
        return ctx

    def _check(self, ctx: int, status: int) -> None:
        if status != 0:
            text = self._lib.munge_ctx_strerror(ctx) or self._lib.munge_strerror(status)
            raise MungeError(status, (text or b"munge error").decode(errors="replace"))

    def encode(self, payload: bytes, *, uid_restriction: int | None = None,
               ttl: int | None = None) -> bytes:
        lib = self._lib
        ctx = self._context(uid_restriction, ttl)
        cred = ctypes.c_char_p()
        try:
            self._check(ctx, lib.munge_encode(ctypes.byref(cred), ctx, payload, len(payload)))
            value = ctypes.string_at(cred)
        finally:
            if cred:
                lib.free(ctypes.cast(cred, ctypes.c_void_p))
            lib.munge_ctx_destroy(ctx)
        return value

    def decode(self, credential: bytes) -> Decoded:
        """The payload and who encoded it; a replayed, expired or otherwise bad credential
        raises (its payload is not handed back)."""
        lib = self._lib
        ctx = self._context()
        buf, length = ctypes.c_void_p(), ctypes.c_int()
        uid, gid = ctypes.c_uint(), ctypes.c_uint()
        try:
            status = lib.munge_decode(credential, ctx, ctypes.byref(buf), ctypes.byref(length),
                                      ctypes.byref(uid), ctypes.byref(gid))
            payload = ctypes.string_at(buf, length.value) if buf and length.value > 0 else b""
            self._check(ctx, status)
        finally:
            if buf:
                lib.free(buf)
            lib.munge_ctx_destroy(ctx)
        return Decoded(payload, uid.value, gid.value)
