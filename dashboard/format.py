"""Numbers, times and outside text as a person reads them.

`plain(text)` is the one way a page shows a string it did not write itself (a job's name or
error, a device, a worker id, a class name, a CSV label, a file name, an exception's message, the
address's query parameters) inside anything Streamlit renders as Markdown: `st.markdown`,
`st.caption`, `st.title`, `st.error`/`warning`/`info`/`success`, a metric, an image caption, a
widget or expander label. Selectbox options and dataframe cells are shown as text already.
`chart_text(text)` does the same for a plotly chart's labels, which know some HTML.
"""

from __future__ import annotations

import html
import re
from datetime import datetime

from db.models import utcnow

# Every ASCII punctuation character: CommonMark lets a backslash escape each of them, and they
# are all that Markdown (with GitHub's and Streamlit's extensions: links, images, autolinks,
# `:red[…]`, `:material/…:`, `$…$`, tables, HTML) builds its syntax from.
_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


# Streamlit's renderer also turns a bare `http://…`, `www.…` or `name@host.tld` into a link. It
# finds them in the text after parsing, escapes or not, so an invisible word joiner goes where
# none of them can then match: before `://`, between `www` and `.`, after `@`.
WORD_JOINER = "\u2060"
_BARE_ADDRESS_START = re.compile(r"(?=://)|(?<=www)(?=\.)|(?<=@)", re.IGNORECASE)


def plain(text: object) -> str:
    """`text` as Markdown that renders as exactly that text, line breaks kept: no link, image,
    emphasis, heading, list, code, HTML or directive can come out of it. (A bare address gets
    an invisible word joiner, so that it is not made a link either.)"""
    text = _BARE_ADDRESS_START.sub(WORD_JOINER, str(text))
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    # A backslash at the end of a line is a hard line break in CommonMark.
    return "\\\n".join(_MARKDOWN_PUNCTUATION.sub(r"\\\1", line) for line in lines)


def chart_text(text: object) -> str:
    """`text` for a plotly chart's labels (axis categories, legend names), which render a few
    HTML tags (`<a href>` becomes a link): escaped, so that it shows as it is."""
    return html.escape(str(text), quote=False)


def duration(seconds: float | None) -> str:
    """`42s`, `3m 05s`, `2h 10m`, `3d 4h`; empty for None."""
    if seconds is None:
        return ""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def since(moment: datetime | None, now: datetime | None = None) -> float | None:
    """Seconds from `moment` to now (None for None)."""
    if moment is None:
        return None
    return ((now or utcnow()) - moment).total_seconds()


def between(start: datetime | None, end: datetime | None) -> float | None:
    """Seconds from `start` to `end`, or to now while `end` is None."""
    if start is None:
        return None
    return ((end or utcnow()) - start).total_seconds()


def size(byte_count: int) -> str:
    value = float(byte_count)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return ""
    return f"{value:.{digits}g}"
