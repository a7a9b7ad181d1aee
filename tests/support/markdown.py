"""What a person reads where Streamlit renders a string as Markdown.

AppTest hands tests the Markdown source of an element (`st.error(…).value`, a caption, a
title); pages escape outside text in it (`dashboard.format.plain`). `shown(source)` renders the
source with markdown-it-py (CommonMark, as Streamlit's renderer parses it) and returns the text
of the result; `links_and_images(source)` lists the links and images it would draw.
"""

from __future__ import annotations

import html
import re

from markdown_it import MarkdownIt

_RENDERER = MarkdownIt("commonmark").enable(["table", "strikethrough"])
_TAG = re.compile(r"<[^>]+>")
# GitHub's autolinks, which CommonMark leaves as text: a bare http(s):// or www. address.
_BARE_ADDRESS = re.compile(r"(?:https?://|www\.)\S", re.IGNORECASE)


def to_html(source: str) -> str:
    return _RENDERER.render(str(source))


def shown(source: object) -> str:
    """The text of `source` rendered as Markdown, its hard line breaks as newlines."""
    rendered = to_html(str(source)).replace("<br />\n", "\n")
    return html.unescape(_TAG.sub("", rendered)).strip()


def links_and_images(source: object) -> list[str]:
    """Every link and image `source` renders to (`<a …>`, `<img …>`), and every bare address
    GitHub-flavoured Markdown would turn into a link."""
    found = re.findall(r"<(?:a|img)\b[^>]*>", to_html(str(source)))
    # Streamlit's renderer also links a bare address written as it is (not escaped).
    return found + _BARE_ADDRESS.findall(str(source))
