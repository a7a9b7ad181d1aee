"""Settings: the HTTP API's tokens, made and revoked by whoever is signed in.

A new token is shown once, in the run right after it is made (its copy button is the way to
keep it); the database holds its SHA-256 only (`db.tokens`). The list shows each token by its
first characters, with its state and times.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import auth
from dashboard.format import plain
from dashboard.state import get_engine
from db.engine import Engine
from db.tokens import LIFETIMES_DAYS, TokenError, TokenInfo, create_token, list_tokens, revoke_token

NEW_TOKEN_KEY = "settings.new_token"
PROBLEM_KEY = "settings.token_problem"
NAME_KEY, DAYS_KEY, REVOKE_KEY = "settings.token_name", "settings.token_days", "settings.revoke"


def _creator() -> str:
    """Who makes a token, as the list shows it (a password sign-in's session id is kept out)."""
    identity = auth.session_identity()
    if identity is None:
        return "open dashboard (loopback)"
    return "password sign-in" if identity.startswith("password:") else identity


def make_token(engine: Engine) -> None:
    st.session_state.pop(PROBLEM_KEY, None)
    try:
        info, secret = create_token(
            engine, st.session_state.get(NAME_KEY, ""), st.session_state[DAYS_KEY], _creator()
        )
    except TokenError as exc:
        st.session_state[PROBLEM_KEY] = str(exc)
        return
    st.session_state[NEW_TOKEN_KEY] = (info.name, secret)
    st.session_state[NAME_KEY] = ""


def revoke(engine: Engine) -> None:
    token_id = st.session_state.get(REVOKE_KEY)
    if token_id is not None and revoke_token(engine, token_id):
        st.toast("Revoked: the API refuses that token from now on.")


def tokens_table(tokens: list[TokenInfo]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "name": [token.name for token in tokens],
            "token": [f"{token.prefix}…" for token in tokens],
            "state": [token.state() for token in tokens],
            "expires": [token.expires_at for token in tokens],
            "last used": [token.last_used_at for token in tokens],
            "created": [token.created_at for token in tokens],
            "created by": [token.created_by for token in tokens],
        }
    )


engine = get_engine()
st.title("Settings")
st.subheader("API tokens")
st.caption(
    "A script or a notebook uses the HTTP API under /api/v1 (described at "
    "/api/v1/openapi.json; `traindeck.client` in Python) with a token in an "
    "`Authorization: Bearer …` header. A token can do everything a signed-in person can."
)
with st.form("settings.token_form", clear_on_submit=False):
    name_column, days_column = st.columns([3, 1])
    name_column.text_input("Name", key=NAME_KEY, placeholder="what or who uses it")
    days_column.selectbox(
        "Expires after", LIFETIMES_DAYS, index=2, key=DAYS_KEY,
        format_func=lambda days: f"{days} day" + ("s" if days > 1 else ""),
    )  # fmt: skip
    st.form_submit_button("Create token", icon=":material/key:", on_click=make_token,
                          args=(engine,))  # fmt: skip
if st.session_state.get(PROBLEM_KEY):
    st.error(plain(st.session_state[PROBLEM_KEY]), icon=":material/error:")
created = st.session_state.pop(NEW_TOKEN_KEY, None)
if created is not None:
    st.success(
        f"Token {plain(created[0])} created. Copy it now: it is not shown again.",
        icon=":material/key:",
    )
    st.code(created[1], language=None)

tokens = list_tokens(engine)
if not tokens:
    st.info("No tokens yet: the API refuses every request until one is made.")
    st.stop()
st.dataframe(tokens_table(tokens), hide_index=True, width="stretch")
active = {token.id: token for token in tokens if token.state() == "active"}
if active:
    revoke_column, button_column = st.columns([3, 1], vertical_alignment="bottom")
    revoke_column.selectbox(
        "Token to revoke", list(active), key=REVOKE_KEY,
        format_func=lambda token_id: f"{active[token_id].name} ({active[token_id].prefix}…)",
    )  # fmt: skip
    button_column.button("Revoke", icon=":material/block:", on_click=revoke, args=(engine,))
