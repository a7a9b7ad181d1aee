"""How much of the machine this process may use, and running work over it in bounded chunks."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def usable_cpus() -> int:
    """CPUs this process may run on: a container or `taskset` may allow fewer than exist."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def map_in_chunks(
    work: Callable[[Sequence[Item]], list[Result]], items: Sequence[Item], chunk: int
) -> Iterator[list[Result]]:
    """`work` on each chunk of `items`, in threads (one per usable CPU), results in order.

    At most two chunks per thread are in flight: the futures and results held at once stay
    bounded however many items there are. For work that leaves the interpreter (system calls,
    C code that releases the GIL)."""
    threads = usable_cpus()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        running: deque[Future[list[Result]]] = deque()
        for start in range(0, len(items), chunk):
            if len(running) >= 2 * threads:
                yield running.popleft().result()
            running.append(pool.submit(work, items[start : start + chunk]))
        while running:
            yield running.popleft().result()
