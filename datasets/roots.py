"""Where a dataset's files may lie.

Allowed data roots: the data folder (`TRAINDECK_DATA`) and every folder an admin lists in
`TRAINDECK_DATASET_ROOTS` (separated by `os.pathsep`, ':' on Linux). A dataset outside them
is refused, so a browser user cannot point the server at /etc or at someone's home folder.

Inside them, one folder is never a dataset's: the jobs folder (`TRAINDECK_DATA/jobs`), which
holds every job's checkpoints, exports and outputs. A file or folder that lies there, or a link
that leads there, is not part of any dataset: the scans of `datasets.labelling` skip it with the
reason (`ItemRule.jobs_problem`), at registration and whenever a job or a preview reads the
dataset. A link that leads out of the dataset's folder and out of the allowed roots is left out
by the registration's check (`ItemRule.problem`, `datasets.validation.find_bad_files`) as an
undecodable file.
"""

from __future__ import annotations

from pathlib import Path

from common import config
from common.files import jobs_dir
from common.settings import settings

DATASET_ROOTS_ENV = "TRAINDECK_DATASET_ROOTS"


def allowed_roots() -> list[Path]:
    """The folders datasets may live in: the data folder, then the admin's extra roots."""
    extra = settings().dataset_roots
    return [config.data_dir(), *(root.expanduser().resolve() for root in extra)]


class ItemRule:
    """Which files under one dataset root may be its items (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.jobs = jobs_dir().resolve()
        self.roots = allowed_roots()

    def _resolved(self, path: Path) -> Path | None:
        try:
            return path.resolve()
        except (OSError, RuntimeError):  # a loop of links
            return None

    def jobs_problem(self, path: Path) -> str | None:
        """Why `path` (a file or a folder) is no part of the dataset because of the jobs
        folder, or None."""
        resolved = self._resolved(path)
        if resolved is None:
            return "is a link that leads nowhere"
        if not resolved.is_relative_to(self.jobs):
            return None
        if path.absolute().is_relative_to(self.jobs):
            return "lies in the jobs folder"
        return "links into the jobs folder"

    def problem(self, path: Path) -> str | None:
        """Why the file `path` cannot be an item of the dataset, or None when it may be."""
        problem = self.jobs_problem(path)
        if problem is not None:
            return problem
        resolved = self._resolved(path) or path
        if resolved.is_relative_to(self.root):
            return None
        if not any(resolved.is_relative_to(root) for root in self.roots):
            return "links outside the allowed data roots"
        return None
