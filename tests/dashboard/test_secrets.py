"""Secrets on screen (issue 23, finding 6): the database URL's password is on no page."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from db.engine import dispose_engines

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
PASSWORD = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://ada:{PASSWORD}@db:notaport/traindeck",  # the port is not a number
        f"postgres://ada:{PASSWORD}@x:y@db.example:5432/traindeck",  # an unescaped @ in it
    ],
)
def test_every_page_names_a_malformed_database_url_without_its_password(
    url: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("DATABASE_URL", url)
    dispose_engines()
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [str(element.value) for element in (*at.error, *at.markdown, *at.caption, *at.code)]
    assert any("is not a database URL" in text for text in shown), shown
    assert all(PASSWORD not in text for text in shown), shown
