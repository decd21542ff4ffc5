"""A local image folder as a dataset (``data.dataset = "folder:<path>"``), checked before
anything runs.

The layout is ``<root>/<class name>/<image files>`` (the ``datasets`` imagefolder builder
reads it: labels are the sub-directories, sorted). `inspect_folder` refuses, naming the
folder and what it found, what would otherwise fail or mislead later on every client:

- a relative path: the engine (SuperLink, Ray workers) runs in another working
  directory. ``python -m fedorasflwr.launch`` and ``python -m fedorasflwr.compare`` make it
  absolute against the directory they run in (`absolute_folder`);
- fewer than 2 class sub-directories (imagefolder then gives no ``label`` column), or a
  class directory without images (its label id would shift every later class's);
- images of different sizes: the models take one input shape, and a silent resize
  distorts the images it changes. Resize them beforehand.

Images are converted to one channel when every image is grayscale (PIL modes 1, L, I, F),
else to RGB. Only image headers are read (PIL opens lazily); the answer is kept per folder
while its images are unchanged (`folder_fingerprint`: each image file's path, size and
modification time, which also keys the folder's cached partitions).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "FOLDER_PREFIX",
    "IMAGE_SUFFIXES",
    "ImageFolder",
    "absolute_folder",
    "folder_classes",
    "folder_fingerprint",
    "folder_image_shape",
    "folder_root",
    "inspect_folder",
]

FOLDER_PREFIX = "folder:"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
#: PIL modes read as one channel; every other mode is converted to RGB
GRAY_MODES = ("1", "L", "I", "I;16", "F")
_DATASET_KEY = "data.dataset"


@dataclass(frozen=True)
class ImageFolder:
    """What `inspect_folder` found.

    Attributes
    ----------
    root : Path
        The folder (absolute).
    classes : tuple[str, ...]
        Class names: the sub-directories, sorted (imagefolder's label order).
    shape : tuple[int, int, int]
        ``(C, H, W)`` every image is read as: C = 1 if every image is grayscale, else 3.
    num_images : int
        Image files found.
    """

    root: Path
    classes: tuple[str, ...]
    shape: tuple[int, int, int]
    num_images: int


def _invalid(dataset: str, why: str) -> ValueError:
    return ValueError(f"run config {_DATASET_KEY!r} = {dataset!r} is invalid: {why}")


def folder_root(dataset: str) -> Path:
    """The directory of a ``folder:<path>`` dataset, checked to be absolute and to exist."""
    root = Path(dataset[len(FOLDER_PREFIX) :]).expanduser()
    if not root.is_absolute():
        fix = f"{FOLDER_PREFIX}{Path.cwd() / root}"
        raise _invalid(
            dataset,
            f"{str(root)!r} is a relative path, and the engine runs in another working "
            f"directory: give an absolute one (from here: {fix!r}); python -m "
            "fedorasflwr.launch and python -m fedorasflwr.compare resolve it for you",
        )
    if not root.is_dir():
        raise _invalid(
            dataset, f"{str(root)!r} is not a directory (expected <root>/<class name>/<images>)"
        )
    return root


def absolute_folder(values: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """``values`` (a run config) with a relative ``folder:<path>`` in ``data.dataset`` made
    absolute against ``base`` (the directory the user ran the command in); other values,
    and an absolute or ``~`` path, unchanged."""
    out = dict(values)
    dataset = out.get(_DATASET_KEY)
    if isinstance(dataset, str) and dataset.startswith(FOLDER_PREFIX):
        path = dataset[len(FOLDER_PREFIX) :]
        if path.strip() and not Path(path).expanduser().is_absolute():
            out[_DATASET_KEY] = FOLDER_PREFIX + str((base / path).resolve())
    return out


def inspect_folder(dataset: str) -> ImageFolder:
    """Check a ``folder:<path>`` dataset (see the module's notes) and say what it holds.

    Raises
    ------
    ValueError
        Naming ``data.dataset``, the folder and what is wrong: a relative path, not a
        directory, fewer than 2 classes (the classes found), a class without images, an
        unreadable image, images of different sizes (each size, its count and an example).
    """
    root = folder_root(dataset)
    classes = tuple(
        sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    )
    if len(classes) < 2:
        raise _invalid(
            dataset,
            f"{len(classes)} class {'directory' if len(classes) == 1 else 'directories'} in "
            f"{str(root)!r} ({list(classes)}); a classification dataset needs at least 2: "
            "<root>/<class name>/<images>",
        )
    return _inspect(dataset, root, classes, _fingerprint(root, classes))


def folder_fingerprint(dataset: str) -> str:
    """A digest of a ``folder:<path>`` dataset's image files: each one's path under the
    folder, size and modification time (``stat`` only, no image is read). An image added,
    removed, renamed or rewritten changes it: the data cache keys a folder's partitions by
    it, so edited images are never served from partitions of the old ones."""
    root = folder_root(dataset)
    classes = tuple(
        sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    )
    return _fingerprint(root, classes)


def _fingerprint(root: Path, classes: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for name in classes:
        for path in sorted((root / name).iterdir()):
            if path.suffix.lower() in IMAGE_SUFFIXES:
                try:
                    stat = path.stat()
                    state = f"{stat.st_size}\0{stat.st_mtime_ns}"
                except OSError:  # a dangling link, a file gone: `_inspect` names it
                    state = "unreadable"
                digest.update(f"{name}/{path.name}\0{state}\n".encode())
    return digest.hexdigest()[:24]


@lru_cache(maxsize=8)
def _inspect(dataset: str, root: Path, classes: tuple[str, ...], stamp: str) -> ImageFolder:
    """The image scan of `inspect_folder`, kept while the folder's images are unchanged
    (``stamp``: their `_fingerprint`)."""
    from PIL import Image, UnidentifiedImageError

    sizes: dict[tuple[int, int], list[Path]] = {}
    gray, count, empty = True, 0, []
    for name in classes:
        images = sorted(p for p in (root / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            empty.append(name)
        for path in images:
            try:
                with Image.open(path) as image:
                    sizes.setdefault((image.width, image.height), []).append(path)
                    gray = gray and image.mode in GRAY_MODES
            except (OSError, UnidentifiedImageError) as error:
                raise _invalid(dataset, f"cannot read image {str(path)!r}: {error}") from error
        count += len(images)
    if empty:
        suffixes = ", ".join(IMAGE_SUFFIXES)
        raise _invalid(dataset, f"class directories without image files ({suffixes}): {empty}")
    if len(sizes) > 1:
        found = "; ".join(
            f"{w}x{h} px: {len(paths)} images, e.g. {paths[0].relative_to(root)}"
            for (w, h), paths in sorted(sizes.items(), key=lambda item: -len(item[1]))
        )
        raise _invalid(
            dataset,
            f"its images have {len(sizes)} sizes ({found}); every image must have the same "
            "width and height (the models take one input shape): resize them first",
        )
    ((width, height),) = sizes
    return ImageFolder(root, classes, (1 if gray else 3, height, width), count)


def folder_classes(dataset: str) -> list[str]:
    """Class names of a folder dataset: its sub-directories, sorted (imagefolder's order)."""
    return list(inspect_folder(dataset).classes)


def folder_image_shape(dataset: str) -> tuple[int, int, int]:
    """``(C, H, W)`` every folder image is read as (`ImageFolder.shape`)."""
    return inspect_folder(dataset).shape
