"""A destination's Apprise URL, checked before it is saved and masked wherever it is shown.

An Apprise URL carries its secrets (a webhook token, a password); the database keeps it whole,
because sending needs it, and beside it the form Apprise prints with `privacy=True` (secrets
cut to their first and last characters), the only form a page, the CLI or a log shows.
"""

from __future__ import annotations

from typing import Any

import apprise

from db.alerts import add_destination
from db.engine import Engine
from db.inputs import FieldError


def masked_url(url: str) -> str:
    """`url` as Apprise prints it with its secrets masked; FieldError for a URL that
    Apprise cannot use."""
    url = (url or "").strip()
    if not url:
        raise FieldError("url", "must not be empty")
    plugin = apprise.Apprise.instantiate(url)
    if plugin is None:
        scheme = url.split("://", 1)[0] if "://" in url else ""
        known = f"{scheme}:// is not a service Apprise knows, or " if scheme else ""
        raise FieldError(
            "url",
            f"{known}the URL is incomplete (see https://github.com/caronc/apprise/wiki for "
            "each service's form, e.g. slack://…, ntfys://…, mailtos://…, json://host/path)",
        )
    return plugin.url(privacy=True)


def save_destination(engine: Engine, name: str, url: str, events: Any) -> int:
    """Check the URL with Apprise and save the destination; FieldError names a wrong
    input."""
    return add_destination(engine, name, url.strip(), masked_url(url), events)
