"""The HTTP API under /api/v1, served by the dashboard's own server (an `st.App` route list,
`dashboard/app.py`): submit a job or a sweep, list and show jobs and sweeps, edit their tags
and note,
read their metric series, cancel, retry, list and download their files. Every endpoint needs
an API token (`guard`); the OpenAPI document is /api/v1/openapi.json (`openapi`).
`traindeck.client` is a Python client for it.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dashboard.api import jobs, openapi
from dashboard.auth.server import TOKEN_PATH_PREFIX

API_PREFIX = jobs.API_PREFIX
JOB = API_PREFIX + "/jobs/{job_id:int}"
SWEEP = API_PREFIX + "/sweeps/{sweep_id:int}"
EVERY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


async def openapi_document(request: Request) -> Response:
    return JSONResponse(openapi.document())


def routes() -> list[Route]:
    return [
        Route(API_PREFIX + "/openapi.json", openapi_document, methods=["GET"]),
        Route(API_PREFIX + "/jobs", jobs.submit_job, methods=["POST"]),
        Route(API_PREFIX + "/jobs", jobs.list_jobs, methods=["GET"]),
        Route(API_PREFIX + "/sweeps", jobs.submit_sweep, methods=["POST"]),
        Route(API_PREFIX + "/sweeps", jobs.list_sweeps, methods=["GET"]),
        Route(SWEEP, jobs.show_sweep, methods=["GET"]),
        Route(SWEEP, jobs.edit_sweep, methods=["PATCH"]),
        Route(JOB, jobs.show_job, methods=["GET"]),
        Route(JOB, jobs.edit_job, methods=["PATCH"]),
        Route(JOB + "/metrics", jobs.job_metrics, methods=["GET"]),
        Route(JOB + "/cancel", jobs.cancel_job, methods=["POST"]),
        Route(JOB + "/retry", jobs.retry_job, methods=["POST"]),
        Route(JOB + "/artifacts", jobs.job_artifacts, methods=["GET"]),
        Route(JOB + "/artifacts/{kind}", jobs.download_artifact, methods=["GET", "HEAD"]),
        # Anything else under /api/ is a JSON 404, never a Streamlit page.
        Route(TOKEN_PATH_PREFIX + "{rest:path}", jobs.unknown_path, methods=EVERY_METHOD),
    ]
