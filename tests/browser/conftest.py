"""Browser tests of the playground: headless Chromium driven by Playwright against the
real service (`live_server`: uvicorn in this process, Postgres, the offline model).

Chromium is Debian's `chromium` package (`.ci/run` installs it); Playwright's own
browser download is not used. Without a Chromium the tests are skipped, saying so
(they fail instead when PARLEY_REQUIRE_BROWSER is set, as `.ci/run` does).
Each test keeps a screenshot of every step under tests/artifacts/browser/<test>/.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Locator, Page, async_playwright, expect
from sqlalchemy.ext.asyncio import AsyncEngine

from app.engine.llm.offline import OfflineModel
from tests.conftest import LiveServer, live_server, on_fake
from tests.fake_anthropic import FakeAnthropic

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts" / "browser"
BROWSER_KEY = "browser-tenant-key-0123456789"
# Pauses between the offline model's stream events, so a reply streams visibly (and a
# network drop can land in the middle of one).
MODEL_DELAY_SECONDS = 0.02
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

expect.set_options(timeout=15_000)


def find_chromium() -> str | None:
    """$PARLEY_CHROMIUM, else the first Chromium on PATH."""
    configured = os.environ.get("PARLEY_CHROMIUM")
    if configured:
        return configured if Path(configured).exists() else shutil.which(configured)
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    path = find_chromium()
    if path is None:
        why = (
            "no Chromium found: install Debian's chromium package (apt-get install chromium) "
            "or set PARLEY_CHROMIUM to a Chromium binary"
        )
        if os.environ.get("PARLEY_REQUIRE_BROWSER"):  # CI (.ci/run): never skip
            pytest.fail(why)
        pytest.skip(why)
    async with async_playwright() as playwright:
        # Playwright gives each launch a fresh temporary profile (--user-data-dir).
        browser = await playwright.chromium.launch(
            executable_path=path, headless=True, args=LAUNCH_ARGS
        )
        yield browser
        await browser.close()


@pytest.fixture(scope="module")
async def server(database_url: str, engine: AsyncEngine) -> AsyncIterator[LiveServer]:
    """The service with the offline model, for a tenant of its own (so the session list
    holds only what these tests create)."""
    async with live_server(
        database_url, engine, api_keys=[f"browser:{BROWSER_KEY}"], secret_key="b" * 40
    ) as server:
        server.runtime.resources.llm = OfflineModel(delay=MODEL_DELAY_SECONDS)
        yield server


@pytest.fixture(scope="module")
async def anthropic_server(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> AsyncIterator[LiveServer]:
    """The service on the `anthropic` provider: the real SDK against the fake API."""
    async with live_server(
        database_url, engine, api_keys=[f"browser:{BROWSER_KEY}"], **on_fake(fake)
    ) as server:
        yield server


class Playground:
    """The page, with the steps a person takes on it."""

    def __init__(self, page: Page, server: LiveServer, shots: Path) -> None:
        self.page = page
        self.server = server
        self.shots = shots
        self.count = 0
        self.errors: list[str] = []

    async def shot(self, name: str) -> None:
        self.count += 1
        await self.page.screenshot(path=self.shots / f"{self.count:02d}-{name}.png")

    @property
    def status(self) -> Locator:
        return self.page.locator("#status")

    @property
    def title(self) -> Locator:
        """The open session's title (the heading above the conversation)."""
        return self.page.locator("#session-title")

    @property
    def box(self) -> Locator:
        return self.page.get_by_role("textbox", name="Message", exact=True)

    @property
    def log(self) -> Locator:
        return self.page.get_by_role("log", name="Conversation")

    def messages(self, who: str | None = None) -> Locator:
        """The conversation's message bubbles ("You" or "Assistant")."""
        if who is None:
            return self.log.locator("article.msg")
        return self.log.get_by_role("article", name=who, exact=True)

    async def enter_key(self) -> None:
        key = self.page.get_by_label("API key")
        await key.fill(BROWSER_KEY)
        await key.press("Enter")
        await expect(self.status).to_have_text("API key saved for this tab")

    async def new_session(
        self,
        title: str,
        *,
        client_tool: bool = False,
        thinking: str | None = None,
        fields: dict[str, str] | None = None,
        unchecked: tuple[str, ...] = (),
    ) -> None:
        await self.page.get_by_role("button", name="New session").click()
        dialog = self.page.get_by_role("dialog", name="New session")
        await dialog.get_by_label("Title").fill(title)
        if client_tool:
            await dialog.get_by_role("button", name="Add an example client tool").click()
        if thinking:
            await dialog.get_by_label("Thinking mode").select_option(thinking)
        for label, value in (fields or {}).items():
            await dialog.get_by_label(label, exact=True).fill(value)
        for label in unchecked:
            await dialog.get_by_label(label, exact=True).uncheck()
        await dialog.get_by_role("button", name="Create").click()
        await expect(dialog).to_be_hidden()
        await expect(self.title).to_have_text(title)
        await expect(self.box).to_be_enabled()

    async def send(self, text: str, *, until: str = "Reply complete") -> None:
        """Type a message, press Enter, wait for the status the turn ends with."""
        await self.box.fill(text)
        await self.box.press("Enter")
        await expect(self.status).to_have_text(until)

    def api(self) -> httpx.AsyncClient:
        return self.server.client(BROWSER_KEY)

    async def session_id(self) -> str:
        match = re.search(r"#session=([0-9a-f-]{36})", self.page.url)
        assert match, self.page.url
        return match.group(1)


def _relevant(message: Any) -> bool:
    # Chromium reports every failed load (a 401 before the key is entered, a 404 the
    # page expects) as a console error; the page's own errors are what matter here.
    return message.type == "error" and "Failed to load resource" not in message.text


@contextlib.asynccontextmanager
async def open_playground(
    browser: Browser, server: LiveServer, request: pytest.FixtureRequest
) -> AsyncIterator[Playground]:
    """A fresh browser context on the page, loaded; fails the test on page errors."""
    shots = ARTIFACTS / request.node.name
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    context = await browser.new_context(
        base_url=server.base_url, viewport={"width": 1360, "height": 900}
    )
    page = await context.new_page()
    ui = Playground(page, server, shots)
    page.on("pageerror", lambda error: ui.errors.append(f"page error: {error}"))
    page.on("console", lambda m: ui.errors.append(m.text) if _relevant(m) else None)
    await page.goto("/")
    await expect(page.locator("body[data-ready]")).to_be_attached()
    try:
        yield ui
    finally:
        await context.close()
    assert ui.errors == [], ui.errors


@pytest.fixture
async def playground(
    browser: Browser, server: LiveServer, request: pytest.FixtureRequest
) -> AsyncIterator[Playground]:
    async with open_playground(browser, server, request) as ui:
        yield ui


@pytest.fixture
async def anthropic_playground(
    browser: Browser, anthropic_server: LiveServer, request: pytest.FixtureRequest
) -> AsyncIterator[Playground]:
    async with open_playground(browser, anthropic_server, request) as ui:
        yield ui
