"""Who may use the dashboard: the policy for its address, the ways to sign in, allowed users.

`policy()` reads the address (Streamlit's server.address), the settings (`common.settings`)
and the [auth] section of .streamlit/secrets.toml each time it is called. Any setting that
cannot be used is a problem: nobody gets in until it is fixed.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from streamlit import config
from streamlit.auth_util import get_secrets_auth_section

from common.settings import IPNetwork, SettingsError, settings
from dashboard.auth.passwords import PasswordHash, PasswordHashError, parse_password_hash

PASSWORD_HASH_ENV = "TRAINDECK_PASSWORD_HASH"
AUTH_MODE_ENV = "TRAINDECK_AUTH"
ALLOWED_USERS_ENV = "TRAINDECK_ALLOWED_USERS"


def listens_on_loopback(address: str | None) -> bool:
    """Whether a server bound to `address` can be reached from this machine only.

    Unset or empty binds every interface. A host name counts only when every address it
    resolves to is loopback; one that does not resolve counts as reachable.
    """
    if address is None or not address.strip():
        return False
    host = address.strip().strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(resolved) and all(
        ipaddress.ip_address(item.split("%", 1)[0]).is_loopback for item in resolved
    )


@dataclass(frozen=True)
class Policy:
    """Whether sign-in is required, and how a person signs in."""

    address: str | None
    required: bool
    password: PasswordHash | None
    oidc_providers: tuple[str, ...]
    # Required for no reason but the address (nothing configured, nothing forced).
    by_address_only: bool = False
    # Why nobody can sign in, when sign-in is required but cannot work.
    problem: str | None = None
    # TRAINDECK_PUBLIC_URL's host name and whether it is https; TRAINDECK_TRUSTED_PROXIES.
    public_host: str | None = None
    public_https: bool = False
    trusted_proxies: tuple[IPNetwork, ...] = ()

    @property
    def configured(self) -> bool:
        return self.password is not None or bool(self.oidc_providers)

    def describe(self) -> str:
        where = f"listens on {self.address}" if self.address else "listens on every interface"
        if self.problem:
            return f"the dashboard {where}; nobody can sign in: {self.problem}"
        if not self.required:
            return f"the dashboard {where} (loopback only); no sign-in"
        ways = (["password"] if self.password else []) + [
            f"OIDC ({name})" for name in self.oidc_providers
        ]
        return f"the dashboard {where}; sign-in required: {', '.join(ways)}"


def _configured_address() -> str | None:

    value = config.get_option("server.address")
    return str(value) if value else None


def _oidc_providers() -> tuple[tuple[str, ...], str | None]:
    """The providers in secrets.toml's [auth] section, and a problem that stops them working."""

    try:
        section = get_secrets_auth_section()
    except Exception as exc:  # a malformed secrets.toml
        return (), f".streamlit/secrets.toml cannot be read ({exc})"
    if not section:
        return (), None
    providers = ["default"] if section.get("client_id") else []
    providers += [
        name
        for name, value in section.items()
        if isinstance(value, Mapping) and "client_id" in value
    ]
    if not providers:
        return (), "the [auth] section of .streamlit/secrets.toml names no provider (client_id)"
    for key in ("redirect_uri", "cookie_secret"):
        if not section.get(key):
            return (), f"the [auth] section of .streamlit/secrets.toml has no {key}"
    if importlib.util.find_spec("authlib") is None:
        return (), "OIDC sign-in needs Authlib: pip install -r requirements.txt"
    return tuple(providers), None


def policy(address: str | None = None, *, use_config: bool = True) -> Policy:
    """The policy for a server bound to `address` (by default Streamlit's server.address)."""
    if address is None and use_config:
        address = _configured_address()
    try:
        current = settings()
    except SettingsError as exc:
        # A setting that cannot be used (any of them) lets nobody in until it is fixed.
        return Policy(address, required=True, password=None, oidc_providers=(), problem=str(exc))
    problems: list[str] = []
    forced = current.auth == "required"

    password = None
    if current.password_hash is not None:
        try:
            password = parse_password_hash(current.password_hash.get_secret_value())
        except PasswordHashError as exc:
            problems.append(
                f"{PASSWORD_HASH_ENV} is not a hash made by `python -m dashboard.auth hash` ({exc})"
            )
            forced = True

    providers, oidc_problem = _oidc_providers()
    if oidc_problem:
        problems.append(oidc_problem)
        forced = True

    asked_for = forced or password is not None or bool(providers)
    required = asked_for or not listens_on_loopback(address)
    if required and not problems and password is None and not providers:
        problems.append(
            "sign-in is required here but none is configured. Set "
            f"{PASSWORD_HASH_ENV} (make one with `python -m dashboard.auth hash`) or an "
            "[auth] section in .streamlit/secrets.toml, then restart the dashboard; or serve "
            "it on 127.0.0.1 only"
        )
    return Policy(
        address=address,
        required=required,
        password=password,
        oidc_providers=providers,
        by_address_only=required and not asked_for,
        problem="; ".join(problems) or None,
        public_host=current.public_host,
        public_https=current.public_https,
        trusted_proxies=current.trusted_proxies,
    )


def allowed_users() -> set[str]:
    """TRAINDECK_ALLOWED_USERS: e-mail addresses and `@domain`s; empty lets anyone in."""
    return set(settings().allowed_users)


def user_allowed(user: Mapping[str, object]) -> bool:
    """Whether an OIDC user is on TRAINDECK_ALLOWED_USERS (by a verified e-mail address)."""
    allowed = allowed_users()
    if not allowed:
        return True
    email = str(user.get("email") or "").strip().lower()
    if not email or user.get("email_verified") is False or "@" not in email:
        return False
    return email in allowed or "@" + email.rsplit("@", 1)[1] in allowed
