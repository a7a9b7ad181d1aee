"""What a person reads where Streamlit renders a string as Markdown.

AppTest hands tests the Markdown source of an element (`st.error(…).value`, a caption, a
title); pages escape outside text in it (`dashboard.format.plain`). `shown(source)` renders the
source with markdown-it-py (CommonMark, as Streamlit's renderer parses it) and returns the text
of the result, less the invisible word joiners `plain` puts into bare addresses;
`links_and_images(source)` lists the links and images it would draw, bare addresses included
(Streamlit's renderer links those in the parsed text, as GitHub does).
"""

from __future__ import annotations

import html
import re

from markdown_it import MarkdownIt

from dashboard.format import WORD_JOINER

_RENDERER = MarkdownIt("commonmark").enable(["table", "strikethrough"])
_TAG = re.compile(r"<[^>]+>")
# GitHub's autolinks, which CommonMark leaves as text: a bare http(s):// or www. address, or an
# e-mail address (mdast-util-gfm-autolink-literal's patterns).
_BARE_ADDRESS = re.compile(
    r"(?:https?://|www(?=\.))[-.\w]+|[-.\w+]+@[-\w]+(?:\.[-\w]+)+", re.IGNORECASE | re.ASCII
)


def to_html(source: str) -> str:
    return _RENDERER.render(str(source))


def _text(rendered: str) -> str:
    return html.unescape(_TAG.sub("", rendered.replace("<br />\n", "\n"))).strip()


def shown(source: object) -> str:
    """The text of `source` rendered as Markdown, its hard line breaks as newlines."""
    return _text(to_html(str(source))).replace(WORD_JOINER, "")


def links_and_images(source: object) -> list[str]:
    """Every link and image `source` renders to (`<a …>`, `<img …>`), and every bare address
    GitHub-flavoured Markdown would turn into a link."""
    rendered = to_html(str(source))
    found = re.findall(r"<(?:a|img)\b[^>]*>", rendered)
    # Streamlit's renderer also links a bare address in the parsed text, escaped or not.
    return found + _BARE_ADDRESS.findall(_text(rendered))
