"""Where a store lives: a local directory, or a prefix on any pyarrow filesystem.

``StoreLocation.parse`` takes what a user writes after ``--store`` or in
``$MCPROF_STORE``: a path, ``file://...``, or a URI pyarrow knows (``s3://bucket/prefix``,
``gs://...``, ``hdfs://...``). Endpoints and credentials come from the usual
environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...) or from the
URI's query (``s3://bucket/prefix?endpoint_override=host:9000&scheme=http``), as
pyarrow reads them; a ready ``pyarrow.fs.FileSystem`` may be given instead.

A local store keeps its locks and journals (rename and flock work there); a remote one
needs neither for what it does: every file is written whole under a name no other
writer picks, and appears in one piece when its upload completes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

import pyarrow as pa
import pyarrow.fs as pafs

from multicore_profiler.errors import StoreError
from multicore_profiler.scratch import ScratchDirectory

OBJECT_STORES = ("s3", "gcs")
"""Filesystems whose directories are only key prefixes: nothing to create."""

MARKER = "mcprof-store.json"
"""The file that makes a directory (or prefix) a store; it holds the format version."""


@contextmanager
def store_write(what: str) -> Iterator[None]:
    """Turn an ``OSError`` of the work inside (a read-only store, a full disk, a refused
    upload) into one ``StoreError``: ``cannot <what>: <path>: <reason>``. Every write path
    of the store goes through it, so that none ends in a traceback."""
    try:
        yield
    except StoreError:
        raise
    except OSError as exc:
        raise StoreError(f"cannot {what}: {os_reason(exc)}") from exc


def os_reason(exc: OSError) -> str:
    """An ``OSError`` as one line: the paths it names (if any: ``a -> b`` for a rename)
    and the reason."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    names = [str(name) for name in (exc.filename, exc.filename2) if name is not None]
    where = " -> ".join(names)
    text = f"{where}: {reason}" if names and where not in reason else reason
    return " ".join(text.split())


_SPECIAL_FILES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _what(path: str, mode: int) -> str:
    """What a path that is no regular file and no directory is, in words."""
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {os.readlink(path)}"
        except OSError:
            return "a symbolic link"
    return special_file(mode) or "a special file"


def special_file(mode: int) -> str | None:
    """What a path of this ``st_mode`` is, in words (``a FIFO (named pipe)``), when it is
    not a regular file; None for a regular file. Reading a FIFO waits for a writer for
    ever, and renaming a file onto a device replaces it: inputs and outputs refuse both."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _SPECIAL_FILES if test(mode)), "a special file")


def _one_request_uploads(uri: str) -> str:
    """``uri``, asking an S3 filesystem to upload each small file in one ``PutObject``
    (``allow_delayed_open``) unless the URI says otherwise. Without it, pyarrow uploads
    every file, however small, in three round trips (a multipart upload's create, part and
    complete), and every step a capture writes is a few small files. What it costs, that
    a missing bucket is refused when the file closes rather than when it opens, changes
    nothing here: the store writes each file whole inside ``store_write``."""
    scheme, _, rest = uri.partition("://")
    query = rest.partition("?")[2]
    if scheme != "s3" or "allow_delayed_open" in parse_qs(query):
        return uri
    separator = "&" if query else "" if "?" in rest else "?"
    return f"{uri}{separator}allow_delayed_open=true"


@dataclass(frozen=True)
class StoreLocation:
    """A store's filesystem, its base path there, and the URI a user names it by."""

    filesystem: pafs.FileSystem
    path: str
    """The base path as the filesystem names it: ``/abs/dir``, or ``bucket/prefix``."""
    uri: str

    @classmethod
    def parse(cls, where: str | Path, filesystem: pafs.FileSystem | None = None) -> StoreLocation:
        """The location ``where`` names; on ``filesystem`` when one is given."""
        text = os.fspath(where)
        if filesystem is not None:
            path = text.rstrip("/") or "/"
            if isinstance(filesystem, pafs.LocalFileSystem):
                return cls.local(Path(path))
            return cls(filesystem, path, f"{filesystem.type_name}://{path}")
        if "://" not in text:
            return cls.local(Path(text))
        try:
            found, path = pafs.FileSystem.from_uri(_one_request_uploads(text))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OSError) as exc:
            raise StoreError(f"cannot open store {text!r}: {exc}") from exc
        if isinstance(found, pafs.LocalFileSystem):
            return cls.local(Path(path))
        path = path.rstrip("/")
        if not path:
            raise StoreError(f"store {text!r} names no bucket or directory")
        return cls(found, path, text.split("?", 1)[0].rstrip("/"))

    @classmethod
    def local(cls, directory: Path) -> StoreLocation:
        """A directory on this machine."""
        directory = directory.expanduser().absolute()
        return cls(pafs.LocalFileSystem(), str(directory), str(directory))

    @property
    def is_local(self) -> bool:
        """Whether the store is a directory of this machine (locks and renames work)."""
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    @property
    def directory(self) -> Path:
        """The local directory; ``StoreError`` for a remote store."""
        if not self.is_local:
            raise StoreError(f"{self.uri} is not a local directory")
        return Path(self.path)

    def join(self, *parts: str) -> str:
        """The filesystem path of ``parts`` under the base path."""
        return "/".join([self.path.rstrip("/"), *parts])

    def info(self, relative: str) -> pafs.FileInfo:
        """What is at ``relative``: a file, a directory, or nothing."""
        return self.filesystem.get_file_info(self.join(relative))

    def read_bytes(self, relative: str) -> bytes:
        """A whole file's bytes."""
        with self.filesystem.open_input_stream(self.join(relative)) as source:
            return source.read()

    def files(self, relative: str = "") -> list[pafs.FileInfo]:
        """Every file under ``relative``, at any depth (none when it does not exist). In a
        local store: the regular files only, none reached through a symbolic link (see
        ``special_files``), and none removed while the listing ran."""
        base = self.join(relative) if relative else self.path
        if self.is_local:
            return [
                pafs.FileInfo(
                    path, pafs.FileType.File, mtime_ns=found.st_mtime_ns, size=found.st_size
                )
                for path, found in self._entries(relative)
                if stat.S_ISREG(found.st_mode)
            ]
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        return [i for i in self.filesystem.get_file_info(selector) if i.type == pafs.FileType.File]

    def special_files(self, relative: str = "") -> list[tuple[str, str]]:
        """The paths under ``relative`` of a local store that are neither regular files nor
        directories (symbolic links, FIFOs, sockets, devices), each with what it is in
        words. The store follows and reads none of them: a link looping back up the tree
        would make a listing endless, one out of it would let a compaction or a removal
        reach files that are not the store's. A remote store has none."""
        if not self.is_local:
            return []
        return [
            (path, _what(path, found.st_mode))
            for path, found in self._entries(relative)
            if not stat.S_ISREG(found.st_mode) and not stat.S_ISDIR(found.st_mode)
        ]

    def _entries(self, relative: str) -> Iterator[tuple[str, os.stat_result]]:
        """Every entry under ``relative`` of a local store (and ``relative`` itself, if it
        is no directory) with its ``lstat``; a directory is entered only if it is one, not a
        link to one, and so is every directory between the store and ``relative`` (the
        store's own directory may be a link). An entry removed between its directory's
        listing and its ``lstat`` is left out."""
        path = self.path
        parts = [p for p in relative.split("/") if p]
        for depth, part in enumerate(parts, start=1):
            path = f"{path}/{part}"
            try:
                found = os.lstat(path)
            except FileNotFoundError:
                return
            if not stat.S_ISDIR(found.st_mode):
                if depth == len(parts):
                    yield path, found
                return
        pending = [path]
        while pending:
            directory = pending.pop()
            try:
                with os.scandir(directory) as listing:
                    entries = list(listing)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                try:
                    found = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(found.st_mode):
                    pending.append(entry.path)
                yield entry.path, found

    def upload(self, local: Path, relative: str) -> str:
        """Copy a finished local file to ``relative``; return its path. The file appears
        whole or not at all: an object store shows an upload only once it completes;
        elsewhere (HDFS) it is copied under a ``.tmp`` name, then renamed."""
        destination = self.join(relative)
        object_store = self.filesystem.type_name in OBJECT_STORES
        if not object_store:  # where directories are real
            self.filesystem.create_dir(destination.rsplit("/", 1)[0], recursive=True)
        target = destination if object_store else destination + ".tmp"
        # Closed here, where a failed upload raises: ``pafs.copy_files`` leaves the close to
        # the stream's destructor, which drops the error of an upload made at close (one
        # ``PutObject``, see ``_one_request_uploads``), and the file silently never appears.
        with open(local, "rb") as source, self.filesystem.open_output_stream(target) as sink:
            sink.upload(source)
        if target != destination:
            self.filesystem.move(target, destination)
        return destination

    def write_bytes(self, relative: str, data: bytes) -> None:
        """A small file written in one piece (the store's marker)."""
        with ScratchDirectory("mcprof-") as scratch:
            staged = scratch / "file"
            staged.write_bytes(data)
            self.upload(staged, relative)

    def put(self, relative: str, data: bytes) -> str:
        """Write a small file in place, where its name says all and readers never read a
        half of it (a claim); return its path. Quicker than ``write_bytes``: no scratch
        file, no rename."""
        destination = self.join(relative)
        if self.filesystem.type_name not in OBJECT_STORES:
            self.filesystem.create_dir(destination.rsplit("/", 1)[0], recursive=True)
        with self.filesystem.open_output_stream(destination) as sink:
            sink.write(data)
        return destination

    def delete_file(self, path: str) -> None:
        """Remove one file (a path as the filesystem names it); nothing if it is gone."""
        try:
            self.filesystem.delete_file(path)
        except FileNotFoundError:
            return

    def delete_dir(self, relative: str) -> None:
        """Remove a directory (prefix) and everything in it, if it is there."""
        path = self.join(relative)
        self.filesystem.delete_dir_contents(path, missing_dir_ok=True)
        if self.filesystem.get_file_info(path).type == pafs.FileType.Directory:
            self.filesystem.delete_dir(path)

    def __str__(self) -> str:
        return self.uri
