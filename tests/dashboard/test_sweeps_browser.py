"""The Sweeps page in a real headless Chromium: the parallel-coordinates plot of a running
sweep is drawn, and grows as its trials finish (each trial run as a worker would, without
training); the New sweep form starts a sweep. The screenshot is saved as
test-output/dashboard/sweeps_page.png."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from db import sweeps
from tests.dashboard.test_sweeps_page import DEFINITION, _run_trial
from tests.support.browser import CHROMIUM, ROOT, chromium, new_page, running_dashboard

SCREENSHOT = ROOT / "test-output" / "dashboard" / "sweeps_page.png"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]


@pytest.fixture
def dashboard_url(sqlite_engine, data_dir: Path, tmp_path: Path) -> Iterator[str]:
    with running_dashboard("127.0.0.1", dict(os.environ), tmp_path / "streamlit.log") as url:
        yield url


def _lines_drawn(page) -> int:
    """How many trials the parallel-coordinates plot draws (the length of its objective)."""
    return page.evaluate(
        """() => {
            const plot = [...document.querySelectorAll('.js-plotly-plot')]
                .find(p => (p.layout?.title?.text || '').includes('by the values of each'));
            if (!plot || !plot._fullData) return 0;
            const dims = plot._fullData[0].dimensions;
            return dims[dims.length - 1].values.length;
        }"""
    )


def _wait_until_drawn(page, count: int) -> None:
    """Until the plot draws `count` trials; the page redraws a running sweep every 5 s."""
    page.wait_for_function(
        """(count) => {
            const plot = [...document.querySelectorAll('.js-plotly-plot')]
                .find(p => (p.layout?.title?.text || '').includes('by the values of each'));
            if (!plot || !plot._fullData) return false;
            const dims = plot._fullData[0].dimensions;
            return dims[dims.length - 1].values.length === count;
        }""",
        arg=count,
        timeout=60_000,
    )


def test_the_parallel_coordinates_of_a_running_sweep_grow_as_trials_finish(
    sqlite_engine, dashboard_url, tmp_path
):
    engine = sqlite_engine
    sweep_id = sweeps.submit_sweep(engine, DEFINITION)
    _run_trial(engine, [0.6, 0.9])
    sweeps.drive(engine, sweep_id, "test")
    with chromium() as browser:
        page = new_page(browser, height=1600)
        page.goto(f"{dashboard_url}/sweeps?sweep={sweep_id}")
        _wait_until_drawn(page, 1)
        page.get_by_text("1 of 3", exact=True).wait_for(timeout=60_000)

        _run_trial(engine, [0.1], pruned=True)  # the page is not reloaded: it redraws itself
        _wait_until_drawn(page, 2)
        page.get_by_text("2 of 3", exact=True).wait_for(timeout=60_000)
        assert _lines_drawn(page) == 2
        page.screenshot(path=tmp_path / "sweeps_page.png", full_page=True)

        # The New sweep form, with its defaults (lr on a log scale, TPE, 8 trials, 2 at once).
        page.get_by_text("New sweep", exact=True).click()
        page.get_by_role("button", name="Start sweep").click()
        page.get_by_text(f"Started sweep #{sweep_id + 1}", exact=False).wait_for(timeout=60_000)
    started = sweeps.summary(engine, sweep_id + 1)
    assert started.spec.sampler == "tpe" and [p.field for p in started.spec.space] == ["lr"]
    assert len(started.trials) == 2, "two trials at once are queued"
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "sweeps_page.png", SCREENSHOT)
