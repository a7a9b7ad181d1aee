"""Who may use the dashboard: optional on a loopback address, required anywhere else.

The rule (`policy()`, in `access`):
- The dashboard listens where Streamlit's `server.address` says (the Procfile passes
  `--server.address ${TRAINDECK_ADDRESS:-127.0.0.1}`). Unset, empty, `0.0.0.0`, `::`, another
  machine's address or a host name that resolves to one means other machines can connect:
  sign-in is required. Only an address that is loopback through and through (127.0.0.0/8,
  ::1, `localhost`) lets the dashboard run open.
- Configuring a way to sign in (or `TRAINDECK_AUTH=required`, for a reverse proxy on the same
  machine) turns sign-in on whatever the address.
- Open, it answers only requests that name it by a loopback name (`localhost`, `127.0.0.1`,
  `[::1]`), the name it listens on or TRAINDECK_PUBLIC_URL's host (`clients`): a web page
  that rebinds its own name to 127.0.0.1 gets 403, on HTTP and on the websocket.
- Two ways to sign in, either or both: a password whose scrypt hash (`passwords`) is in
  `TRAINDECK_PASSWORD_HASH` (make it with `python -m dashboard.auth hash`, `cli`), or
  Streamlit's OIDC login (`st.login`), configured in the `[auth]` section of
  `.streamlit/secrets.toml`.
- Sign-in required but no way configured (or a malformed one): nobody gets in, and every page
  says what to set.

`SignInGate` (`server`) is an ASGI middleware in front of everything the `st.App` serves:
without valid credentials a browser gets the sign-in page, the app's websocket is refused (so
no page script runs) and downloads, uploads and media answer 401. `require_sign_in()` (`page`)
repeats the check inside the page script. The password sign-in (`/signin`) sets a signed,
HttpOnly cookie (`sessions`), Secure when the browser comes over https (`clients.over_https`);
failed attempts are throttled per client address and per account with exponential back-off,
never for everyone (`ratelimit`); the client's address comes from X-Forwarded-For only from a
proxy in TRAINDECK_TRUSTED_PROXIES (`clients.client_address`). Download links are bound to
the sign-in that made them (`session_identity`, `identity_from_cookies`).

The names below are re-exported for callers (`from dashboard import auth`). A test that patches
a function or state that the package's own modules use patches the module that holds it.
"""

from dashboard.auth.access import (
    ALLOWED_USERS_ENV,
    AUTH_MODE_ENV,
    PASSWORD_HASH_ENV,
    Policy,
    allowed_users,
    listens_on_loopback,
    policy,
    user_allowed,
)
from dashboard.auth.clients import answered_names, client_address, host_answered, over_https
from dashboard.auth.page import require_sign_in
from dashboard.auth.passwords import (
    MAX_PASSWORD_LENGTH,
    MIN_PASSWORD_LENGTH,
    PasswordHash,
    PasswordHashError,
    hash_password,
    parse_password_hash,
)
from dashboard.auth.ratelimit import (
    PER_ACCOUNT,
    PER_CLIENT,
    AttemptLimiter,
    Backoff,
    limiter,
    too_many_attempts_message,
)
from dashboard.auth.server import (
    PUBLIC_PATHS,
    SIGNIN_PATH,
    SIGNOUT_PATH,
    SignInGate,
    SignInRoutes,
    routes,
    signin_page,
)
from dashboard.auth.sessions import (
    DEVICE_COOKIE,
    SESSION_COOKIE,
    SESSION_HOURS_ENV,
    device_from_cookies,
    identity_from_cookies,
    new_device_cookie,
    new_session_cookie,
    session_identity,
)

__all__ = [
    "ALLOWED_USERS_ENV",
    "AUTH_MODE_ENV",
    "DEVICE_COOKIE",
    "MAX_PASSWORD_LENGTH",
    "MIN_PASSWORD_LENGTH",
    "PASSWORD_HASH_ENV",
    "PER_ACCOUNT",
    "PER_CLIENT",
    "PUBLIC_PATHS",
    "SESSION_COOKIE",
    "SESSION_HOURS_ENV",
    "SIGNIN_PATH",
    "SIGNOUT_PATH",
    "AttemptLimiter",
    "Backoff",
    "PasswordHash",
    "PasswordHashError",
    "Policy",
    "SignInGate",
    "SignInRoutes",
    "allowed_users",
    "answered_names",
    "client_address",
    "device_from_cookies",
    "hash_password",
    "host_answered",
    "identity_from_cookies",
    "limiter",
    "listens_on_loopback",
    "new_device_cookie",
    "new_session_cookie",
    "over_https",
    "parse_password_hash",
    "policy",
    "require_sign_in",
    "routes",
    "session_identity",
    "signin_page",
    "too_many_attempts_message",
    "user_allowed",
]
