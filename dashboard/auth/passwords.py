"""The scrypt password hash in TRAINDECK_PASSWORD_HASH, and the length a password may have."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

MIN_PASSWORD_LENGTH = 8
MAX_PASSWORD_LENGTH = 1024

_SCRYPT_N, _SCRYPT_R, _SCRYPT_P, _SCRYPT_LENGTH = 2**14, 8, 1, 32


class PasswordHashError(ValueError):
    """TRAINDECK_PASSWORD_HASH is not a hash this module made."""


@dataclass(frozen=True)
class PasswordHash:
    """An scrypt hash: `scrypt:N:r:p:salt:digest`, salt and digest in URL-safe base64."""

    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def encode(self) -> str:
        salt = base64.urlsafe_b64encode(self.salt).decode("ascii")
        digest = base64.urlsafe_b64encode(self.digest).decode("ascii")
        return f"scrypt:{self.n}:{self.r}:{self.p}:{salt}:{digest}"

    def matches(self, password: str) -> bool:
        """Whether `password` hashes to this digest (compared in constant time)."""
        candidate = _scrypt(password, self.salt, self.n, self.r, self.p, len(self.digest))
        return hmac.compare_digest(candidate, self.digest)

    @property
    def fingerprint(self) -> str:
        """Short and one-way: a session cookie made under another password is not valid."""
        return hashlib.sha256(self.encode().encode("ascii")).hexdigest()[:16]


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=length, maxmem=256 * 2**20
    )


def hash_password(password: str) -> str:
    """The value for TRAINDECK_PASSWORD_HASH."""
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, _SCRYPT_N, _SCRYPT_R, _SCRYPT_P, _SCRYPT_LENGTH)
    return PasswordHash(_SCRYPT_N, _SCRYPT_R, _SCRYPT_P, salt, digest).encode()


def parse_password_hash(text: str) -> PasswordHash:
    parts = text.strip().split(":")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise PasswordHashError("expected scrypt:N:r:p:salt:digest")
    try:
        n, r, p = (int(part) for part in parts[1:4])
        salt = base64.urlsafe_b64decode(parts[4].encode("ascii"))
        digest = base64.urlsafe_b64decode(parts[5].encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise PasswordHashError("N, r and p must be numbers; salt and digest base64") from None
    if not (2 <= n <= 2**20 and n & (n - 1) == 0):
        raise PasswordHashError("N must be a power of two up to 2^20")
    if not (1 <= r <= 32 and 1 <= p <= 16):
        raise PasswordHashError("r must be 1-32 and p 1-16")
    if len(salt) < 8 or len(digest) < 16:
        raise PasswordHashError("the salt or the digest is too short")
    return PasswordHash(n, r, p, salt, digest)
