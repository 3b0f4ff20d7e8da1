"""One safe writer for every file model_debugger writes outside its own bookkeeping.

A target is a path kept inside an allowed *root* folder (the server root for REST, the kernel's
folder for the sidebar, the folder the user named for the CLI and magics). Writing it:

- resolves the target lexically under the real path of ``root`` and refuses anything outside;
- walks every folder below ``root`` with ``O_NOFOLLOW`` directory descriptors (``openat``
  style), so no symlink is followed at any component, even one swapped in during the write;
- refuses to replace an existing file unless asked (``overwrite=True``), and never replaces a
  symlink, a folder or any other non-regular file;
- writes a temporary file in the same folder, ``fsync``s it and renames it into place
  (``os.replace``; a hard link when overwriting is not allowed, so a file created meanwhile is
  never clobbered): a full disk or any error leaves the previous file intact.

Reads of files inside a session folder go through :func:`read_inside` with the same checks.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat

__all__ = ["TargetExists", "UnsafePath", "check_component", "check_target", "inside",
           "read_inside", "regular_inside", "write_inside"]

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")


class UnsafePath(ValueError):
    """A target outside its root, through a symlink, or not a regular file."""


class TargetExists(FileExistsError):
    """The target exists and overwriting was not asked for."""


def check_component(name, what: str = "name") -> str:
    """``name`` when it is one safe path component (letters, digits, ``_.+-``; no ``..``).

    Raises
    ------
    UnsafePath
        For anything else (separators, ``..``, NUL, empty, over 128 characters, non-str).
    """
    if not isinstance(name, str) or not _COMPONENT.fullmatch(name) or ".." in name:
        raise UnsafePath(f"{what} {name!r} is not a single safe path component")
    return name


def inside(root: str, path: str) -> str:
    """``path`` (absolute, or relative to ``root``) as an absolute path under ``root``.

    The check is lexical on the real path of ``root``: ``..`` is collapsed and the result must
    stay inside; symlinks below ``root`` are refused later, when the path is opened.

    Raises
    ------
    UnsafePath
        When the path is empty, holds a NUL, or lies outside ``root``.
    """
    if not isinstance(path, str) or not path.strip() or "\x00" in path:
        raise UnsafePath(f"{path!r} is not a usable path")
    base = os.path.realpath(os.path.expanduser(root))
    full = os.path.normpath(os.path.join(base, os.path.expanduser(path)))
    if full != base and not full.startswith(base.rstrip(os.sep) + os.sep):
        raise UnsafePath(f"{path!r} is outside {base}")
    return full


def _parts(root: str, path: str) -> tuple[str, list[str], str]:
    full = inside(root, path)
    base = os.path.realpath(os.path.expanduser(root))
    rel = os.path.relpath(full, base)
    if rel in (".", ""):
        raise UnsafePath(f"{path!r} names the folder {base}, not a file in it")
    *folders, name = rel.split(os.sep)
    return base, folders, name


def _open_folders(base: str, folders: list[str], create: bool) -> int:
    """A descriptor of ``base/folders...``, every component opened without following links."""
    fd = os.open(base, _DIR_FLAGS)
    try:
        for i, part in enumerate(folders):
            try:
                nxt = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                nxt = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    where = os.path.join(base, *folders[:i + 1])
                    raise UnsafePath(f"{where} is a symlink or not a folder: refused") from None
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _existing(fd: int, name: str, where: str) -> bool:
    """True when ``name`` exists in ``fd`` as a regular file; UnsafePath for anything else."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{where} is a symlink: refused")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{where} exists and is not a regular file: refused")
    return True


def write_inside(root: str, path: str, data: str | bytes, *, overwrite: bool = False,
                 mode: int = 0o666) -> bool:
    """Write ``data`` to ``path`` inside ``root`` atomically; True when a file was replaced.

    Parameters
    ----------
    root : str
        The allowed folder (trusted: the user or the server chose it).
    path : str
        The target, absolute or relative to ``root``; missing folders below ``root`` are made.
    data : str or bytes
        The content (``str`` is written as UTF-8).
    overwrite : bool
        Replace an existing regular file (default: refuse with :class:`TargetExists`).
    mode : int
        Permission bits of a new file (the umask applies).

    Raises
    ------
    UnsafePath
        Outside ``root``, through a symlink at any component, or onto a non-regular file.
    TargetExists
        The target exists and ``overwrite`` is false.
    OSError
        Writing failed (e.g. ENOSPC); the previous file, if any, is untouched.
    """
    base, folders, name = _parts(root, path)
    where = os.path.join(base, *folders, name)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    fd = _open_folders(base, folders, create=True)
    tmp = f".{name[:64]}.{secrets.token_hex(6)}.tmp"
    try:
        existed = _existing(fd, name, where)
        if existed and not overwrite:
            raise TargetExists(errno.EEXIST, "exists (ask to overwrite it)", where)
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
                      | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=fd)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(out, view):]
            os.fsync(out)
        finally:
            os.close(out)
        if overwrite:
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        else:
            _link_new(fd, tmp, name, where)
        tmp = None
        try:
            os.fsync(fd)
        except OSError:  # pragma: no cover - some filesystems refuse fsync on folders
            pass
        return existed
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
        os.close(fd)


def _link_new(fd: int, tmp: str, name: str, where: str) -> None:
    """Put ``tmp`` at ``name`` only if nothing is there (atomic no-clobber)."""
    try:
        os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
    except FileExistsError:
        raise TargetExists(errno.EEXIST, "exists (ask to overwrite it)", where) from None
    except OSError as exc:  # no hard links on this filesystem: check, then rename
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        if _existing(fd, name, where):
            raise TargetExists(errno.EEXIST, "exists (ask to overwrite it)", where) from None
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        return
    os.unlink(tmp, dir_fd=fd)


def read_inside(root: str, path: str, limit: int | None = None) -> bytes | None:
    """The bytes of a regular file inside ``root`` (no symlink followed), or None.

    None when the file is missing, a symlink, not regular, outside ``root`` or larger than
    ``limit`` bytes.
    """
    try:
        base, folders, name = _parts(root, path)
        fd = _open_folders(base, folders, create=False)
    except (UnsafePath, OSError):
        return None
    try:
        try:
            src = os.open(name, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=fd)
        except OSError:
            return None
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode) or (limit is not None and st.st_size > limit):
                return None
            chunks = []
            while chunk := os.read(src, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(src)
    finally:
        os.close(fd)


def check_target(root: str, path: str, overwrite: bool = False) -> bool:
    """Check a target as :func:`write_inside` would, writing nothing; True when it exists.

    Raises
    ------
    UnsafePath
        Outside ``root``, a symlink at any component, or a non-regular file.
    TargetExists
        It exists and ``overwrite`` is false.
    """
    base, folders, name = _parts(root, path)
    try:
        fd = _open_folders(base, folders, create=False)
    except FileNotFoundError:
        return False
    try:
        where = os.path.join(base, *folders, name)
        existed = _existing(fd, name, where)
    finally:
        os.close(fd)
    if existed and not overwrite:
        raise TargetExists(errno.EEXIST, "exists (ask to overwrite it)", where)
    return existed


def regular_inside(root: str, path: str) -> bool:
    """True when ``path`` is a regular file inside ``root`` reached through no symlink."""
    try:
        base, folders, name = _parts(root, path)
        fd = _open_folders(base, folders, create=False)
    except (UnsafePath, OSError):
        return False
    try:
        return _existing(fd, name, path)
    except UnsafePath:
        return False
    finally:
        os.close(fd)
