"""Failed password sign-ins, throttled per client and per account with exponential back-off.

Only a POST that carries a password counts (`server`). A browser that has signed in here
before shows its device cookie (`sessions.new_device_cookie`) and its failures count against
that device alone. Any other attempt counts against
- the client's address (`clients.client_address`: behind a trusted proxy, the address that
  proxy forwards), and
- the password "account", so that guesses spread over many addresses slow down too.
Guesses from elsewhere never pause a browser that has signed in here before, and nothing
pauses sign-in for everyone.

A key may fail `free` times; after that each failure doubles the wait before its next try
(`first_wait_s`, then twice that, …, at most `max_wait_s`). A key is forgotten `FORGET_S` after
its last failure, and a success clears the client's and the device's keys.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

FORGET_S = 3600.0


@dataclass(frozen=True)
class Backoff:
    """Failures allowed before any wait, then a wait that doubles with each failure."""

    free: int
    first_wait_s: float
    max_wait_s: float

    def wait_after(self, failures: int) -> float:
        """Seconds from the latest of `failures` failures until the next try is checked."""
        if failures < self.free:
            return 0.0
        return min(self.max_wait_s, self.first_wait_s * 2.0 ** (failures - self.free))


# One address or one browser: five typing mistakes are free, then 30 s, 1 min, … 15 min.
PER_CLIENT = Backoff(free=5, first_wait_s=30.0, max_wait_s=900.0)
# The password, tried from browsers that never signed in here: many clients' worth of mistakes.
PER_ACCOUNT = Backoff(free=50, first_wait_s=30.0, max_wait_s=900.0)

CLIENT, DEVICE, ACCOUNT = "client", "device", "account"
PASSWORD_ACCOUNT = "password"


@dataclass
class _Failures:
    count: int
    last: float


class AttemptLimiter:
    """Failed sign-ins per key (`client:…`, `device:…`, `account:…`), each with its back-off."""

    MAX_KEYS = 10_000

    def __init__(
        self,
        per_client: Backoff = PER_CLIENT,
        per_account: Backoff = PER_ACCOUNT,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.backoffs = {CLIENT: per_client, DEVICE: per_client, ACCOUNT: per_account}
        self.clock = clock
        self._failures: collections.OrderedDict[tuple[str, str], _Failures] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    @staticmethod
    def keys(client: str, device: str | None) -> list[tuple[str, str]]:
        """What an attempt from `client` (with a valid device cookie `device`) counts against."""
        if device:
            return [(DEVICE, device)]
        return [(CLIENT, client), (ACCOUNT, PASSWORD_ACCOUNT)]

    def _current(self, key: tuple[str, str], now: float) -> _Failures | None:
        failures = self._failures.get(key)
        if failures is not None and now - failures.last >= FORGET_S:
            del self._failures[key]
            return None
        return failures

    def wait_s(self, client: str, device: str | None = None) -> tuple[float, str]:
        """(seconds until this attempt may be checked, whose wait it is: 'client', 'device' or
        'account'; '' when none)."""
        now = self.clock()
        longest, whose = 0.0, ""
        with self._lock:
            for kind, name in self.keys(client, device):
                failures = self._current((kind, name), now)
                if failures is None:
                    continue
                wait = failures.last + self.backoffs[kind].wait_after(failures.count) - now
                if wait > longest:
                    longest, whose = wait, kind
        return longest, whose

    def failed(self, client: str, device: str | None = None) -> None:
        now = self.clock()
        with self._lock:
            for key in self.keys(client, device):
                failures = self._current(key, now)
                if failures is None:
                    failures = self._failures[key] = _Failures(0, now)
                failures.count += 1
                failures.last = now
                self._failures.move_to_end(key)
            while len(self._failures) > self.MAX_KEYS:
                self._failures.popitem(last=False)

    def succeeded(self, client: str, devices: Sequence[str | None] = ()) -> None:
        """The right password from `client`: its own failures, and those of the devices named
        (the one it showed, if any), are cleared; the account's are not."""
        with self._lock:
            self._failures.pop((CLIENT, client), None)
            for device in devices:
                if device:
                    self._failures.pop((DEVICE, device), None)


limiter = AttemptLimiter()


def too_many_attempts_message(wait_s: float, whose: str) -> str:
    seconds = max(1, math.ceil(wait_s))
    if whose == ACCOUNT:
        return (
            "Too many failed sign-ins with this password from browsers that have not signed in "
            f"here before. This browser may try again in {seconds} s; a browser that has "
            "signed in here before can sign in now."
        )
    if whose == DEVICE:
        return f"Too many failed sign-ins from this browser. Try again in {seconds} s."
    return f"Too many failed sign-ins from your address. Try again in {seconds} s."
