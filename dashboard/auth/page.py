"""The sign-in check inside the page script: `require_sign_in()` at the top of every run."""

from __future__ import annotations

import streamlit as st

from dashboard.auth.access import policy
from dashboard.auth.server import SIGNIN_PATH, SIGNOUT_PATH
from dashboard.auth.sessions import _remember_session, _served_over_http, identity_from_cookies
from dashboard.format import plain


def require_sign_in() -> None:
    """Stop the page unless the person may see it; when signed in, offer a way out."""

    current = policy()
    if not current.required:
        return
    if current.by_address_only and not _served_over_http():
        return
    if current.problem:
        st.error(f"This dashboard cannot be used yet: {plain(current.problem)}.")
        st.stop()
    identity = identity_from_cookies(dict(st.context.cookies), current)
    if identity is None:
        st.warning("Sign in to use this dashboard.")
        st.markdown(f'<a href="{SIGNIN_PATH}" target="_self">Sign in</a>', unsafe_allow_html=True)
        st.stop()
    _remember_session(identity)
    if identity.startswith("password:"):
        st.sidebar.caption("Signed in with the password")
    else:
        st.sidebar.caption(f"Signed in as {plain(identity.split(':', 2)[2])}")
    st.sidebar.markdown(
        f'<a href="{SIGNOUT_PATH}" target="_self">Sign out</a>', unsafe_allow_html=True
    )
