"""The compact table of a dataset's (path, label) pairs that a job's DataLoaders index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from datasets.item_table import ItemTable
from datasets.labelling import LabelledItems

NAMES = ["cat/a.png", "dog/b.png", "chat/été 1.png", "dog/🐕.jpg", "cat/c.png"]
CODES = [0, 2, 1, 2, 0]
CLASSES = ["cat", "chat", "dog"]


def table() -> ItemTable:
    return ItemTable.from_names("/data/set/", NAMES, CODES, CLASSES)


def pairs() -> list[tuple[str, str]]:
    return [("/data/set/" + name, CLASSES[code]) for name, code in zip(NAMES, CODES, strict=True)]


def test_the_table_gives_back_every_pair_in_order():
    found = table()
    assert len(found) == 5
    assert list(found) == pairs() == list(found.itertuples())
    assert found[2] == ("/data/set/chat/été 1.png", "chat")
    assert found[-1] == found[4] == ("/data/set/cat/c.png", "cat")
    assert found[np.int64(3)] == pairs()[3]
    with pytest.raises(IndexError):
        found[5]
    with pytest.raises(IndexError):
        found[-6]


def test_a_selection_is_a_view_in_its_own_order_and_selections_compose():
    found = table()
    picked = found.take(np.array([4, 0, 3]))
    assert list(picked) == [pairs()[4], pairs()[0], pairs()[3]]
    assert list(picked[1:]) == [pairs()[0], pairs()[3]]
    assert list(picked[[2, 0]]) == [pairs()[3], pairs()[4]]
    assert list(found[np.array([True, False, False, True, False])]) == [pairs()[0], pairs()[3]]
    assert list(found[::2]) == pairs()[::2]
    assert list(found[3:3]) == []
    assert list(picked.codes) == [0, 0, 2]
    assert picked.present_classes() == ["cat", "dog"]
    assert found.present_classes() == CLASSES


def test_fastai_indexes_the_table_without_copying_it_into_lists():
    from fastai.data.core import TfmdLists
    from fastai.data.transforms import ItemGetter

    lists = TfmdLists(table(), [ItemGetter(1)], splits=[slice(0, 3), slice(3, 5)])
    assert isinstance(lists.items, ItemTable)
    assert [lists[i] for i in range(5)] == [label for _, label in pairs()]
    train = lists.subset(0)
    assert isinstance(train.items, ItemTable) and len(train) == 3
    assert list(train.items) == pairs()[:3]
    assert list(lists.subset(1).items) == pairs()[3:]


def test_a_scan_becomes_a_table_and_the_classes_are_those_with_images():
    scanned = [(Path("/x/dog/1.png"), "dog"), (Path("/x/cat/2.png"), "cat")]
    found = ItemTable.from_pairs(scanned)
    assert list(found) == [("/x/dog/1.png", "dog"), ("/x/cat/2.png", "cat")]
    assert found.classes == ["cat", "dog"]
    # A class that the manifest names but no image has is not one of the items' classes.
    sparse = ItemTable.from_names("", ["a.png", "b.png"], [0, 2], ["a", "unused", "c"])
    assert LabelledItems(sparse).classes == ["a", "c"]
    assert LabelledItems(list(sparse)).classes == ["a", "c"]


def test_a_name_with_a_nul_or_labels_of_another_length_are_refused():
    with pytest.raises(ValueError, match="NUL"):
        ItemTable.from_names("", ["a\0b.png"], [0], ["a"])
    with pytest.raises(ValueError, match="2 names but 1 labels"):
        ItemTable.from_names("", ["a.png", "b.png"], [0], ["a"])
    assert len(ItemTable.from_names("", [], [], [])) == 0


def test_the_table_is_small():
    count = 20_000
    names = [f"class{index % 10}/{index:07d}.png" for index in range(count)]
    found = ItemTable.from_names("/data/", names, [index % 10 for index in range(count)],
                                 [f"class{n}" for n in range(10)])  # fmt: skip
    view = found.take(np.arange(count)[::-1])
    # 18 bytes a name and its NUL, 8 for where it ends, 2 for its class, 8 in a view's order.
    assert found.stored_bytes <= count * (19 + 8 + 2) + 8
    assert view.stored_bytes <= found.stored_bytes + count * 8
    assert view[0] == ("/data/class9/0019999.png", "class9")
