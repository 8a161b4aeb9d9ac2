"""The chat page (--ui-server, port + 1) in headless Chromium: Debian's /usr/bin/chromium
driven by Python playwright through `executable_path` (never `playwright install`). It loads,
streams a reply that equals the API's own greedy answer, keeps the conversation, shows TTFT
and tok/s, and the test saves a screenshot (tmp path, plus $XINFER_TEST_ARTIFACTS if set)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium)", allow_module_level=True)
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)


@pytest.fixture(scope="module")
def page(server):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        yield page
        browser.close()


def _send(page, text: str, num_replies: int) -> str:
    page.fill("#input", text)
    page.click("#send")
    page.wait_for_selector(
        f".msg.assistant:nth-of-type({2 * num_replies})[data-done='true']", timeout=60_000
    )
    return page.locator(".msg.assistant .bubble").nth(num_replies - 1).text_content()


def test_page_streams_a_reply(server, page, tmp_path):
    assert httpx.get(server.ui).status_code == 200
    page.goto(server.ui)
    page.wait_for_function("document.querySelector('#model').textContent.includes('tiny_chat')")
    page.click("summary")  # open the settings
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "24")
    page.click("summary")
    # Count the updates of the reply bubble: a streamed reply arrives in several pieces.
    page.evaluate(
        """() => { window.updates = 0;
          new MutationObserver((records) => { window.updates += records.length; }).observe(
            document.getElementById('log'), {subtree: true, childList: true, characterData: true});
        }"""
    )
    reply = _send(page, "Hello! How are you today?", 1)
    expected = server.client().chat.completions.create(
        model="tiny_chat",
        messages=[{"role": "user", "content": "Hello! How are you today?"}],
        temperature=0,
        max_tokens=24,
    )
    assert reply and reply == expected.choices[0].message.content
    assert page.evaluate("window.updates") > 5  # the bubble grew piece by piece
    meta = page.locator(".msg.assistant .meta").first.text_content()
    assert "TTFT" in meta and "tok/s" in meta and "24 tokens" in meta

    # A second turn keeps the conversation (the page sends both turns).
    second = _send(page, "Tell me more.", 2)
    expected2 = server.client().chat.completions.create(
        model="tiny_chat",
        messages=[
            {"role": "user", "content": "Hello! How are you today?"},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "Tell me more."},
        ],
        temperature=0,
        max_tokens=24,
    )
    assert second == expected2.choices[0].message.content
    assert page.locator(".msg").count() == 4
    page.wait_for_function("document.getElementById('running').textContent === '0'")

    shot = tmp_path / "chat_page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 5000
    artifacts = os.environ.get("XINFER_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / shot.name)


def test_page_can_stop_a_generation(server, page):
    page.goto(server.ui)
    page.wait_for_function("document.querySelector('#model').textContent.includes('tiny_chat')")
    page.click("summary")
    page.fill("#max-tokens", "480")
    page.click("summary")
    # Press Stop from inside the page as soon as the first piece shows (no race with the end).
    page.evaluate(
        """() => new MutationObserver((_, obs) => {
          const b = document.querySelector('.msg.assistant .bubble');
          if (b && b.textContent.length > 0) {
            obs.disconnect();
            document.getElementById('stop').click();
          }
        }).observe(document.getElementById('log'),
                   {subtree: true, childList: true, characterData: true})"""
    )
    page.fill("#input", "one two three")
    page.click("#send")
    page.wait_for_selector(".msg.assistant[data-done='true']", timeout=30_000)
    assert "stopped" in page.locator(".msg.assistant .meta").text_content()
    assert page.is_enabled("#send")
    assert "480 tokens" not in page.locator(".msg.assistant .meta").text_content()
