"""File access for paths another user may control: no links followed, no blocking on a FIFO,
regular files only, bounded reads and listings. Root's writes go only to folders that root owns
and nobody else can write."""
from __future__ import annotations

import errno
import os
import stat
import struct
from pathlib import Path
from typing import Callable

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    pass


def open_dir(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> int:
    """A descriptor of the folder ``path`` (relative to ``dir_fd`` when given); its last
    component must not be a link."""
    return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)


def read_bounded(name: str | os.PathLike[str], max_bytes: int, *, dir_fd: int | None = None,
                 owner: int | None = None) -> bytes:
    """The bytes of a regular file, refusing links, FIFOs, devices, files over ``max_bytes``
    and, with ``owner``, files another uid owns."""
    fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(errno.EINVAL, f"{name}: not a regular file")
        if owner is not None and st.st_uid != owner:
            raise UnsafePath(errno.EPERM, f"{name}: owned by uid {st.st_uid}, not {owner}")
        if st.st_size > max_bytes:
            raise UnsafePath(errno.EFBIG, f"{name}: {st.st_size} bytes (limit {max_bytes})")
        data = os.read(fd, max_bytes + 1)
        if len(data) > max_bytes:
            raise UnsafePath(errno.EFBIG, f"{name}: over {max_bytes} bytes")
        return data
    finally:
        os.close(fd)


def list_bounded(dir_fd: int, max_entries: int) -> list[str]:
    """At most ``max_entries`` names of the folder: a folder of millions is never read whole."""
    out: list[str] = []
    with os.scandir(dir_fd) as it:
        for entry in it:
            if len(out) >= max_entries:
                break
            out.append(entry.name)
    return out


def ensure_private_dir(path: Path, mode: int = 0o755) -> Path:
    """Make (or check) a folder owned by us that no one else can write: the only kind of
    folder root writes files in. ``mode`` is the most it may allow: a folder made here gets
    it, one found allowing more is narrowed (the jobs and targets folders are 0711: reachable
    by name, not listed; /run is made anew at each boot, not only at install)."""
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    fd = open_dir(path)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UnsafePath(errno.EPERM, f"{path}: owned by uid {st.st_uid}")
        allowed = stat.S_IMODE(st.st_mode) & mode & ~0o022
        if allowed != stat.S_IMODE(st.st_mode):
            os.fchmod(fd, allowed)
    finally:
        os.close(fd)
    return path


def write_atomic(folder: Path, name: str, data: bytes, mode: int = 0o644, *,
                 prepare: Callable[[int], None] | None = None) -> None:
    """Write ``folder/name`` whole or not at all, in a folder only we can write (checked).
    ``prepare(fd)`` runs on the new file before it takes the name (its owner, group or ACL:
    the file is never seen under its name with any other)."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"bad file name {name!r}")
    dfd = open_dir(folder)
    try:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise UnsafePath(errno.EPERM, f"{folder}: others can write there")
        tmp = f".{name}.{os.getpid()}.tmp"
        try:
            os.unlink(tmp, dir_fd=dfd)   # left by a killed writer of the same pid
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                if prepare is not None:
                    prepare(f.fileno())
                f.write(data)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    finally:
        os.close(dfd)


def append_capped(path: Path, text: str, max_bytes: int, mode: int = 0o600) -> None:
    """Append ``text`` to a log in a folder only root writes. A log past ``max_bytes`` is first
    renamed ``<name>.1`` (the older one dropped): a log never holds more than twice that, so
    a stream of events, however long, cannot fill the file system it shares with root's state."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    path = Path(path)
    fd = os.open(path, flags, mode)
    try:
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) & ~mode:   # made by an older version (0644): made private
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & mode)
        if st.st_size >= max_bytes:
            os.close(fd)
            fd = -1
            os.replace(path, path.with_name(path.name + ".1"))
            fd = os.open(path, flags, mode)
        os.write(fd, text.encode())
    finally:
        if fd >= 0:
            os.close(fd)


# A POSIX access ACL as the kernel takes it in the xattr (linux/posix_acl_xattr.h): a version,
# then (tag, permissions, id) entries sorted by tag.
_ACL_XATTR = "system.posix_acl_access"
_ACL_VERSION = 2
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_MASK, _ACL_OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_ACL_NO_ID = 0xFFFFFFFF
_NO_ACL = {errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS}


def _acl_owner_and_reader(uid: int) -> bytes:
    """owner rw-, user:<uid> r--, group ---, mask r--, other ---."""
    entries = [(_ACL_USER_OBJ, 6, _ACL_NO_ID), (_ACL_USER, 4, uid), (_ACL_GROUP_OBJ, 0, _ACL_NO_ID),
               (_ACL_MASK, 4, _ACL_NO_ID), (_ACL_OTHER, 0, _ACL_NO_ID)]
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def _primary_gid(uid: int) -> int | None:
    import pwd
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return None


def share_read_with(fd: int, uid: int, *,
                    primary_gid: Callable[[int], int | None] = _primary_gid) -> str:
    """Let user ``uid`` (and nobody else but us) read the file we own and just created, without
    letting them change it: they never own it (an owner can chmod). Returns how:

    - ``"acl"``: mode 0600 plus a POSIX ACL entry ``user:<uid>:r--`` (group and others none):
      exactly that user, whatever groups it shares with others.
    - ``"group"``: the filesystem has no ACLs: group = the user's primary group, mode 0640. Other
      members of that group can read it too (private on sites with a group per user).
    - ``"owner"``: neither (no ACLs, no passwd entry for ``uid``): 0600, only we read it.
    - ``"self"``: ``uid`` is us already.
    """
    os.fchmod(fd, 0o600)
    if uid == os.geteuid():
        return "self"
    try:
        os.setxattr(fd, _ACL_XATTR, _acl_owner_and_reader(uid))
        return "acl"
    except OSError as exc:
        if exc.errno not in _NO_ACL:
            raise
    gid = primary_gid(uid)
    if gid is None:
        return "owner"
    os.fchown(fd, -1, gid)
    os.fchmod(fd, 0o640)
    return "group"


def others_may_change(st: os.stat_result, *, sticky_ok: bool = False) -> str | None:
    """Why a file or folder with this status is not root's alone (another owner, write access
    for others or for a group other than root's), or None. ``sticky_ok``: a folder anyone may
    write is fine when sticky (only an entry's owner may rename it)."""
    if st.st_uid != 0:
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o002 and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        return f"anyone may write it (mode {st.st_mode & 0o7777:o})"
    if st.st_mode & 0o020 and st.st_gid != 0:
        return f"its group {st.st_gid} may write it"
    return None


def not_roots_alone(path: Path, *, lstat: Callable[[str], os.stat_result] = os.lstat
                    ) -> list[str]:
    """Why someone other than root could change what ``path`` is (empty: root's alone). Each
    folder from / down, and ``path`` itself, must be root's and writable by root (and root's
    group) only; a folder above it that anyone may write is safe when sticky (/tmp: only an
    entry's owner may rename it, and the entry is checked to be root's). A link met on the
    way sends the check on through the path with every link resolved as well."""
    problems: list[str] = []
    for chain in _chains(Path(os.path.abspath(path))):
        parts = [Path("/")] + [Path("/", *chain.parts[1:i + 1]) for i in range(1, len(chain.parts))]
        for n, prefix in enumerate(parts):
            last = n == len(parts) - 1
            try:
                st = lstat(str(prefix))
            except OSError as exc:
                problems.append(f"{prefix}: {exc.strerror}")
                break
            if stat.S_ISLNK(st.st_mode):
                break         # its parent is checked; what it names is the resolved chain's
            why = others_may_change(st, sticky_ok=not last)
            if why is not None:
                problems.append(f"{prefix}: {why}")
    return list(dict.fromkeys(problems))


def _chains(path: Path) -> list[Path]:
    real = Path(os.path.realpath(path))
    return [path] if real == path else [path, real]
