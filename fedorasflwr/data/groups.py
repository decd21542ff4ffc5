"""Class groups of the FDNAS split: parsing, the default layout, even splits.

Pure helpers (no data, no ``datasets`` import), shared by :class:`.spec.DataSpec`
and :class:`.partition.ClassGroupPartitioner`.
"""

from __future__ import annotations

__all__ = ["even_sizes", "default_class_groups", "parse_class_groups"]

_ALLOWED = "groups of class ids separated by ';', ids by ',', e.g. '0,1,2;3,4,5;6,7,8,9'"


def _invalid(value: str, allowed: str) -> ValueError:
    return ValueError(f"run config 'data.class-groups' = {value!r} is invalid: {allowed}")


def even_sizes(total: int, parts: int) -> list[int]:
    """Split ``total`` into ``parts`` near-equal sizes, the remainder going to the last parts.

    ``even_sizes(10, 3) == [3, 3, 4]`` (the FDNAS layout: 3, 3 and 4 clients / classes).
    """
    sizes = [total // parts] * parts
    for i in range(total % parts):
        sizes[parts - 1 - i] += 1
    return sizes


def default_class_groups(num_classes: int) -> tuple[tuple[int, ...], ...]:
    """Three contiguous class groups, the remainder in the last (10 classes: 0-2, 3-5, 6-9)."""
    groups, start = [], 0
    for size in even_sizes(num_classes, min(3, num_classes)):
        groups.append(tuple(range(start, start + size)))
        start += size
    return tuple(groups)


def parse_class_groups(text: str) -> tuple[tuple[int, ...], ...]:
    """Parse ``"0,1,2;3,4,5;6,7,8,9"`` into disjoint groups of class ids.

    Raises
    ------
    ValueError
        Naming ``data.class-groups`` if a group is empty, an id is not a
        non-negative integer or a class appears twice.
    """
    groups: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for part in text.split(";"):
        items = [item.strip() for item in part.split(",") if item.strip()]
        if not items or not all(item.isdigit() for item in items):
            raise _invalid(text, _ALLOWED + " (non-negative integers)")
        group = tuple(int(item) for item in items)
        if seen.intersection(group) or len(set(group)) != len(group):
            raise _invalid(text, "each class may appear in one group only")
        seen.update(group)
        groups.append(group)
    return tuple(groups)
