"""How every traindeck command starts and ends: `run_main(main)` in each `__main__` block.

A command whose output is piped into `head` or `grep -q` ends quietly when the reader goes
away, as Unix tools do, and a data folder that cannot be created or written, or a setting in
the environment that cannot be used, is one line naming it and exit code 2, not a traceback.
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Callable
from typing import NoReturn

from common.config import DataFolderError
from common.settings import SettingsError

# What Python's documentation suggests for a closed stdout (the note on SIGPIPE in `signal`).
EXIT_BROKEN_PIPE = 1
EXIT_DATA_FOLDER = 2
EXIT_SETTINGS = 2


def _stdout_closed() -> bool:
    """Whether stdout's reader went away: only then is a BrokenPipeError the reader's doing
    rather than a bug (a lost socket, a dead child process) to be shown in full."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):
        return True  # no poll() on this system: assume the usual cause
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events)


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """Exit with `main()`'s status, quietly on a closed stdout, an unusable data folder or a
    bad setting."""
    try:
        status = main()
        # Flushed here, not at interpreter exit, so that a closed pipe is caught below.
        sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # The interpreter flushes stdout once more on its way out; aim that flush at
        # /dev/null so it cannot fail again and print "Exception ignored".
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_BROKEN_PIPE)
    except DataFolderError as exc:
        print(f"traindeck: {exc}", file=sys.stderr)
        sys.exit(EXIT_DATA_FOLDER)
    except SettingsError as exc:
        print(f"traindeck: {exc}", file=sys.stderr)
        sys.exit(EXIT_SETTINGS)
    sys.exit(status)
