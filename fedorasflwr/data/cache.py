"""Disk cache of prepared client partitions, server slices and global test sets.

The deployment engine starts a fresh ClientApp process per message, so a client
must not rebuild its partition every time. A prepared partition is one
``torch.save`` file named by a hash of everything that determines its content -
the spec without ``cache_dir``, the partition id, the number of partitions,
:data:`FORMAT_VERSION` and, for an image folder, its files' fingerprint (each image's
path, size and modification time: `folder_fingerprint`) - written atomically
(temporary file + ``os.replace``), so concurrent processes never read half a file.
Every file carries a checksum of its content (:func:`.integrity.checksum`): a file
whose checksum does not match (a bit flipped on disk, a cut copy) is reported and
treated as a miss. This module imports neither ``datasets`` nor ``flwr_datasets``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from .integrity import checksum
from .spec import DataSpec

__all__ = [
    "FORMAT_VERSION",
    "cache_root",
    "client_path",
    "global_test_path",
    "server_path",
    "read",
    "write",
]

FORMAT_VERSION = 3  # 2: files carry a checksum; 3: splits drawn from named streams
CHECKSUM = "checksum"
_LOG = logging.getLogger(__name__)
# Only these fields shape the server slice: a new partitioner reuses the same file.
_SERVER_KEYS = ("dataset", "server-fraction", "seq-len", "seed")
#: The global test set's keys, in a spec's key only while it is on (``data.global-test``): a
#: spec without it keeps the key (and the cached files) it had before the keys existed.
_GLOBAL_KEYS = ("global-test", "global-test-fraction")


def cache_root(spec: DataSpec) -> Path:
    """``spec.cache_dir``, else ``$FEDORASFLWR_CACHE``, else ``~/.cache/fedorasflwr``."""
    configured = spec.cache_dir or os.environ.get("FEDORASFLWR_CACHE", "")
    return Path(configured or "~/.cache/fedorasflwr").expanduser()


def _digest(content: dict[str, Any]) -> str:
    text = json.dumps({**content, "format": FORMAT_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _slug(dataset: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", dataset).strip("-")[-40:] or "data"


def _content(spec: DataSpec) -> dict[str, str]:
    """What a dataset's name does not fix: an image folder's files (`folder_fingerprint`),
    so partitions of edited images are never read back; nothing for the other datasets
    (their keys, and the files cached under them, are as before)."""
    from .folder import FOLDER_PREFIX, folder_fingerprint

    if spec.dataset.startswith(FOLDER_PREFIX):
        return {"folder-content": folder_fingerprint(spec.dataset)}
    return {}


def client_path(spec: DataSpec, partition_id: int, num_partitions: int) -> Path:
    """Cache file of one client's train / val / test tensors."""
    config = spec.to_config()
    config.pop("cache-dir")
    if not spec.global_test:
        for name in _GLOBAL_KEYS:
            config.pop(name)
    if not spec.partition_size:  # as global-test: unused, the key it had before it existed
        config.pop("partition-size")
    key = _digest(
        {
            "spec": config,
            "partition-id": partition_id,
            "num-partitions": num_partitions,
            **_content(spec),
        }
    )
    name = f"client-{_slug(spec.dataset)}-{partition_id}-of-{num_partitions}-{key}.pt"
    return cache_root(spec) / "data" / name


def server_path(spec: DataSpec) -> Path:
    """Cache file of the server slice."""
    config = spec.to_config()
    key = _digest({"server": {name: config[name] for name in _SERVER_KEYS}, **_content(spec)})
    return cache_root(spec) / "data" / f"server-{_slug(spec.dataset)}-{key}.pt"


def global_test_path(spec: DataSpec) -> Path:
    """Cache file of the global test set: keyed by the server slice's fields (it is carved
    after the slice) and, where it is carved, ``global-test-fraction``."""
    config = spec.to_config()
    content = {name: config[name] for name in _SERVER_KEYS}
    if spec.carves_global_test():
        content["global-test-fraction"] = config["global-test-fraction"]
    key = _digest({"global-test": content, **_content(spec)})
    return cache_root(spec) / "data" / f"global-test-{_slug(spec.dataset)}-{key}.pt"


def read(path: Path) -> dict[str, Any] | None:
    """The cached payload at ``path``; ``None`` if absent, or (with a WARNING naming the
    file and the fault) unreadable, of another format or failing its checksum.

    Raises
    ------
    IsADirectoryError
        If ``path`` is a directory that is not empty (an empty one is removed, with a
        WARNING, and rebuilt) or another thing that is not a file; the message names
        the path and what to do.
    """
    if not path.is_file():
        _clear_the_way(path)
        return None
    try:
        payload = torch.load(path, weights_only=True)
    except Exception as err:  # a bad file is a miss: rebuilt by the caller
        _LOG.warning("ignoring unreadable data cache file %s: %s", path, err)
        return None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        _LOG.warning("ignoring data cache file %s: not a format-%d payload", path, FORMAT_VERSION)
        return None
    stored = payload.pop(CHECKSUM, None)
    if stored != checksum(payload):
        _LOG.warning("ignoring data cache file %s: checksum mismatch (corrupt file)", path)
        return None
    return payload


def _what_to_do(path: Path) -> str:
    return (
        f"move or remove {path}, or point run config data.cache-dir (or $FEDORASFLWR_CACHE) "
        "at another directory"
    )


def _clear_the_way(path: Path) -> None:
    """Make sure a cache file can be written at ``path``: a file or nothing there, or an empty
    directory (removed with a WARNING: the file is rebuilt). Anything else there - a
    directory holding something, a socket, a FIFO - is not ours to delete: a clear error."""
    if path.is_file() or not os.path.lexists(path):  # a file is replaced atomically
        return
    if path.is_dir() and not path.is_symlink():
        try:
            path.rmdir()  # only an empty directory goes
        except FileNotFoundError:  # another process removed it
            return
        except OSError:
            raise IsADirectoryError(
                f"data cache path {path} is a directory that is not empty, not a cache file: "
                + _what_to_do(path)
            ) from None
        _LOG.warning("data cache path %s was an empty directory: removed it, rebuilding", path)
        return
    if path.is_symlink() and not path.exists():
        return  # a dangling link: the atomic write replaces the link itself
    raise IsADirectoryError(f"data cache path {path} is not a regular file: " + _what_to_do(path))


def write(path: Path, payload: dict[str, Any]) -> None:
    """Save ``payload`` to ``path`` atomically (other processes see all of it or nothing).

    Raises
    ------
    NotADirectoryError
        If the cache's directory (or one above it) is a file; the message names it.
    IsADirectoryError
        As `read`, if ``path`` is a directory holding something.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotADirectoryError(
            f"data cache directory {path.parent} (or one above it) is a file, not a "
            f"directory: {_what_to_do(path.parent)}"
        ) from None
    _clear_the_way(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            content = {**payload, "format": FORMAT_VERSION}
            torch.save({**content, CHECKSUM: checksum(content)}, stream)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
