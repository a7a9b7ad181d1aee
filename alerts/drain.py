"""Sending the outbox's alerts: `drain` claims due alerts (`db.alerts.claim`), sends each with
Apprise, and marks it sent or to retry. `Drainer` does it in a background thread of every
worker and every dashboard; `python -m alerts.drain --once` drains once from a shell.

Which process sends an alert does not matter: a claim is held by one process at a time, so
each alert is sent once however many drain the same database. A drainer also deletes the
alerts sent or given up on more than TRAINDECK_ALERT_RETENTION_DAYS ago (`clean_up`), at its
first turn and then at most once every CLEAN_UP_EVERY_S.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import apprise

from common import config
from common.entry import run_main
from common.errors import first_line, mask_passwords
from db import alerts
from db.engine import Engine, get_engine
from db.models import utcnow

log = logging.getLogger(__name__)
INTERVAL_S = 5.0
CLEAN_UP_EVERY_S = 3600.0


def send(url: str, title: str, body: str) -> str | None:
    """Send one alert; None when it went out, else why not (one line, secrets masked)."""
    notifier = apprise.Apprise()
    if not notifier.add(url):
        return "the destination's URL is no longer one Apprise can use"
    with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as captured:
        delivered = bool(notifier.notify(title=title, body=body))
    if delivered:
        return None
    lines = [line for line in captured.getvalue().splitlines() if line.strip()]
    reason = lines[-1] if lines else "the destination did not accept it"
    return mask_passwords(reason.replace(url, "(the destination)"))


def drain(engine: Engine, owner: str, now: datetime | None = None) -> int:
    """Send every alert due now (or at `now`); returns how many went out."""
    sent = 0
    while batch := alerts.claim(engine, owner, now=now):
        for alert in batch:
            problem = send(alert.url, alert.title, alert.body)
            if problem is None:
                sent += alerts.mark_sent(engine, alert, owner)
                log.info("alert %s (job %s) sent to %s", alert.event, alert.job_id,
                         alert.destination)  # fmt: skip
            else:
                alerts.retry_later(engine, alert, owner, problem, now)
                log.warning("alert %s (job %s) to %s failed: %s", alert.event, alert.job_id,
                            alert.destination, problem)  # fmt: skip
    return sent


def clean_up(engine: Engine, now: datetime | None = None) -> int:
    """Delete the alerts that ended (sent or given up on) longer ago than the retention;
    returns how many."""
    cutoff = (now or utcnow()) - timedelta(days=config.alert_retention_days())
    deleted = alerts.delete_ended(engine, cutoff)
    if deleted:
        log.info("deleted %d alert(s) sent or given up on before %s", deleted, f"{cutoff:%F %T}")
    return deleted


def process_owner(role: str) -> str:
    return f"{role}:{socket.gethostname()}:{os.getpid()}"


class Drainer(threading.Thread):
    """Drains the outbox every INTERVAL_S seconds until `stop()`. The engine comes from
    `engine_source` at each turn; a database (or a setting) that cannot be used is logged and
    tried again at the next turn, and the alerts wait in the outbox meanwhile."""

    def __init__(
        self, engine_source: Callable[[], Engine], owner: str, interval_s: float = INTERVAL_S
    ):
        super().__init__(name="alert-drainer", daemon=True)
        self.engine_source = engine_source
        self.owner = owner
        self.interval_s = interval_s
        self._stopped = threading.Event()
        self._problem: str | None = None  # told once, not at every turn, while it lasts
        self._cleaned_at: float | None = None  # time.monotonic() of the last clean-up

    def run(self) -> None:
        while not self._stopped.is_set():
            self.turn()
            self._stopped.wait(self.interval_s)

    def turn(self) -> None:
        """Drain once; a failure is logged when it first happens or changes."""
        try:
            engine = self.engine_source()
            drain(engine, self.owner)
            now = time.monotonic()
            if self._cleaned_at is None or now - self._cleaned_at >= CLEAN_UP_EVERY_S:
                clean_up(engine)
                self._cleaned_at = now
        except Exception as exc:
            if first_line(exc) != self._problem:
                log.warning("cannot drain the alert outbox: %s", first_line(exc))
            self._problem = first_line(exc)
            return
        if self._problem is not None:
            log.info("the alert outbox can be drained again")
        self._problem = None

    def stop(self) -> None:
        self._stopped.set()


_background: Drainer | None = None
_background_lock = threading.Lock()


def start_background(role: str, engine_source: Callable[[], Engine] = get_engine) -> Drainer:
    """This process's drainer, started once however often it is asked for."""
    global _background
    with _background_lock:
        if _background is None or not _background.is_alive():
            _background = Drainer(engine_source, process_owner(role))
            _background.start()
        return _background


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alerts.drain", description=__doc__)
    parser.add_argument("--once", action="store_true", help="drain once, then exit")
    parser.add_argument("--owner", default=None, help="the name this process claims under")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    engine = get_engine()
    owner = args.owner or process_owner("drain")
    if args.once:
        print(f"sent {drain(engine, owner)} alert(s)")
        clean_up(engine)
        return 0
    Drainer(lambda: engine, owner).run()
    return 0


if __name__ == "__main__":
    run_main(main)
