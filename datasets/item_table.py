"""A dataset's labelled images, kept compactly for a job's DataLoaders.

A list of (path, label) pairs costs about 160 bytes an image in Python objects (a tuple, a
path string, a label reference); at 200,000 images that is some 30 MB, and fastai's index
lists for the split double it. An `ItemTable` keeps the same pairs as one UTF-8 byte string of
names (relative to one path prefix, separated by NUL, which no file name holds), an array of
where each ends, and a small integer code per image into the class names: about 25 bytes an
image. A pair is made only when an item is read.

A table is also a view: `take(indices)` and slicing give a table over the same storage with
its own order (a numpy index array; a slice of it is a view, not a copy). fastai treats it as
an array-like collection (it has `iloc`, as a pandas DataFrame has), so `TfmdLists` and
`Datasets` index it instead of copying it into lists.

Pure data: no database, no torch.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SEPARATOR = "\0"


def _code_dtype(class_count: int) -> type[np.integer]:
    return np.int16 if class_count <= np.iinfo(np.int16).max else np.int32


def _index_dtype(largest: int) -> type[np.integer]:
    return np.int32 if largest <= np.iinfo(np.int32).max else np.int64


class ItemTable:
    """(path, label) pairs: `table[i]` is the pair of its i-th item, `len(table)` their
    count; an integer array, a list of indices or a slice selects a new table (a view)."""

    def __init__(
        self,
        prefix: str,
        names: bytes,
        bounds: np.ndarray,
        codes: np.ndarray,
        classes: Sequence[str],
        index: np.ndarray | None = None,
    ) -> None:
        self.prefix = prefix
        self._names = names  # every name in UTF-8, each followed by a NUL
        self._bounds = bounds  # name i is _names[_bounds[i] + 1 : _bounds[i + 1]]
        self._codes = codes  # class code of each stored name
        self.classes = list(classes)
        self._index = index  # the stored names this table shows, in its order; None: all

    @classmethod
    def from_names(
        cls, prefix: str, names: Sequence[str], codes: Sequence[int], classes: Sequence[str]
    ) -> ItemTable:
        """A table of `prefix + name` for each of `names`, labelled `classes[code]`."""
        if len(names) != len(codes):
            raise ValueError(f"{len(names)} names but {len(codes)} labels")
        data = (SEPARATOR.join(names) + SEPARATOR).encode("utf-8") if names else b""
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0)
        if len(ends) != len(names):
            raise ValueError("a file name holds a NUL character")
        bounds = np.empty(len(ends) + 1, dtype=_index_dtype(len(data)))
        bounds[0] = -1
        bounds[1:] = ends
        return cls(
            prefix, data, bounds, np.asarray(codes, dtype=_code_dtype(len(classes))), classes
        )

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[Path | str, str]]) -> ItemTable:
        """A table of the (path, label) pairs of a folder scan."""
        paths: list[str] = []
        labels: list[str] = []
        for path, label in pairs:
            paths.append(str(path))
            labels.append(label)
        classes = sorted(set(labels))
        number = {label: code for code, label in enumerate(classes)}
        return cls.from_names("", paths, [number[label] for label in labels], classes)

    # --- a sequence of pairs ---------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._bounds) - 1 if self._index is None else len(self._index)

    def _stored(self, position: int) -> int:
        return position if self._index is None else int(self._index[position])

    def path(self, position: int) -> str:
        stored = self._stored(position)
        start, end = self._bounds[stored] + 1, self._bounds[stored + 1]
        return self.prefix + self._names[start:end].decode("utf-8")

    def label(self, position: int) -> str:
        return self.classes[self._codes[self._stored(position)]]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, numbers.Integral) or getattr(key, "ndim", 1) == 0:
            position = operator.index(key)
            count = len(self)
            if not -count <= position < count:
                raise IndexError(f"item {position} of {count}")
            position %= count
            return self.path(position), self.label(position)
        return self.take(key)

    def take(self, key: Any) -> ItemTable:
        """The items at `key` (a slice, an integer array or a list of positions, or a boolean
        mask), in that order, as a table over the same storage."""
        stored = len(self._bounds) - 1
        if isinstance(key, slice):
            everything = np.arange(stored, dtype=_index_dtype(stored))
            index = (everything if self._index is None else self._index)[key]
        else:
            positions = np.asarray(key)
            if positions.dtype == bool:
                positions = np.flatnonzero(positions)
            positions = positions.astype(_index_dtype(stored), copy=False)
            index = positions if self._index is None else self._index[positions]
        return ItemTable(self.prefix, self._names, self._bounds, self._codes, self.classes, index)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return (self[position] for position in range(len(self)))

    # What fastai's `L` looks for in an array-like collection (a pandas DataFrame has both):
    # with `iloc` it indexes the collection itself instead of copying it into a list.
    @property
    def iloc(self) -> ItemTable:
        return self

    def itertuples(self) -> Iterator[tuple[str, str]]:
        return iter(self)

    def __repr__(self) -> str:
        return f"ItemTable({len(self):,} images in {len(self.classes)} classes)"

    # --- labels ----------------------------------------------------------------------------

    @property
    def codes(self) -> np.ndarray:
        """The class code (an index into `classes`) of each item, in the table's order."""
        return self._codes if self._index is None else self._codes[self._index]

    def present_classes(self) -> list[str]:
        """The classes of the items in this table, sorted."""
        return sorted(self.classes[code] for code in np.unique(self.codes))

    @property
    def stored_bytes(self) -> int:
        """The memory the table's arrays take (its storage and its order)."""
        own = 0 if self._index is None else self._index.nbytes
        return len(self._names) + self._bounds.nbytes + self._codes.nbytes + own
