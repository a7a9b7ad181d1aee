"""The endpoints of the HTTP API on jobs: submit, list, show, edit tags and note, metric
series, cancel, retry, artifacts; and on sweeps: submit, list, show, edit tags and note.
Each is a thin layer over db/ (the same functions the CLI calls, with the same validation)
behind `guard.token_required`; the document that describes them is `openapi`."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from common import store
from dashboard.api.guard import NO_STORE, problem, token_required
from dashboard.downloads import stream_file
from db import queue, sweeps
from db.artifacts import get_artifact, list_artifacts
from db.engine import Engine
from db.joblist import ORDERS, Cursor, JobFilter
from db.jobview import describe_job, iter_jobs
from db.labels import set_labels
from db.models import JOB_STATUSES
from db.series import DEFAULT_MAX_BUCKETS, Buckets, rows_since, snapshot
from db.spec import SpecError, json_value

API_PREFIX = "/api/v1"
MAX_BODY_BYTES = 1_000_000
DEFAULT_LIMIT, MAX_LIMIT = 50, 500
MAX_BUCKETS = 100_000
MAX_ROWS_SINCE = 100_000


def _json(value: Any, status: int = 200, **headers: str) -> JSONResponse:
    return JSONResponse(value, status_code=status, headers={**NO_STORE, **headers})


async def _body(request: Request, field: str) -> Any:
    """The request's JSON body; SpecError naming `field` when it is too large or not JSON."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise SpecError({field: f"is larger than {MAX_BODY_BYTES:,} bytes"})
    if not body.strip():
        raise SpecError({field: "is missing: send a JSON object of field: value"})
    return json_value(body, field)


def _whole(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise SpecError({name: f"must be a whole number from {low} to {high}"})
    return int(raw)


def _flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "false").strip().lower()
    if raw not in ("true", "false", "1", "0"):
        raise SpecError({name: "must be true or false"})
    return raw in ("true", "1")


def _listed(request: Request, name: str) -> tuple[str, ...]:
    """A list parameter: repeated (`?tag=a&tag=b`), comma-separated, or both."""
    items = [item.strip() for raw in request.query_params.getlist(name) for item in raw.split(",")]
    return tuple(dict.fromkeys(item for item in items if item))


def _filters(request: Request) -> JobFilter:
    statuses = _listed(request, "status")
    unknown = [status for status in statuses if status not in JOB_STATUSES]
    if unknown:
        raise SpecError({"status": f"unknown job status {unknown[0]!r}; one of {JOB_STATUSES}"})
    return JobFilter(
        statuses=statuses,
        tags=_listed(request, "tag"),
        dataset=request.query_params.get("dataset", "").strip(),
        arch=request.query_params.get("arch", "").strip(),
        search=request.query_params.get("q", "").strip(),
    )


@token_required
async def submit_job(request: Request, engine: Engine) -> Response:
    data = await _body(request, "spec")
    job_id = await run_in_threadpool(queue.submit, engine, data)
    url = f"{API_PREFIX}/jobs/{job_id}"
    return _json({"id": job_id, "url": url}, 201, Location=url)


def _page(engine: Engine, filters: JobFilter, order: Any, after: int | None, limit: int):
    cursor = None
    if after is not None:
        try:
            cursor = Cursor(after, queue.get_job(engine, after).priority)
        except queue.JobNotFound:
            raise SpecError({"after": f"no job with id {after}"}) from None
    jobs = list(iter_jobs(engine, filters, order=order, after=cursor, limit=limit + 1))
    return jobs[:limit], len(jobs) > limit


@token_required
async def submit_sweep(request: Request, engine: Engine) -> Response:
    """A sweep from its definition (what `traindeck sweep submit FILE` reads, as JSON)."""
    data = await _body(request, "sweep")
    sweep_id = await run_in_threadpool(sweeps.submit_sweep, engine, data)
    trials = await run_in_threadpool(sweeps.summary, engine, sweep_id)
    queued = [trial.job_id for trial in trials.trials]
    return _json({"id": sweep_id, "queued_trials": queued}, 201)


@token_required
async def list_sweeps(request: Request, engine: Engine) -> Response:
    """Every sweep, newest first, as `traindeck sweep list --json` prints them."""
    return _json(await run_in_threadpool(sweeps.describe_all, engine))


def _sweep(engine: Engine, sweep_id: int) -> dict[str, Any]:
    return sweeps.describe(sweeps.summary(engine, sweep_id))


@token_required
async def show_sweep(request: Request, engine: Engine) -> Response:
    """One sweep with its trials and the best, as `traindeck sweep show ID --json`."""
    return _json(await run_in_threadpool(_sweep, engine, request.path_params["sweep_id"]))


@token_required
async def edit_sweep(request: Request, engine: Engine) -> Response:
    """Change the sweep's own tags and/or note."""
    sweep_id = request.path_params["sweep_id"]
    await run_in_threadpool(sweeps.set_labels, engine, sweep_id, await _body(request, "labels"))
    return _json(await run_in_threadpool(_sweep, engine, sweep_id))


@token_required
async def list_jobs(request: Request, engine: Engine) -> Response:
    order = request.query_params.get("order", "newest")
    if order not in ORDERS:
        raise SpecError({"order": f"must be one of {', '.join(ORDERS)}"})
    limit = _whole(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    after = _whole(request, "after", None, 1, 2**63 - 1)
    jobs, more = await run_in_threadpool(_page, engine, _filters(request), order, after, limit)
    return _json({"jobs": jobs, "next_after": jobs[-1]["id"] if more else None})


@token_required
async def show_job(request: Request, engine: Engine) -> Response:
    return _json(await run_in_threadpool(describe_job, engine, request.path_params["job_id"]))


@token_required
async def edit_job(request: Request, engine: Engine) -> Response:
    """Change the job's tags and/or note."""
    job_id = request.path_params["job_id"]
    await run_in_threadpool(set_labels, engine, job_id, await _body(request, "labels"))
    return _json(await run_in_threadpool(describe_job, engine, job_id))


def _points(buckets: Buckets) -> dict[str, list]:
    return {"step": buckets.first_step.tolist(), "value": buckets.low.tolist()}


def _buckets(buckets: Buckets) -> dict[str, list]:
    return {
        "first_step": buckets.first_step.tolist(),
        "last_step": buckets.last_step.tolist(),
        "min": buckets.low.tolist(),
        "max": buckets.high.tolist(),
        "mean": (buckets.total / buckets.count).tolist(),
        "count": buckets.count.tolist(),
    }


def _series(engine: Engine, job_id: int, request: Request) -> dict[str, Any]:
    queue.get_job(engine, job_id)  # JobNotFound: 404
    names = list(_listed(request, "name")) or None
    since = _whole(request, "since", None, 0, 2**63 - 1)
    if since is not None:
        new = rows_since(engine, job_id, since, MAX_ROWS_SINCE, names)
        series = {name: _points(b) for name, b in new.series.items()}
        return {"raw": True, "cursor": new.last_id, "complete": new.complete, "series": series}
    raw = _flag(request, "raw")
    count = None if raw else _whole(request, "buckets", DEFAULT_MAX_BUCKETS, 1, MAX_BUCKETS)
    taken = snapshot(engine, job_id, count, names)
    shape = _points if raw else _buckets
    series = {name: shape(b) for name, b in taken.series.items()}
    return {"raw": raw, "cursor": taken.last_id, "complete": True, "series": series}


@token_required
async def job_metrics(request: Request, engine: Engine) -> Response:
    job_id = request.path_params["job_id"]
    read = await run_in_threadpool(_series, engine, job_id, request)
    return _json({"job_id": job_id, **read})


@token_required
async def cancel_job(request: Request, engine: Engine) -> Response:
    job_id = request.path_params["job_id"]
    return _json({"id": job_id, "status": await run_in_threadpool(queue.cancel, engine, job_id)})


@token_required
async def retry_job(request: Request, engine: Engine) -> Response:
    job_id = request.path_params["job_id"]
    new_id = await run_in_threadpool(queue.retry, engine, job_id)
    url = f"{API_PREFIX}/jobs/{new_id}"
    return _json({"id": new_id, "retry_of": job_id, "url": url}, 201, Location=url)


def _file_name(job_id: int, path: str) -> str:
    return f"job{job_id}-{store.display_name(path)}"


def _artifact_list(engine: Engine, job_id: int) -> list[dict[str, Any]]:
    queue.get_job(engine, job_id)  # JobNotFound: 404
    return [
        {
            "kind": artifact.kind,
            "file_name": _file_name(job_id, artifact.path),
            "bytes": artifact.bytes,
            "sha256": artifact.sha256,
            "created_at": artifact.created_at.isoformat(),
            "url": f"{API_PREFIX}/jobs/{job_id}/artifacts/{artifact.kind}",
        }
        for artifact in list_artifacts(engine, job_id)
    ]


@token_required
async def job_artifacts(request: Request, engine: Engine) -> Response:
    job_id = request.path_params["job_id"]
    return _json({"artifacts": await run_in_threadpool(_artifact_list, engine, job_id)})


@token_required
async def download_artifact(request: Request, engine: Engine) -> Response:
    job_id, kind = request.path_params["job_id"], request.path_params["kind"]
    await run_in_threadpool(queue.get_job, engine, job_id)  # JobNotFound: 404
    artifact = await run_in_threadpool(get_artifact, engine, job_id, kind)
    if artifact is None:
        return problem(f"job {job_id} has no {kind} file", 404)
    name = _file_name(job_id, artifact.path)
    return await stream_file(request, artifact.path, name, artifact.sha256, problem)


async def unknown_path(request: Request) -> Response:
    return problem(f"no such API endpoint: {request.method} {request.url.path}", 404)
