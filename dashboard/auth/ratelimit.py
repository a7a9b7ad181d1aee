"""Failed password sign-ins, limited per client address and overall (`limiter`)."""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable

# Failed sign-ins allowed per window, from one client address and from all of them together.
ATTEMPTS_PER_CLIENT = 5
ATTEMPTS_OVERALL = 30
ATTEMPT_WINDOW_S = 60.0


class AttemptLimiter:
    """Failed sign-ins per client address and overall, in a sliding window."""

    MAX_CLIENTS = 10_000

    def __init__(
        self,
        per_client: int = ATTEMPTS_PER_CLIENT,
        overall: int = ATTEMPTS_OVERALL,
        window_s: float = ATTEMPT_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.per_client = per_client
        self.overall = overall
        self.window_s = window_s
        self.clock = clock
        self._by_client: collections.OrderedDict[str, collections.deque[float]] = (
            collections.OrderedDict()
        )
        self._all: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()

    def _prune(self, times: collections.deque[float], now: float) -> None:
        while times and times[0] <= now - self.window_s:
            times.popleft()

    def wait_s(self, client: str) -> tuple[float, str]:
        """(seconds until `client` may try again, whose limit it is: 'client' or 'overall')."""
        now = self.clock()
        with self._lock:
            self._prune(self._all, now)
            if len(self._all) >= self.overall:
                return self._all[0] + self.window_s - now, "overall"
            times = self._by_client.get(client)
            if times is not None:
                self._prune(times, now)
                if len(times) >= self.per_client:
                    return times[0] + self.window_s - now, "client"
        return 0.0, ""

    def failed(self, client: str) -> None:
        now = self.clock()
        with self._lock:
            self._all.append(now)
            times = self._by_client.setdefault(client, collections.deque())
            times.append(now)
            self._by_client.move_to_end(client)
            while len(self._by_client) > self.MAX_CLIENTS:
                self._by_client.popitem(last=False)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._by_client.pop(client, None)


limiter = AttemptLimiter()


def too_many_attempts_message(wait_s: float, whose: str) -> str:
    seconds = max(1, math.ceil(wait_s))
    if whose == "overall":
        return (
            "Too many failed sign-ins on this dashboard in the last minute. "
            f"Sign-in is paused for everyone; try again in {seconds} s."
        )
    return f"Too many failed sign-ins from your address. Try again in {seconds} s."
