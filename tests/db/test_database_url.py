"""A database URL's password never reaches a message: not in DATABASE_URL's error, not in the
URL shown to a person (issue 23, finding 6). The pages: tests/dashboard/test_secrets.py."""

from __future__ import annotations

import pytest

from db.engine import DatabaseUrlError, create_db_engine, printable_url

PASSWORD = "s3cr3t-Pa55"

MALFORMED = [
    f"postgresql://ada:{PASSWORD}@db:notaport/traindeck",  # the port is not a number
    f"postgres://ada:{PASSWORD}@x:y@db.example:5432/traindeck",  # an unescaped @ in it
    f"ada:{PASSWORD}@db.example/traindeck",  # no scheme
    f"postgresql://ada:{PASSWORD}@[::1/traindeck",  # a broken IPv6 host
]


@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_database_url_is_named_without_its_password(url: str):
    with pytest.raises(DatabaseUrlError) as raised:
        create_db_engine(url)
    message = str(raised.value)
    assert "is not a database URL" in message
    assert PASSWORD not in message and "***" in message
    assert "ada" in message  # still says which URL it was
    # Nothing chained to it (the parser's own message quotes a piece of the URL) either.
    assert raised.value.__cause__ is None


@pytest.mark.parametrize(
    "url",
    [
        *MALFORMED,
        f"postgresql+psycopg://ada:{PASSWORD}@db.example:5432/traindeck",
        f"mysql://ada:{PASSWORD}@db.example/traindeck",
    ],
)
def test_a_printable_url_has_no_password(url: str):
    shown = printable_url(url)
    assert PASSWORD not in shown
    assert "ada" in shown and "traindeck" in shown


def test_a_url_without_a_password_is_shown_as_it_is():
    assert printable_url("postgresql://ada@db.example/traindeck") == (
        "postgresql://ada@db.example/traindeck"
    )
    assert printable_url("sqlite:////tmp/data/traindeck.db") == "sqlite:////tmp/data/traindeck.db"
