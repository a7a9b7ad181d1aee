"""What a job page has drawn so far, and fetching only what is newer.

The first refresh reads every series of the job in min/max buckets (`db.series.snapshot`);
each later one asks for metric rows and XLA reports with ids above the last ones
seen, and appends them. A series that outgrows twice the bucket budget is merged back down,
so a page's memory stays bounded however long the job runs. A LiveJob may follow only the
names that start with one of `only`, and none of `skip`: the job page's curves leave the
`sys/` series to the System tab, which follows them alone while it is open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from db.engine import Engine
from db.series import DEFAULT_MAX_BUCKETS, Buckets, rows_since, snapshot
from db.telemetry import xla_reports

# More new rows than this in one refresh (a page left alone for a long time): read it afresh.
MAX_NEW_ROWS = 200_000


@dataclass
class LiveJob:
    job_id: int
    max_buckets: int = DEFAULT_MAX_BUCKETS
    series: dict[str, Buckets] = field(default_factory=dict)
    last_metric_id: int = -1
    xla: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    latest_xla_raw: str = ""
    last_xla_id: int = 0
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    xla_reports: bool = True

    def follows(self, name: str) -> bool:
        return (not self.only or name.startswith(self.only)) and not name.startswith(self.skip)

    def refresh(self, engine: Engine) -> int:
        """Fetch what is new since the last refresh. Returns how many metric points came."""
        new_points = self._refresh_metrics(engine)
        if not self.xla_reports:
            return new_points
        for row in xla_reports(engine, self.job_id, self.last_xla_id):
            self.xla.append((row.epoch, dict(row.summary or {})))
            self.latest_xla_raw = row.raw
            self.last_xla_id = row.id
        return new_points

    def _refresh_metrics(self, engine: Engine) -> int:
        if self.last_metric_id >= 0:
            new = rows_since(engine, self.job_id, self.last_metric_id, MAX_NEW_ROWS)
            if new.complete:
                followed = {n: p for n, p in new.series.items() if self.follows(n)}
                for name, points in followed.items():
                    merged = self.series.get(name, Buckets.empty()).extend(points)
                    if len(merged) > 2 * self.max_buckets:
                        merged = merged.coarsen(self.max_buckets)
                    self.series[name] = merged
                self.last_metric_id = new.last_id
                return sum(points.point_count for points in followed.values())
        first = snapshot(engine, self.job_id, self.max_buckets, only=self.only, skip=self.skip)
        self.series = dict(first.series)
        self.last_metric_id = first.last_id
        return sum(points.point_count for points in first.series.values())

    def names(self, prefix: str) -> list[str]:
        return sorted(name for name in self.series if name.startswith(prefix))

    def get(self, name: str) -> Buckets:
        return self.series.get(name, Buckets.empty())
