"""Tokens of the HTTP API: made and revoked by a signed-in person, each with an expiry.

A token is `td_` and 43 random URL-safe characters (256 bits), shown once when it is made.
The table keeps its SHA-256 only (a fast hash is enough for a random secret of that size: no
dictionary to try), and its first characters to tell tokens apart. A request's token is
looked up by its hash; a revoked or expired token is refused like an unknown one.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, insert, or_, select, update

from db.engine import read_tx, write_tx
from db.inputs import FieldError, one_line_name
from db.models import ApiToken, utcnow

TOKEN_PREFIX = "td_"
SHOWN_CHARACTERS = 8  # `td_` and the first five random characters: tells tokens apart
MAX_NAME_LENGTH = 100
LIFETIMES_DAYS = (1, 7, 30, 90, 365)
# A used token's last-use time is written at most this often: reads stay reads.
LAST_USED_EVERY = timedelta(minutes=1)


@dataclass(frozen=True)
class TokenInfo:
    """A token as a person sees it: never the secret."""

    id: int
    name: str
    prefix: str
    created_by: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None

    def state(self, now: datetime | None = None) -> str:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.expires_at <= (now or utcnow()) else "active"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(engine: Engine, name: str, days: int, created_by: str) -> tuple[TokenInfo, str]:
    """Make a token valid for `days` days; returns it as listed, and the secret (shown once).
    FieldError names a wrong input."""
    name = one_line_name(name, MAX_NAME_LENGTH)
    if days not in LIFETIMES_DAYS:
        raise FieldError("days", f"must be one of {', '.join(map(str, LIFETIMES_DAYS))}")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    now = utcnow()
    values = {
        "name": name,
        "token_sha256": _digest(secret),
        "prefix": secret[:SHOWN_CHARACTERS],
        "created_by": created_by[:200],
        "created_at": now,
        "expires_at": now + timedelta(days=days),
    }
    with write_tx(engine) as connection:
        token_id = connection.execute(
            insert(ApiToken).values(**values).returning(ApiToken.id)
        ).scalar_one()
    info_values = {key: value for key, value in values.items() if key != "token_sha256"}
    return TokenInfo(id=token_id, revoked_at=None, last_used_at=None, **info_values), secret


_INFO_COLUMNS = (
    ApiToken.id,
    ApiToken.name,
    ApiToken.prefix,
    ApiToken.created_by,
    ApiToken.created_at,
    ApiToken.expires_at,
    ApiToken.revoked_at,
    ApiToken.last_used_at,
)


def list_tokens(engine: Engine) -> list[TokenInfo]:
    """Every token, newest first."""
    with read_tx(engine) as connection:
        rows = connection.execute(select(*_INFO_COLUMNS).order_by(ApiToken.id.desc()))
        return [TokenInfo(**row._mapping) for row in rows]


def revoke_token(engine: Engine, token_id: int) -> bool:
    """Revoke a token at once; False when there is no such token or it was revoked already."""
    with write_tx(engine) as connection:
        result = connection.execute(
            update(ApiToken)
            .where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None))
            .values(revoked_at=utcnow())
        )
    return result.rowcount == 1


def check_token(engine: Engine, token: str) -> tuple[TokenInfo | None, str]:
    """(the token, '') when `token` may be used now; else (None, why not: 'unknown',
    'revoked' or 'expired'). Notes the time of use."""
    with read_tx(engine) as connection:
        row = connection.execute(
            select(*_INFO_COLUMNS).where(ApiToken.token_sha256 == _digest(token))
        ).one_or_none()
    if row is None:
        return None, "unknown"
    info = TokenInfo(**row._mapping)
    now = utcnow()
    if info.state(now) != "active":
        return None, info.state(now)
    if info.last_used_at is None or now - info.last_used_at >= LAST_USED_EVERY:
        with write_tx(engine) as connection:
            connection.execute(
                update(ApiToken)
                .where(
                    ApiToken.id == info.id,
                    or_(ApiToken.last_used_at.is_(None), ApiToken.last_used_at < now),
                )
                .values(last_used_at=now)
            )
    return info, ""
