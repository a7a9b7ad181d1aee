"""Settings: the HTTP API's tokens, and where alerts go.

A new token is shown once, in the run right after it is made (its copy button is the way to
keep it); the database holds its SHA-256 only (`db.tokens`). The list shows each token by its
first characters, with its state and times.

An alert destination is an Apprise URL (`alerts.destinations`) and the events it follows; its
URL is typed into a password field and shown back only masked. The newest alerts are listed
with their outcome (`db.alerts`).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from alerts.destinations import save_destination
from dashboard import auth
from dashboard.format import plain
from dashboard.state import get_engine
from db.alerts import (
    EVENT_LABELS,
    list_destinations,
    recent_alerts,
    remove_destination,
)
from db.engine import Engine
from db.inputs import FieldError
from db.models import ALERT_EVENTS
from db.tokens import LIFETIMES_DAYS, TokenInfo, create_token, list_tokens, revoke_token

NEW_TOKEN_KEY = "settings.new_token"
PROBLEM_KEY = "settings.token_problem"
NAME_KEY, DAYS_KEY, REVOKE_KEY = "settings.token_name", "settings.token_days", "settings.revoke"
ALERT_KEYS = {field: f"settings.alert_{field}" for field in ("name", "url", "events")}
ALERT_PROBLEM_KEY, REMOVE_KEY = "settings.alert_problem", "settings.alert_remove"


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
    except FieldError as exc:
        st.session_state[PROBLEM_KEY] = str(exc)
        return
    st.session_state[NEW_TOKEN_KEY] = (info.name, secret)
    st.session_state[NAME_KEY] = ""


def revoke(engine: Engine) -> None:
    token_id = st.session_state.get(REVOKE_KEY)
    if token_id is not None and revoke_token(engine, token_id):
        st.toast("Revoked: the API refuses that token from now on.")


def add_destination(engine: Engine) -> None:
    values = {field: st.session_state.get(key) for field, key in ALERT_KEYS.items()}
    st.session_state.pop(ALERT_PROBLEM_KEY, None)
    try:
        save_destination(engine, values["name"] or "", values["url"] or "", values["events"])
    except FieldError as exc:
        st.session_state[ALERT_PROBLEM_KEY] = str(exc)
        return
    st.session_state[ALERT_KEYS["url"]] = ""  # the secret does not stay in the session
    st.session_state[ALERT_KEYS["name"]] = ""
    st.toast(f"Alerts now go to {values['name'].strip()}.")


def remove_chosen_destination(engine: Engine) -> None:
    name = st.session_state.get(REMOVE_KEY)
    if name is not None and remove_destination(engine, name):
        st.toast(f"Removed {name}: its unsent alerts are dropped.")


def alerts_section(engine: Engine) -> None:
    st.subheader("Alerts")
    st.caption(
        "Each event is sent once to every destination that follows it, by whichever worker "
        "or dashboard claims it, and retried with back-off while the destination is down. "
        "A destination is an Apprise URL: slack://…, discord://…, msteams://…, mailtos://…, "
        "ntfys://…, or json://host/path for a JSON webhook."
    )
    with st.form("settings.alert_form"):
        name_column, url_column = st.columns([1, 3])
        name_column.text_input(
            "Destination name", key=ALERT_KEYS["name"], placeholder="team channel"
        )
        kept = "Kept whole in the database; shown back only masked."
        url_column.text_input("Apprise URL", key=ALERT_KEYS["url"], type="password", help=kept)
        st.multiselect("Events", ALERT_EVENTS, key=ALERT_KEYS["events"],
                       format_func=EVENT_LABELS.__getitem__)  # fmt: skip
        st.form_submit_button("Add destination", icon=":material/notifications:",
                              on_click=add_destination, args=(engine,))  # fmt: skip
    if st.session_state.get(ALERT_PROBLEM_KEY):
        st.error(plain(st.session_state[ALERT_PROBLEM_KEY]), icon=":material/error:")
    destinations = list_destinations(engine)
    if not destinations:
        st.info("No destinations: no alert is sent.")
        return
    st.dataframe(
        pd.DataFrame({"name": [d.name for d in destinations],
                      "events": [", ".join(d.events) for d in destinations],
                      "URL (masked)": [d.shown_url for d in destinations]}),
        hide_index=True, width="stretch",
    )  # fmt: skip
    remove_column, button_column = st.columns([3, 1], vertical_alignment="bottom")
    remove_column.selectbox("Destination to remove", [d.name for d in destinations],
                            key=REMOVE_KEY)  # fmt: skip
    button_column.button("Remove", icon=":material/delete:", on_click=remove_chosen_destination,
                         args=(engine,))  # fmt: skip
    sent = recent_alerts(engine, 50)
    if sent:
        st.markdown("**The newest alerts**")
        st.dataframe(alerts_table(sent), hide_index=True, width="stretch")


def alerts_table(rows: list) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "event": [r.event for r in rows],
            "job": [r.job_id for r in rows],
            "destination": [r.destination for r in rows],
            "outcome": [r.outcome for r in rows],
            "attempts": [r.attempts for r in rows],
            "created": [r.created_at for r in rows],
            "last error": [r.last_error or "" for r in rows],
        }
    )


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
    "`Authorization: Bearer …` header. Whoever holds a token can submit, read, cancel and "
    "retry jobs and download their files."
)
with st.form("settings.token_form", clear_on_submit=False):
    name_column, days_column = st.columns([3, 1])
    name_column.text_input("Token name", key=NAME_KEY, placeholder="what or who uses it")
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
else:
    st.dataframe(tokens_table(tokens), hide_index=True, width="stretch")
active = {token.id: token for token in tokens if token.state() == "active"}
if active:
    revoke_column, button_column = st.columns([3, 1], vertical_alignment="bottom")
    revoke_column.selectbox(
        "Token to revoke", list(active), key=REVOKE_KEY,
        format_func=lambda token_id: f"{active[token_id].name} ({active[token_id].prefix}…)",
    )  # fmt: skip
    button_column.button("Revoke", icon=":material/block:", on_click=revoke, args=(engine,))

alerts_section(engine)
