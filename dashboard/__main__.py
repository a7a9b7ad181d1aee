"""`python -m dashboard [--port N] [--address HOST]`: serve the dashboard from any folder.

Streamlit reads `.streamlit/config.toml` only from the current folder, so the dashboard's own
settings (`dashboard/streamlit.toml`) are passed as flags instead; a `STREAMLIT_*` environment
variable set for one of them wins, as it would over a config file.

Two more for the sign-in's sake (`dashboard.auth`):
- uvicorn, which serves Streamlit, believes X-Forwarded-For and X-Forwarded-Proto from
  127.0.0.1 and ::1 unless told otherwise: any process on the machine could then pose as any
  address. FORWARDED_ALLOW_IPS is set to TRAINDECK_TRUSTED_PROXIES (empty: nobody).
- Where the dashboard runs open (loopback, no sign-in), Streamlit's own `server.allowedHosts`
  lists the names it answers at, so that its websocket too refuses a rebinding page's Host.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path

from common.entry import run_main
from common.settings import Settings, settings

HERE = Path(__file__).resolve().parent
SETTINGS_FILE = HERE / "streamlit.toml"


def environment_name(section: str, key: str) -> str:
    """Streamlit's variable for `section.key`, e.g. STREAMLIT_SERVER_MAX_UPLOAD_SIZE."""
    return "STREAMLIT_" + "_".join(
        re.sub(r"(?<!^)(?=[A-Z])", "_", part).upper() for part in (section, key)
    )


def _flag_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_flags(
    settings_file: Path = SETTINGS_FILE, environ: Mapping[str, str] = os.environ
) -> list[str]:
    flags = []
    for section, options in tomllib.loads(settings_file.read_text()).items():
        for key, value in options.items():
            if environment_name(section, key) not in environ:
                flags.append(f"--{section}.{key}={_flag_value(value)}")
    return flags


def forwarded_allow_ips(current: Settings) -> str:
    """uvicorn's FORWARDED_ALLOW_IPS: the trusted proxies, or none (an empty list)."""
    return ",".join(str(network) for network in current.trusted_proxies)


def allowed_hosts_flags(address: str, environ: Mapping[str, str] = os.environ) -> list[str]:
    """`--server.allowedHosts` flags for the open loopback mode; none where sign-in is on
    (people may then use any name for the machine) or STREAMLIT_SERVER_ALLOWED_HOSTS is set."""
    from dashboard.auth import answered_names, policy

    if environment_name("server", "allowedHosts") in environ:
        return []
    current = policy(address, use_config=False)
    if current.required:
        return []
    names = answered_names(address, current.public_host)
    return [f"--server.allowedHosts={name}" for name in names]


def streamlit_argv(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(
        prog="python -m dashboard", description=__doc__.splitlines()[0]
    )
    current = settings()  # a bad TRAINDECK_PORT or any other setting: one line, exit 2
    parser.add_argument("--port", default=str(current.port))
    parser.add_argument("--address", default=current.address)
    args = parser.parse_args(argv)
    return [
        "streamlit",
        "run",
        str(HERE / "app.py"),
        *settings_flags(),
        f"--server.port={args.port}",
        f"--server.address={args.address}",
        *allowed_hosts_flags(args.address),
    ]


def main(argv: list[str] | None = None) -> None:
    from streamlit.web import cli

    sys.argv = streamlit_argv(argv)
    os.environ["FORWARDED_ALLOW_IPS"] = forwarded_allow_ips(settings())
    cli.main()


if __name__ == "__main__":
    run_main(main)
