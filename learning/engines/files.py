"""The file helpers every engine uses: a cross-process lock, keyed JSON records, the rows of a JSONL file that a kill
may have torn, a file's SHA-256, and folders only this user can change (`private_dir`: the llama.cpp build cache,
its installed libraries and the GGUF LoRA cache).

One room for them (they were spread over `threads.py`, `gguf_lora.py`, `llamacpp_build.py` and `grpo.py`, the
hash written three times). Standard library only: `llamacpp_build` runs during `make install`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHUNK = 1 << 20  # files are hashed in 1 MiB pieces: a GGUF is hundreds of MB


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path`: a second process converting or measuring the same cache waits here."""
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def store_keyed(path: Path, key: str, entry: object) -> None:
    """Store `entry` under `key` in the JSON object file `path`, keeping the other keys' entries (atomic replace).
    The per-machine records beside the model (thread plans, llama.cpp CPU variant probes) are such files."""
    path = Path(path)
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = entry
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()  # gone after the replace; left only by a failed write


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file that runs append to as they go (a missing file: none). A line torn by a kill,
    or still being written by another process, is skipped: its work is done again, never read half."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def hash_into(h: Any, fd: int) -> None:
    """Feed the open file `fd` to the hash `h` in CHUNK pieces, and close it."""
    with open(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)


def sha256_file(path: Path, *, follow_links: bool = True) -> str:
    """The hex SHA-256 of a file, read in pieces. With `follow_links=False` a link is refused (O_NOFOLLOW raises
    OSError), so a cache entry swapped for a link to another file is never vouched for."""
    h = hashlib.sha256()
    hash_into(h, os.open(path, os.O_RDONLY | (0 if follow_links else os.O_NOFOLLOW)))
    return h.hexdigest()


# -- private folders (issue 65, findings 10 and 11) -------------------------------------------------------------------

MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup (ELOOP)


class NotPrivate(PermissionError):
    """A folder (or a file in it) that another user could write, replace or swap; the message says which and why."""


def lookup(path: Path) -> tuple[Path, list[Path]]:
    """The real path of `path` and every folder a lookup of it searches, links followed as the kernel follows them.

    Why not only `os.path.realpath`: a link's target is checked through the real path, but the folder that holds the
    link is searched too, and whoever can write that folder can point the link elsewhere. Missing components (a cache
    not created yet) end the walk; they are appended to the real path as they are named.

    Raises:
        NotPrivate: more than MAX_LINKS links (a loop).
    """
    parts = list(Path(os.getcwd(), path).parts[1:])  # ".." is kept: after a link it is the target's parent
    current, links, missing = Path("/"), 0, False
    searched: list[Path] = []
    while parts:
        name = parts.pop(0)
        if name == "..":
            current = current.parent  # `current` holds no link, so its parent is the real one
            continue
        if missing:
            current = current / name
            continue
        searched.append(current)
        candidate = current / name
        try:
            st = candidate.lstat()
        except FileNotFoundError:
            missing, current = True, candidate
            continue
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise NotPrivate(f"{path} has more than {MAX_LINKS} links in its path (a loop?)")
            target = Path(os.readlink(candidate))
            if target.is_absolute():
                current, parts = Path("/"), [*target.parts[1:], *parts]
            else:
                parts = [*target.parts, *parts]
            continue
        current = candidate
    return current, list(dict.fromkeys(searched))


def folder_problem(folder: Path, *, leaf: bool, root_may_own: bool = False) -> str | None:
    """Why another user could change what `folder` holds, or None when no one but this user (and root) can.

    A folder searched on the way (`leaf=False`) must belong to this user or root and be writable by no one else,
    unless it is root's and sticky (/tmp: others may add names there, never rename or remove this user's). The folder
    itself (`leaf=True`) must be this user's (or root's with `root_may_own`) and writable by no one else: sticky does
    not help there, since a name another user adds is one this program would read.
    """
    try:
        st = folder.lstat()
    except OSError as exc:
        return f"{folder} cannot be checked ({exc.strerror})"
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder (it changed while it was checked?)"
    owners = (me, 0) if root_may_own or not leaf else (me,)
    if st.st_uid not in owners:
        return f"{folder} belongs to another user (uid {st.st_uid})"
    if not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    mode = f"mode {stat.S_IMODE(st.st_mode):04o}"
    if leaf:
        return f"{folder} is a folder other users can write ({mode}), so they could put any file in it"
    if st.st_uid == 0 and st.st_mode & stat.S_ISVTX:
        return None
    return (f"{folder} is a folder other users can write ({mode}), and not a sticky one of root's like /tmp, so they "
            "could rename what is inside it and put their own in its place")


def private_dir(path: Path, *, create: bool = True, mode: int = 0o700, root_may_own: bool = False) -> Path:
    """The real path of the folder `path`, once every folder a lookup of it searches, and it, are checked private
    (`folder_problem`); missing ones are created with `mode` (0700: owner only) whatever the umask, after their parents
    were checked. Use the returned path from then on: the links on the way to it were checked as they were then.

    Raises:
        NotPrivate: which folder another user could change, and why.
        FileNotFoundError: `path` does not exist and `create` is False.
        OSError: a folder could not be created.
    """
    real, searched = lookup(Path(path))
    for folder in searched:  # before anything is created in them
        why = folder_problem(folder, leaf=False)
        if why is not None:
            raise NotPrivate(why)
    missing = [p for p in (*reversed(real.parents), real) if not os.path.lexists(p)]
    if missing and not create:
        raise FileNotFoundError(f"{path} does not exist")
    for folder in missing:
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked below like any other
            os.mkdir(folder, mode)
            os.chmod(folder, mode)  # the umask took bits away from mkdir's mode (0775 under umask 002)
    again, searched = lookup(Path(path))
    if again != real:
        raise NotPrivate(f"{path} led to {again}, not {real}, when it was looked up again")
    for folder in searched:
        why = folder_problem(folder, leaf=False)
        if why is not None:
            raise NotPrivate(why)
    why = folder_problem(real, leaf=True, root_may_own=root_may_own)
    if why is not None:
        raise NotPrivate(why)
    return real


def file_problem(path: Path) -> str | None:
    """Why `path` is not a plain file only this user (or root) can write, or None. A link is a problem: the file it
    names is somewhere else."""
    try:
        st = path.lstat()
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a plain file"
    if st.st_uid not in (os.geteuid(), 0):
        return f"{path} belongs to another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} can be written by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None
