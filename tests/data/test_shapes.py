"""The synthetic shapes folder (issue 40's never-tuned-on dataset): what it writes is a valid
image folder, fixed by its seed, and only the shape carries the label."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fedorasflwr.data.folder import inspect_folder
from fedorasflwr.data.shapes import CLASSES, SIZE, _mask, draw, main, write_shapes


def _digest(root) -> str:
    files = sorted(root.rglob("*.png"))
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def test_a_folder_of_32px_rgb_images_one_directory_per_class(tmp_path):
    assert main([str(tmp_path / "s"), "--per-class", "3", "--seed", "1"]) == 0
    found = inspect_folder(f"folder:{tmp_path / 's'}")
    assert found.classes == tuple(sorted(CLASSES)) and len(CLASSES) == 6
    assert found.shape == (3, SIZE, SIZE) == (3, 32, 32)
    assert found.num_images == 3 * len(CLASSES)


def test_same_seed_same_bytes_other_seed_other_images(tmp_path):
    first = _digest(write_shapes(tmp_path / "a", 2, seed=0))
    assert _digest(write_shapes(tmp_path / "b", 2, seed=0)) == first
    assert _digest(write_shapes(tmp_path / "c", 2, seed=1)) != first


def test_each_shape_is_a_visible_distinct_mask():
    masks = {name: _mask(name, np.random.default_rng(3)) for name in CLASSES}
    for name, mask in masks.items():
        assert 10 < mask.sum() < 0.6 * SIZE * SIZE, name  # drawn, and not the whole image
    # same centre and radius (same stream), different shapes: different pixels
    pairs = [(a, b) for a in CLASSES for b in CLASSES if a < b]
    assert all((masks[a] != masks[b]).any() for a, b in pairs)
    image = draw("ring", np.random.default_rng(0))
    assert image.shape == (SIZE, SIZE, 3) and image.dtype == np.uint8


def test_bad_counts_and_shapes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="per_class must be at least 1, got 0"):
        write_shapes(tmp_path, 0)
    with pytest.raises(ValueError, match="shape must be one of"):
        draw("hexagon", np.random.default_rng(0))
