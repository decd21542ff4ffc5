"""A synthetic image folder of coloured shapes: a dataset this project was never tuned on.

Issue 40 asked that every method's defaults hold on an image folder nobody tuned them for.
This writes one: ``<root>/<class>/<index>.png``, 32x32 RGB, one shape per image (``CLASSES``:
circle, square, triangle, cross, ring, bar), each drawn upright (a bar lies horizontal or
vertical) at a random centre and size, in a random foreground colour on a random background
colour, with Gaussian pixel noise. Colour, position and size carry no label information; only the
shape does. Chance is ``1 / len(CLASSES)``.

    python -m fedorasflwr.data.shapes /tmp/shapes --per-class 300 --seed 0

Run with ``data.dataset = "folder:/tmp/shapes"`` (docs/running.md). The same seed draws the
same pixels (the seed's ``shapes`` stream of `fedorasflwr.seeding`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

__all__ = ["CLASSES", "SIZE", "draw", "write_shapes"]

CLASSES = ("bar", "circle", "cross", "ring", "square", "triangle")
SIZE = 32


def _mask(shape: str, rng: np.random.Generator) -> np.ndarray:
    """A boolean ``SIZE x SIZE`` mask of one ``shape`` at a random centre and radius."""
    radius = rng.uniform(6.0, 11.0)
    cy, cx = rng.uniform(radius + 1, SIZE - radius - 1, size=2)
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64) + 0.5
    dy, dx = y - cy, x - cx
    if shape == "circle":
        return dy**2 + dx**2 <= radius**2
    if shape == "ring":
        distance = np.sqrt(dy**2 + dx**2)
        return (distance <= radius) & (distance >= 0.55 * radius)
    if shape == "square":
        half = radius / np.sqrt(2) * 1.2
        return (np.abs(dy) <= half) & (np.abs(dx) <= half)
    if shape == "cross":
        arm = radius * 0.3
        return ((np.abs(dy) <= arm) & (np.abs(dx) <= radius)) | (
            (np.abs(dx) <= arm) & (np.abs(dy) <= radius)
        )
    if shape == "bar":  # a long thin rectangle, horizontal or vertical
        long, thin = (dy, dx) if rng.random() < 0.5 else (dx, dy)
        return (np.abs(long) <= radius) & (np.abs(thin) <= radius * 0.25)
    if shape == "triangle":  # apex up: inside when below the two slanted edges
        top, bottom = cy - radius, cy + 0.6 * radius
        half_width = (y - top) / (bottom - top) * radius
        return (y >= top) & (y <= bottom) & (np.abs(dx) <= half_width)
    raise ValueError(f"shape must be one of {', '.join(CLASSES)}, got {shape!r}")


def draw(shape: str, rng: np.random.Generator) -> np.ndarray:
    """One ``SIZE x SIZE x 3`` uint8 image of ``shape``: random colours, place and noise."""
    mask = _mask(shape, rng)
    background = rng.uniform(0, 255, size=3)
    foreground = rng.uniform(0, 255, size=3)
    while np.abs(foreground - background).sum() < 150:  # keep the shape visible
        foreground = rng.uniform(0, 255, size=3)
    image = np.where(mask[..., None], foreground, background)
    image = image + rng.normal(0.0, 12.0, size=image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def write_shapes(root: str | Path, per_class: int, seed: int = 0) -> Path:
    """Write ``per_class`` PNG images of every class under ``root``; returns ``root``."""
    from PIL import Image

    if per_class < 1:
        raise ValueError(f"per_class must be at least 1, got {per_class}")
    from ..seeding import numpy_stream

    root = Path(root)
    rng = numpy_stream(seed, "shapes")
    for name in CLASSES:
        (root / name).mkdir(parents=True, exist_ok=True)
    for index in range(per_class):  # interleaved, so a larger per_class extends a smaller
        for name in CLASSES:
            Image.fromarray(draw(name, rng), mode="RGB").save(root / name / f"{index:05d}.png")
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="the folder to write (<root>/<class>/<index>.png)")
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    root = write_shapes(args.root, args.per_class, args.seed)
    print(f"wrote {args.per_class * len(CLASSES)} images of {len(CLASSES)} classes to {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
