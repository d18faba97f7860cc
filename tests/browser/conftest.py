"""Real-browser tests: pytest-django's live server, Playwright driving Debian's Chromium, real workers.

Playwright never downloads a browser here: it launches ``/usr/bin/chromium`` (``apt-get install
chromium``; ``.ci/run`` installs it). Where that binary is missing the browser tests are
deselected and the run says so plainly: they are never skipped in silence. Workers are real
``manage.py run_workers`` processes against the test database, stopped before it is flushed.
Waits are bounded waits for a state (Playwright's ``expect`` or ``wait_until``), never sleeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from core.process_sessions import signal_session
from tests.support.subprocess_env import database_url

# Debian's Chromium; STINT_CHROMIUM points elsewhere (e.g. to a missing path, to see the "not run" report).
CHROMIUM = Path(os.environ.get("STINT_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
NOT_RUN = f"browser tests NOT run: {CHROMIUM} missing"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"
WIDE = {"width": 1400, "height": 900}  # the operator's screen the layout is checked at (issue 18)
BROWSER_DIR = Path(__file__).resolve().parent
UI_WAIT = 30_000  # ms any one awaited page state may take (a worker start and a job run included)
WAIT = 30.0  # seconds any one awaited database state may take
STOP_WAIT = 10.0  # seconds a worker may take to exit after SIGTERM
WORKER_ENV = {
    "STINT_POLL_SECONDS": "0.2",
    "STINT_HEARTBEAT_SECONDS": "0.5",
    "STINT_LEASE_SECONDS": "5",
    "LOG_LEVEL": "INFO",
    "PYTHONUNBUFFERED": "1",
}
MIN_CONTRAST = 4.5  # WCAG AA for normal text

T = TypeVar("T")
_NOT_RUN_KEY = pytest.StashKey[int]()


# -- Chromium missing: deselect, and say so ------------------------------------------------------------


def _is_browser_test(item: pytest.Item) -> bool:
    return BROWSER_DIR in Path(item.path).resolve().parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without /usr/bin/chromium, deselect the browser tests and print that they were not run."""
    if CHROMIUM.exists():
        return
    deselected = [item for item in items if _is_browser_test(item)]
    if not deselected:
        return
    items[:] = [item for item in items if not _is_browser_test(item)]
    config.hook.pytest_deselected(items=deselected)
    config.stash[_NOT_RUN_KEY] = len(deselected)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"{NOT_RUN} ({len(deselected)} deselected)", red=True, bold=True)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Repeat, at the end of the run, that the browser tests were not run."""
    count = config.stash.get(_NOT_RUN_KEY, 0)
    if count:
        terminalreporter.write_line(f"{NOT_RUN} ({count} deselected)", red=True, bold=True)


# -- the browser ----------------------------------------------------------------------------------------


@pytest.fixture(scope="package")
def browser(django_db_setup: None) -> Iterator[Any]:
    """One headless Chromium (Debian's) for the browser tests, started after the test database exists.

    Playwright's sync API keeps an asyncio loop running on the test thread while it lives, which
    Django's async-safety check reads as "called from async code". The tests are synchronous, so
    the check is a false alarm here: it is switched off exactly while the browser is up (package
    scope, so no other test package runs beside that loop). The live server answers on its own
    thread either way.
    """
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                yield chromium
            finally:
                chromium.close()


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    """A fresh browser context (own cookies) on the live server."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(UI_WAIT)
    tab = context.new_page()
    try:
        yield tab
    finally:
        context.close()


@pytest.fixture
def new_page(browser: Any, live_server: Any) -> Iterator[Callable[[], Any]]:
    """Open more independent sessions (another user) in the same test."""
    contexts: list[Any] = []

    def make() -> Any:
        context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
        context.set_default_timeout(UI_WAIT)
        contexts.append(context)
        return context.new_page()

    try:
        yield make
    finally:
        for context in contexts:
            context.close()


# -- real workers ---------------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], T], *, what: str, timeout: float = WAIT) -> T:
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Workers:
    """Starts ``run_workers`` processes for one test; all are stopped (SIGTERM, then SIGKILL) afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, *, concurrency: int = 4) -> subprocess.Popen[bytes]:
        """Start one worker (all queues, thread pool) and wait until it has registered."""
        from scheduler.models import WorkerNode

        log = self.tmp_path / f"worker-{len(self.started)}.log"
        env = {**os.environ, **WORKER_ENV, "DATABASE_URL": database_url()}
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "run_workers",
                    "--processes=1",
                    f"--concurrency={concurrency}",
                    "--grace-seconds=2",
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append((popen, log))

        def registered() -> bool:
            if popen.poll() is not None:
                raise AssertionError(f"worker exited with {popen.returncode}:\n{log.read_text(errors='replace')}")
            return WorkerNode.objects.filter(supervisor_pid=popen.pid, stopped_at__isnull=True).exists()

        wait_until(registered, what="the worker to register")
        return popen

    def stop_all(self) -> None:
        """SIGTERM every worker, then SIGKILL its process group if it lingers."""
        for popen, _ in self.started:
            if popen.poll() is None:
                popen.send_signal(signal.SIGTERM)
        for popen, _ in self.started:
            try:
                popen.wait(timeout=STOP_WAIT)
            except subprocess.TimeoutExpired:
                signal_session(popen.pid, signal.SIGKILL)
                popen.wait(timeout=STOP_WAIT)

    def logs(self) -> str:
        """Every worker's output, for a failing test's report."""
        return "\n".join(
            f"----- worker pid {p.pid} -----\n{log.read_text(errors='replace')}" for p, log in self.started
        )


@pytest.fixture
def workers(transactional_db: None, tmp_path: Path) -> Iterator[Workers]:
    """``workers.start()`` runs a real worker; every one is stopped before the test database is flushed."""
    started = Workers(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()
        sys.stderr.write(started.logs() + "\n")


# -- page checks ----------------------------------------------------------------------------------------

A11Y_SCRIPT = """
() => {
  const visible = (el) => !!(el.offsetWidth || el.offsetHeight || el.getClientRects().length);
  const controls = Array.from(document.querySelectorAll("input, select, textarea")).filter((el) => {
    const type = (el.getAttribute("type") || "").toLowerCase();
    return visible(el) && !["hidden", "submit", "button", "reset", "image"].includes(type);
  });
  const unlabelled = controls.filter((el) => {
    const named = (l) => l.textContent.trim() || Array.from(l.querySelectorAll("img[alt]")).some((i) => i.alt.trim());
    if (el.labels && Array.from(el.labels).some(named)) return false;
    if ((el.getAttribute("aria-label") || "").trim()) return false;
    const ids = (el.getAttribute("aria-labelledby") || "").split(/\\s+/).filter(Boolean);
    return !ids.some((id) => { const t = document.getElementById(id); return t && t.textContent.trim(); });
  }).map((el) => el.outerHTML.slice(0, 160));
  const headings = Array.from(document.querySelectorAll("h1, h2, h3, h4, h5, h6")).filter(visible);
  const levels = headings.map((h) => Number(h.tagName[1]));
  const jumps = [];
  for (let i = 1; i < levels.length; i++) {
    if (levels[i] > levels[i - 1] + 1) {
      jumps.push(`${headings[i - 1].tagName} -> ${headings[i].tagName} ${headings[i].textContent.trim()}`);
    }
  }
  const emptyHeadings = headings.filter((h) => !h.textContent.trim()).length;
  const rgb = (value) => {
    const m = value.match(/rgba?\\(([^)]+)\\)/);
    return m ? m[1].split(",").map((x) => parseFloat(x)) : null;
  };
  const luminance = ([r, g, b]) => {
    const f = (c) => { c = c / 255; return c <= 0.04045 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const backgroundOf = (el) => {
    for (let node = el; node; node = node.parentElement) {
      const c = rgb(getComputedStyle(node).backgroundColor);
      if (c && (c.length < 4 || c[3] > 0)) return c;
    }
    return [255, 255, 255];
  };
  const badges = Array.from(document.querySelectorAll(".badge")).filter(visible).map((el) => {
    const fg = rgb(getComputedStyle(el).color);
    const bg = backgroundOf(el);
    const [hi, lo] = [luminance(fg), luminance(bg)].sort((a, b) => b - a);
    return { text: el.textContent.trim(), ratio: (hi + 0.05) / (lo + 0.05) };
  });
  return {
    controls: controls.length,
    unlabelled,
    h1: document.querySelectorAll("h1").length,
    jumps,
    emptyHeadings,
    badges,
    main: document.querySelectorAll("main, [role=main], #content").length,
  };
}
"""


def accessibility_basics(page: Any) -> dict[str, Any]:
    """Check the page's basics and return what was measured.

    Every visible input, select and textarea has a label (``<label for>``, ``aria-label`` or
    ``aria-labelledby``); there is exactly one ``h1`` and no heading skips a level; there is a
    main landmark; every visible status badge's text contrasts with its background by at least
    4.5:1, computed from the browser's computed styles (WCAG relative luminance).
    The page is read once it has loaded (its styles applied), so a document still being parsed
    after a click is not measured half-built.
    """
    page.wait_for_load_state("load")
    found = page.evaluate(A11Y_SCRIPT)
    assert found["unlabelled"] == [], f"inputs without a label: {found['unlabelled']}"
    assert found["h1"] == 1, f"expected one h1, found {found['h1']}"
    assert found["jumps"] == [], f"heading levels skipped: {found['jumps']}"
    assert found["emptyHeadings"] == 0
    assert found["main"] >= 1, "no main landmark"
    low = [b for b in found["badges"] if b["ratio"] < MIN_CONTRAST]
    assert low == [], f"badges below {MIN_CONTRAST}:1 contrast: {low}"
    return found


def screenshot(page: Any, name: str, *, docs: bool = False) -> Path:
    """Save a full-page PNG under ``artifacts/`` (git-ignored) and return its path.

    ``docs``: the README's screenshot of this page. With ``STINT_DOCS_SCREENSHOTS=1`` (``make
    screenshots``) it is also written to ``docs/screenshots/<name>.png``, the visible viewport
    only, so the committed pictures stay small; a plain test run leaves ``docs/`` alone.
    """
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0
    if docs and os.environ.get("STINT_DOCS_SCREENSHOTS") == "1":
        DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_SCREENSHOTS / f"{name}.png"), full_page=False)
    return path


CLIPPED_SCRIPT = """
() => {
  const out = [];
  const width = document.documentElement.clientWidth;
  for (const table of document.querySelectorAll("table")) {
    if (!(table.offsetWidth || table.offsetHeight)) continue;
    const box = table.getBoundingClientRect();
    if (box.right > width + 1) out.push(`table ${table.id || table.className} runs past the window`);
    let scroller = table.parentElement;
    while (scroller && getComputedStyle(scroller).overflowX === "visible") scroller = scroller.parentElement;
    if (scroller && scroller !== document.body && scroller !== document.documentElement
        && scroller.scrollWidth > scroller.clientWidth + 1) {
      out.push(`table ${table.id || table.className} hides columns behind a sideways scroll`
        + ` (${scroller.scrollWidth} px wide in ${scroller.clientWidth} px)`);
    }
    for (const cell of table.querySelectorAll("th, td")) {
      if (cell.scrollWidth > cell.clientWidth + 1 && getComputedStyle(cell).overflowX !== "visible") {
        out.push(`cell cut: ${cell.textContent.trim().slice(0, 40)}`);
      }
    }
  }
  if (document.documentElement.scrollWidth > width + 1) out.push("the page scrolls sideways");
  return out;
}
"""


def nothing_cut(page: Any) -> None:
    """Assert every table column is in view: none past the window or behind a sideways scroll, no cell clipped."""
    problems = page.evaluate(CLIPPED_SCRIPT)
    assert problems == [], problems
