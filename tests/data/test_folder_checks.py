"""A ``folder:<path>`` dataset is checked before anything runs: a relative path, fewer than
2 classes, a class without images and images of different sizes are refused, naming the
folder and what was found; a relative path is made absolute by the commands that start runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedorasflwr.data import DataSpec, dataset_info
from fedorasflwr.data.folder import absolute_folder, inspect_folder


def _folder(root: Path, sizes: dict[str, list[tuple[int, int]]], mode: str = "RGB") -> Path:
    """``root/<class>/<i>.png`` with one image of each ``(width, height)`` listed."""
    rng = np.random.default_rng(0)
    for name, shapes in sizes.items():
        (root / name).mkdir(parents=True)
        for i, (width, height) in enumerate(shapes):
            channels = (height, width) if mode == "L" else (height, width, 3)
            pixels = rng.integers(0, 256, size=channels, dtype=np.uint8)
            Image.fromarray(pixels).convert(mode).save(root / name / f"{i}.png")
    return root


def test_a_good_folder_is_described(tmp_path: Path) -> None:
    root = _folder(tmp_path / "im", {"ant": [(5, 6)] * 3, "bee": [(5, 6)] * 2})
    found = inspect_folder(f"folder:{root}")
    assert found.classes == ("ant", "bee") and found.num_images == 5
    assert found.shape == (3, 6, 5)  # (C, H, W)
    info = dataset_info(DataSpec(dataset=f"folder:{root}"))
    assert (info.num_classes, info.input_shape) == (2, (3, 6, 5))


def test_grayscale_only_when_every_image_is(tmp_path: Path) -> None:
    gray = _folder(tmp_path / "gray", {"a": [(4, 4)], "b": [(4, 4)]}, mode="L")
    assert inspect_folder(f"folder:{gray}").shape == (1, 4, 4)
    mixed = _folder(tmp_path / "mixed", {"a": [(4, 4)]}, mode="L")
    _folder(mixed, {"b": [(4, 4)]}, mode="RGB")
    assert inspect_folder(f"folder:{mixed}").shape == (3, 4, 4)  # RGB, not the first's mode


def test_one_class_is_refused_with_the_classes_found(tmp_path: Path) -> None:
    root = _folder(tmp_path / "one", {"cat": [(4, 4)] * 3})
    with pytest.raises(ValueError) as info:
        dataset_info(DataSpec(dataset=f"folder:{root}"))
    message = str(info.value)
    assert message.startswith(f"run config 'data.dataset' = 'folder:{root}' is invalid")
    assert "1 class directory" in message and "['cat']" in message
    assert "at least 2" in message
    with pytest.raises(ValueError, match="at least 2"):
        DataSpec(dataset=f"folder:{root}").check_partitionable(2)


def test_a_class_without_images_is_refused(tmp_path: Path) -> None:
    root = _folder(tmp_path / "im", {"ant": [(4, 4)], "bee": [(4, 4)]})
    (root / "cow").mkdir()
    (root / "cow" / "notes.txt").write_text("no image here")
    with pytest.raises(ValueError, match=r"class directories without image files .*\['cow'\]"):
        inspect_folder(f"folder:{root}")


def test_mixed_sizes_are_refused_naming_each_size(tmp_path: Path) -> None:
    sizes = {"a": [(16, 16), (32, 32)], "b": [(16, 16), (48, 48)]}
    root = _folder(tmp_path / "im", sizes)
    with pytest.raises(ValueError) as info:
        dataset_info(DataSpec(dataset=f"folder:{root}"))
    message = str(info.value)
    assert "3 sizes" in message
    assert "16x16 px: 2 images" in message and "32x32 px: 1 images, e.g. a/1.png" in message
    assert "48x48 px: 1 images, e.g. b/1.png" in message
    assert "resize them first" in message


def test_a_fixed_folder_is_read_again(tmp_path: Path) -> None:
    root = _folder(tmp_path / "im", {"a": [(8, 8)], "b": [(8, 8), (9, 9)]})
    with pytest.raises(ValueError, match="2 sizes"):
        inspect_folder(f"folder:{root}")
    (root / "b" / "1.png").unlink()  # the answer is not kept once the folder changed
    assert inspect_folder(f"folder:{root}").num_images == 2


def test_an_unreadable_image_is_named(tmp_path: Path) -> None:
    root = _folder(tmp_path / "im", {"a": [(4, 4)], "b": [(4, 4)]})
    (root / "b" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"cannot read image .*broken\.png"):
        inspect_folder(f"folder:{root}")


def test_a_relative_path_is_refused_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _folder(tmp_path / "im", {"a": [(4, 4)], "b": [(4, 4)]})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        dataset_info(DataSpec(dataset="folder:im"))
    message = str(info.value)
    assert "'im' is a relative path" in message and "another working directory" in message
    assert f"'folder:{tmp_path / 'im'}'" in message


def test_absolute_folder_resolves_against_the_given_directory(tmp_path: Path) -> None:
    values = {"data.dataset": "folder:im/../im", "seed": 1}
    resolved = absolute_folder(values, tmp_path)
    assert resolved == {"data.dataset": f"folder:{tmp_path / 'im'}", "seed": 1}
    assert values["data.dataset"] == "folder:im/../im"  # the caller's mapping is not changed
    for kept in ({"data.dataset": "mnist5k"}, {"data.dataset": "folder:/abs"}, {}):
        assert absolute_folder(kept, tmp_path) == kept
    assert absolute_folder({"data.dataset": "folder:~/im"}, tmp_path) == {
        "data.dataset": "folder:~/im"  # the engine runs as the same user: same home
    }


def test_edited_images_are_neither_inspected_nor_cached_as_the_old_ones(tmp_path: Path) -> None:
    """Rewriting an image in place (same name, so the class directories' times stay) or
    adding one changes the folder's fingerprint: the data cache keys its partitions, server
    slice and global test set by it, and the folder is inspected again."""
    import os

    from fedorasflwr.data.cache import client_path, global_test_path, server_path
    from fedorasflwr.data.folder import folder_fingerprint

    root = _folder(tmp_path / "im", {"ant": [(5, 6)] * 3, "bee": [(5, 6)] * 2})
    dataset = f"folder:{root}"
    spec = DataSpec(dataset=dataset, global_test=True)
    before = (client_path(spec, 0, 2), server_path(spec), global_test_path(spec))
    first = folder_fingerprint(dataset)
    assert inspect_folder(dataset).shape == (3, 6, 5)
    assert folder_fingerprint(dataset) == first  # unchanged files: same key, same paths
    assert (client_path(spec, 0, 2), server_path(spec), global_test_path(spec)) == before

    stamp = os.stat(root / "ant").st_mtime_ns
    _folder(tmp_path / "other", {"ant": [(7, 8)]})
    (tmp_path / "other" / "ant" / "0.png").replace(root / "ant" / "0.png")
    os.utime(root / "ant", ns=(stamp, stamp))  # the directory looks untouched
    assert folder_fingerprint(dataset) != first
    after = (client_path(spec, 0, 2), server_path(spec), global_test_path(spec))
    assert all(a != b for a, b in zip(after, before, strict=True))
    with pytest.raises(ValueError, match="2 sizes"):  # the rewritten image is seen
        inspect_folder(dataset)


def test_named_datasets_keep_their_cache_keys() -> None:
    """Only folders gained the content key: MNIST-5k's cached files stay where they were
    (the key of format 3, pinned)."""
    from fedorasflwr.data.cache import client_path, server_path

    assert (
        client_path(DataSpec(), 0, 20).name == "client-mnist5k-0-of-20-a1cf8623648e9bcd2d426056.pt"
    )
    assert server_path(DataSpec()).name == "server-mnist5k-416721cd57e02fab5bbdcabe.pt"


def test_a_touched_image_changes_the_key_and_a_dangling_link_is_named(tmp_path: Path) -> None:
    """Same bytes, a new modification time: a new key (the file may have been rewritten with
    the same size). A link to nothing is refused by the check, naming it, not with a raw
    ``FileNotFoundError`` from the fingerprint."""
    import os

    from fedorasflwr.data.folder import folder_fingerprint

    root = _folder(tmp_path / "im", {"ant": [(5, 6)] * 2, "bee": [(5, 6)] * 2})
    dataset = f"folder:{root}"
    first = folder_fingerprint(dataset)
    stat = os.stat(root / "bee" / "1.png")
    os.utime(root / "bee" / "1.png", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert folder_fingerprint(dataset) != first
    (root / "bee" / "2.png").symlink_to(tmp_path / "missing.png")
    assert folder_fingerprint(dataset)  # no error from the key itself
    with pytest.raises(ValueError, match="cannot read image .*2.png"):
        inspect_folder(dataset)
