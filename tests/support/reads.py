"""Watching what a piece of code reads under a folder: images opened, folders listed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image


def watch_reads(monkeypatch: pytest.MonkeyPatch, root: Path) -> dict[str, list[str]]:
    """From now on, every image PIL opens (Image.open) and every folder listed (os.scandir,
    os.listdir: what Path.iterdir, os.walk and glob use) under `root`, by path, in order."""
    seen: dict[str, list[str]] = {"opened": [], "listed": []}
    prefix = str(root)
    real_open, real_scandir, real_listdir = Image.open, os.scandir, os.listdir

    def record(kind: str, path: object) -> None:
        text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else ""
        if text.startswith(prefix):
            seen[kind].append(text)

    def open_image(source, *args, **kwargs):
        record("opened", source)
        return real_open(source, *args, **kwargs)

    def scandir(path="."):
        record("listed", path)
        return real_scandir(path)

    def listdir(path="."):
        record("listed", path)
        return real_listdir(path)

    monkeypatch.setattr(Image, "open", open_image)
    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "listdir", listdir)
    return seen
