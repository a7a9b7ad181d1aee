"""The dashboard's entry point, served by `python -m dashboard` (the `web:` line of the Procfile).

This one file plays two parts:
- `streamlit run` finds the `st.App` assignment below, imports this file as a module and serves
  that ASGI app: the Streamlit pages, the route that streams artifacts from disk
  (`dashboard.downloads`) and the sign-in pages, all behind the sign-in gate (`dashboard.auth`),
  and the HTTP API (`dashboard.api`), which checks an API token on every request itself;
- for every browser session Streamlit then runs this same file as the page script
  (`__name__ == "__main__"`): it builds the navigation and runs the chosen page.
"""

from __future__ import annotations

import streamlit as st
from starlette.middleware import Middleware
from streamlit.runtime.pages_manager import PagesManager

from alerts import drain as alerts_drain
from dashboard import api, auth, downloads
from dashboard.nav import build_navigation
from dashboard.state import require_database, require_settings


def run_page() -> None:
    st.set_page_config(page_title="traindeck", page_icon=":material/model_training:", layout="wide")
    require_settings()
    auth.require_sign_in()
    page = build_navigation()
    require_database()
    page.run()


if __name__ == "__main__":
    run_page()
else:
    # The pages are listed by st.navigation above. Streamlit would otherwise take the `pages/`
    # folder beside this file for old-style pages until some session first runs this file:
    # after a restart, a first visit straight to /job?job=4 would run that page alone,
    # without the navigation, the database check or a sign-in gate.
    PagesManager.uses_pages_directory = False
    # The server sends alerts from the shared outbox too (each is sent once, by whoever
    # claims it): a background thread, started once per process.
    alerts_drain.start_background("dashboard")
    # The sign-in gate stands in front of every route: pages, websocket, media and downloads.
    app = st.App(
        __file__,
        routes=[*api.routes(), *downloads.routes(), *auth.routes()],
        middleware=[Middleware(auth.SignInGate)],
    )
