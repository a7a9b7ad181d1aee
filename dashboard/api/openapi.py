"""The OpenAPI 3.1 document of the HTTP API, served at /api/v1/openapi.json without a token
(it describes the API and holds no data). The job spec's and the labels' schemas come from
their pydantic models (`db.spec`), so the document follows the spec's fields and bounds."""

from __future__ import annotations

from typing import Any

from db.spec import JobSpec, Labels

API = "/api/v1"
JOB = API + "/jobs/{job_id}"
SWEEP = API + "/sweeps/{sweep_id}"


def _response(description: str, schema: dict | None = None) -> dict[str, Any]:
    if schema is None:
        return {"description": description}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


ERRORS = {
    "400": _response("A wrong input; `fields` names each with the CLI's message", _ref("Error")),
    "401": _response("No token, or a wrong, revoked or expired one", _ref("Error")),
    "404": _response("No such job, sweep or file", _ref("Error")),
    "429": _response("Too many wrong tokens from this address; see Retry-After", _ref("Error")),
}


def _query(name: str, description: str, schema: dict | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema or {"type": "string"},
    }


JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "integer"}}
KIND = {"name": "kind", "in": "path", "required": True, "schema": {"type": "string"},
        "description": "export, model_card, checkpoint, …"}  # fmt: skip
INTEGER = {"type": "integer", "minimum": 0}
JOB_OBJECT = {"type": "object", "description": "What `traindeck show ID --json` prints."}
SWEEP_ID = {"name": "sweep_id", "in": "path", "required": True, "schema": {"type": "integer"}}
SWEEP_OBJECT = {
    "type": "object",
    "description": "What `traindeck sweep show ID --json` prints: id, name, status, tags, note, "
    "objective, trials (params, status, objective), best, definition.",
}


def _operation(summary: str, ok: dict, parameters: list | None = None, body: str | None = None):
    operation: dict[str, Any] = {"summary": summary, "responses": {**ok, **ERRORS}}
    if parameters:
        operation["parameters"] = parameters
    if body:
        schema = _ref(body)
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    return operation


LIST_PARAMETERS = [
    _query("status", "Job statuses, repeated or separated by commas"),
    _query("tag", "Jobs carrying every tag named (repeated or separated by commas)"),
    _query("dataset", "The spec's dataset"),
    _query("arch", "The spec's architecture"),
    _query("q", "A job number, or words of the name or note"),
    _query("order", "newest (default), oldest, or next (the queue in run order)"),
    _query("after", "The `next_after` of the previous page", INTEGER),
    _query("limit", "At most this many (1–500, default 50)", INTEGER),
]
METRIC_PARAMETERS = [
    _query("name", "Series to read (repeated or separated by commas); default: every one"),
    _query("raw", "true: every point (step, value); false (default): min/max buckets",
           {"type": "boolean"}),
    _query("buckets", "At most this many buckets per series (default 2000)", INTEGER),
    _query("since", "A `cursor` from an earlier read: only the points written after it, raw",
           INTEGER),
]  # fmt: skip


def _paths() -> dict[str, Any]:
    job = [JOB_ID]
    return {
        API + "/jobs": {
            "post": _operation("Submit a job", {"201": _response("Queued", {"type": "object"})},
                               body="JobSpec"),
            "get": _operation("List jobs, newest first, a page at a time",
                              {"200": _response("A page of jobs", {"type": "object"})},
                              LIST_PARAMETERS),
        },
        API + "/sweeps": {
            "post": _operation("Submit a sweep (the definition `traindeck sweep submit` reads)",
                               {"201": _response("The sweep and its first trials' jobs",
                                                 {"type": "object"})},
                               body="SweepDefinition"),
            "get": _operation("List sweeps, newest first (as `traindeck sweep list --json`)",
                              {"200": _response("Every sweep",
                                                {"type": "array", "items": SWEEP_OBJECT})}),
        },
        SWEEP: {
            "get": _operation("Show a sweep with its trials and the best",
                              {"200": _response("The sweep", SWEEP_OBJECT)}, [SWEEP_ID]),
            "patch": _operation("Change the sweep's own tags and/or note",
                                {"200": _response("The sweep", SWEEP_OBJECT)}, [SWEEP_ID],
                                body="Labels"),
        },
        JOB: {
            "get": _operation("Show a job", {"200": _response("The job", JOB_OBJECT)}, job),
            "patch": _operation("Change the job's tags and/or note",
                                {"200": _response("The job", JOB_OBJECT)}, job, body="Labels"),
        },
        JOB + "/metrics": {
            "get": _operation("A job's metric series",
                              {"200": _response("Series by name, and a cursor for `since`",
                                                {"type": "object"})},
                              job + METRIC_PARAMETERS),
        },
        JOB + "/cancel": {
            "post": _operation("Cancel a queued job, or stop a running one at its next batch",
                               {"200": _response("cancelled or cancelling", {"type": "object"}),
                                "409": _response("Already finished", _ref("Error"))}, job),
        },
        JOB + "/retry": {
            "post": _operation("Queue a finished job again, as a new job",
                               {"201": _response("The new job", {"type": "object"}),
                                "409": _response("Not finished", _ref("Error"))}, job),
        },
        JOB + "/artifacts": {
            "get": _operation("The job's files",
                              {"200": _response("kind, file_name, bytes, sha256, url",
                                                {"type": "object"})}, job),
        },
        JOB + "/artifacts/{kind}": {
            "get": _operation("Download one of the job's files (Repr-Digest: its SHA-256)",
                              {"200": {"description": "The file",
                                       "content": {"application/octet-stream": {}}}},
                              [*job, KIND]),
        },
    }  # fmt: skip


def _schemas() -> dict[str, Any]:
    template = "#/components/schemas/{model}"
    schemas: dict[str, Any] = {}
    for model in (JobSpec, Labels):
        schema = model.model_json_schema(ref_template=template)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    schemas["SweepDefinition"] = {
        "type": "object",
        "description": "base (a job spec), space, objective, trials, max_concurrent, sampler, "
        "pruner, tags, note: as in a sweep file for `traindeck sweep submit`",
    }
    schemas["Error"] = {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {"type": "string"},
            "fields": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }
    return schemas


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "traindeck",
            "version": "1",
            "description": "Submit and follow traindeck's training jobs. Every endpoint needs "
            "an API token (made on the dashboard's Settings page) as `Authorization: Bearer`.",
        },
        "paths": _paths(),
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"token": []}],
    }
