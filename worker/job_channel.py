"""How the supervisor hands a job process the next job with the same graphs.

torch_xla 2.8 and 2.9 cannot load compiled graphs back from the persistent cache on a TPU
(pytorch/xla#9094) nor ever on the CPU backend: the only cache that spares a job its compiles is
XLA's in-memory one, in the process that compiled them. So on XLA a job process whose job
succeeded may serve the next job the supervisor claims, if that job's graphs are the same
(`graph_key`). The supervisor still claims, beats the heartbeats and owns the leases; the
process only trains what it is handed:

- the supervisor starts it for one job (its command line names it) with `--report-fd`, the
  write end of a pipe;
- when that job has succeeded and its telemetry is written, the process writes one line,
  `{"done": JOB_ID}`, on that pipe and reads its standard input for the next `Assignment` (one
  JSON line); the end of its input means there is none, and it exits with code 0;
- a job that failed, was stopped or was killed ends its process as it always did, with its exit
  code: such a process is never handed another job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import IO, Any

# The spec fields that decide which graphs a job compiles (with its device kind), as the
# issue names them. Others (dataset, epochs, lr, seed) change numbers, not graphs, or change
# only some graphs (a dataset with more classes): XLA compiles those few in the kept process.
GRAPH_FIELDS = ("cores", "arch", "img_size", "bs", "mixed_precision", "augment", "schedule")


@dataclass(frozen=True)
class Assignment:
    """The job a job process trains next, and where it writes a failure's message."""

    job_id: int
    lease: int
    error_file: str

    def to_line(self) -> str:
        return json.dumps(asdict(self)) + "\n"

    @classmethod
    def from_line(cls, line: str) -> Assignment:
        data = json.loads(line)
        return cls(int(data["job_id"]), int(data["lease"]), str(data["error_file"]))


def graph_key(spec: Mapping[str, Any], device: str) -> tuple[Any, ...] | None:
    """What two jobs share when their graphs are the same; None for a job whose process is
    never kept (only XLA compiles graphs)."""
    if device != "xla":
        return None
    return (device, *(spec.get(field) for field in GRAPH_FIELDS))


def done_line(job_id: int) -> bytes:
    return (json.dumps({"done": job_id}) + "\n").encode()


def read_done(line: str) -> int | None:
    """The job id of a `done` line; None for anything else."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    done = data.get("done") if isinstance(data, dict) else None
    return done if isinstance(done, int) else None


def next_assignment(report_fd: int, finished_job: int, commands: IO[str]) -> Assignment | None:
    """In the job process: say `finished_job` succeeded, then wait for the next job (None: the
    supervisor closed our input, and the process exits)."""
    os.write(report_fd, done_line(finished_job))
    line = commands.readline()
    return Assignment.from_line(line) if line.strip() else None
