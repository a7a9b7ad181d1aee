"""The TPU VMs page never shows the workers' database password (issue 23, finding 6).

The page used to pre-fill the database URL, password included, in a text input and in the
startup script's preview, for every viewer. Now both show it masked; a node is created with
the real URL (from TRAINDECK_WORKER_DATABASE_URL) unless the person types another one, and an
existing node's startup script is shown masked too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.support.fake_tpu_api import FakeTpuApi
from tests.support.tpu import PROJECT, ZONE

PAGE = str(Path(__file__).resolve().parents[2] / "dashboard" / "pages" / "tpu_vms.py")
PASSWORD = "s3cr3t-Pa55"
WORKER_DATABASE_URL = f"postgresql://trainer:{PASSWORD}@10.128.0.9:5432/traindeck"
MASKED_URL = "postgresql://trainer:***@10.128.0.9:5432/traindeck"


@pytest.fixture
def page(sqlite_engine, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("TRAINDECK_SOURCE_URL", "https://github.com/example/traindeck.git")
    monkeypatch.setenv("TRAINDECK_WORKER_DATABASE_URL", WORKER_DATABASE_URL)
    return AppTest.from_file(PAGE, default_timeout=30)


def _run(app: AppTest) -> AppTest:
    app.run()
    assert not app.exception, [e.message for e in app.exception]
    return app


def _everything_shown(app: AppTest) -> str:
    """Every string the page sends the browser: elements' and widgets' values, labels, help."""
    parts = [str(node.proto) for root in (app.main, app.sidebar) for node in root if node.proto]
    parts += [str(widget.value) for widget in (*app.text_input, *app.text_area)]
    return "\n".join(parts)


def _script_area(app: AppTest):
    (area,) = [area for area in app.text_area if area.key.startswith("tpu_new_script_")]
    return area


def test_the_database_url_is_shown_masked_and_the_node_gets_the_real_one(
    page: AppTest, fake_api: FakeTpuApi
):
    _run(page)
    page.text_input(key="tpu_new_name").set_value("trainer-1")
    _run(page)

    assert page.text_input(key="tpu_new_database_url").value == MASKED_URL
    preview = _script_area(page).value
    assert f"DATABASE_URL='{MASKED_URL}'" in preview
    assert PASSWORD not in _everything_shown(page)

    # An edit elsewhere in the script is kept; the password goes back in where it was masked.
    edited = preview.replace("RestartSec=15", "RestartSec=5")
    _script_area(page).set_value(edited)
    page.button(key="tpu_create").click()
    _run(page)
    (sent,) = fake_api.requests_of("POST", "/nodes")
    script = sent.body["metadata"]["startup-script"]
    assert f"DATABASE_URL={WORKER_DATABASE_URL}\n" in script
    assert "RestartSec=5" in script and MASKED_URL not in script
    assert script == edited.replace(f"'{MASKED_URL}'", WORKER_DATABASE_URL)


def test_a_database_url_typed_in_is_used_as_typed(page: AppTest, fake_api: FakeTpuApi):
    typed = "postgresql://other:typed-pw@10.128.0.10:5432/traindeck"
    _run(page)
    page.text_input(key="tpu_new_name").set_value("trainer-2")
    page.text_input(key="tpu_new_database_url").set_value(typed)
    _run(page)
    assert "typed-pw" not in _script_area(page).value  # the preview masks it too
    page.button(key="tpu_create").click()
    _run(page)
    (sent,) = fake_api.requests_of("POST", "/nodes")
    assert f"DATABASE_URL={typed}\n" in sent.body["metadata"]["startup-script"]


def test_an_existing_nodes_startup_script_is_shown_masked(page: AppTest, fake_api: FakeTpuApi):
    script = f"#!/bin/bash\nDATABASE_URL={WORKER_DATABASE_URL}\necho started\n"
    fake_api.add_node(PROJECT, ZONE, "worker-1", metadata={"startup-script": script})
    _run(page)
    codes = [code.value for code in page.code]
    assert any(f"DATABASE_URL={MASKED_URL}" in code for code in codes), codes
    assert PASSWORD not in _everything_shown(page)
