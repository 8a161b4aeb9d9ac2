"""The chat page in headless Chromium: Debian's /usr/bin/chromium driven by Python playwright
through `executable_path` (never `playwright install`). Served by the API itself (same origin)
and by --ui-server on port + 1; streams a reply equal to the API's greedy answer; renders a
markdown answer (highlighted code with a copy button, a table, LaTeX) sanitized; keeps its
conversations across a reload (list, rename, delete, regenerate, edit). The markdown test
saves a screenshot (docs/images/chat_page.png is one of them)."""

from __future__ import annotations

import json
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
DOCS_SHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "chat_page.png"
MARKDOWN = """Here is **the plan**, with `inline code`:

```python
def add(a, b):
    return a + b  # sum
```

| expert | hits | misses |
|---|---:|---:|
| 0 | 120 | 3 |
| 7 | 98 | 11 |

Euler: $e^{i\\pi} + 1 = 0$, and on its own line:

$$\\int_0^1 x^2\\,dx = \\frac{1}{3}$$

<script>window.pwned = 1</script><b onclick="window.pwned = 2">Done.</b>"""

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium)", allow_module_level=True)
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)


@pytest.fixture(scope="module")
def browser(server):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1200, "height": 800})  # fresh storage
    page = context.new_page()
    page.set_default_timeout(120_000)
    yield page
    context.close()


def _settings(page, **values) -> None:
    page.click("summary")
    for name, value in values.items():
        page.fill(f"#{name}", str(value))
        page.dispatch_event(f"#{name}", "change")
    page.click("summary")


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_function("document.querySelector('#model').textContent.includes('tiny_chat')")


def _send(page, text: str, num_replies: int) -> None:
    page.fill("#input", text)
    page.click("#send")
    page.wait_for_function(
        f"document.querySelectorAll('.msg.assistant[data-done=\"true\"]').length >= {num_replies}"
        " && !document.querySelector('.msg[data-done=\"false\"]')"
    )


def _stored(page) -> list[dict]:
    return page.evaluate("JSON.parse(localStorage.getItem('xinfer.conversations.v1'))")


def _sse(text: str) -> str:
    pieces = [text[i : i + 40] for i in range(0, len(text), 40)]
    events = [
        {"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces
    ]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    events.append({"choices": [], "usage": {"completion_tokens": len(pieces)}})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def _canned(page, text: str, bodies: list | None = None) -> None:
    """Answer the page's chat requests with `text` (recording the request bodies)."""

    def handle(route):
        if bodies is not None:
            bodies.append(json.loads(route.request.post_data))
        route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=_sse(text))

    page.route("**/v1/chat/completions", handle)


def test_page_streams_the_greedy_reply_from_the_ui_port(server, page):
    assert httpx.get(server.ui).status_code == 200
    _open(page, server.ui)  # port + 1: the API is another origin
    _settings(page, temperature=0, **{"max-tokens": 24})
    page.evaluate(
        """() => { window.updates = 0;
          new MutationObserver((records) => { window.updates += records.length; }).observe(
            document.getElementById('log'), {subtree: true, childList: true, characterData: true});
        }"""
    )
    _send(page, "Hello! How are you today?", 1)
    expected = server.client().chat.completions.create(
        model="tiny_chat",
        messages=[{"role": "user", "content": "Hello! How are you today?"}],
        temperature=0,
        max_tokens=24,
    )
    [conv] = _stored(page)
    reply = conv["messages"][1]["content"]
    assert reply and reply == expected.choices[0].message.content
    assert page.evaluate("window.updates") > 5  # the bubble grew piece by piece
    meta = page.locator(".msg.assistant .meta").first.text_content()
    assert "TTFT" in meta and "tok/s" in meta and "24 tokens" in meta
    page.wait_for_function("document.getElementById('running').textContent === '0'")


def test_a_reply_read_in_one_burst_gets_a_lower_bound_rate(server, page):
    """A reply whose stream the page reads at once (here canned; a fast model on a busy
    browser does it too) has no first-to-last interval: the page shows the rate over the
    request's whole time, marked as a lower bound, not nothing."""
    _open(page, server.ui)
    _canned(page, "word " * 40)  # 200 characters: 5 pieces, usage 5 tokens, one body
    _send(page, "Hello", 1)
    meta = page.locator(".msg.assistant .meta").first.text_content()
    assert "TTFT" in meta and "≥ " in meta and " tok/s" in meta and "5 tokens" in meta


def test_page_works_same_origin(server, page):
    seen = []
    page.on("request", lambda r: seen.append(r.url))
    _open(page, server.base + "/")  # served by the API server itself
    _settings(page, temperature=0, **{"max-tokens": 8})
    _send(page, "Hello", 1)
    api_calls = [u for u in seen if "/v1/" in u]
    assert api_calls and all(u.startswith(server.base + "/") for u in api_calls)
    assert all(u.startswith(server.base + "/") for u in seen)  # no CDN, nothing elsewhere
    assert page.locator(".msg.assistant:not(.error)").count() == 1


def test_markdown_answer_renders_sanitized(server, page, tmp_path):
    _open(page, server.base + "/")
    _canned(page, MARKDOWN)
    _send(page, "Show me code, a table and math.", 1)
    bubble = page.locator(".msg.assistant .bubble")
    assert bubble.locator("pre code.hljs .hljs-keyword").first.text_content() == "def"
    assert bubble.locator("pre .copy").count() == 1
    bubble.locator("pre .copy").click()
    page.wait_for_function("document.querySelector('pre .copy').textContent === 'Copied'")
    assert bubble.locator("table th").all_text_contents() == ["expert", "hits", "misses"]
    assert bubble.locator("table tbody tr").count() == 2
    assert bubble.locator("strong").first.text_content() == "the plan"
    assert bubble.locator(".katex").count() == 2 and bubble.locator(".katex-display").count() == 1
    assert bubble.locator("script, [onclick]").count() == 0
    bubble.locator("b", has_text="Done.").click()
    assert page.evaluate("window.pwned === undefined")
    shot = tmp_path / "chat_page.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 5000
    if os.environ.get("XINFER_UPDATE_DOCS"):
        DOCS_SHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, DOCS_SHOT)
    artifacts = os.environ.get("XINFER_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / shot.name)


def test_history_survives_a_reload_and_can_be_managed(server, page):
    bodies: list = []
    _open(page, server.base + "/")
    _canned(page, "first answer", bodies)
    _send(page, "first question", 1)
    page.click("#new-chat")
    _send(page, "second question", 1)
    page.reload()
    page.wait_for_selector("#conversations li")
    assert page.locator("#conversations li").count() == 2
    assert page.locator(".msg.user .bubble").all_text_contents() == ["second question"]
    page.locator("#conversations .title", has_text="first question").click()
    texts = [t.strip() for t in page.locator(".msg .bubble").all_text_contents()]
    assert texts == ["first question", "first answer"]

    # Regenerate sends the same history again; edit redoes the turn from the edited message.
    page.click("text=Regenerate")
    page.wait_for_function("document.querySelectorAll('.msg[data-done=\"true\"]').length == 2")
    assert bodies[-1]["messages"] == [{"role": "user", "content": "first question"}]
    page.click(".msg.user >> text=Edit")
    page.fill(".msg.user textarea.edit", "first question, edited")
    page.click(".save-edit")
    page.wait_for_function("document.querySelectorAll('.msg[data-done=\"true\"]').length == 2")
    assert bodies[-1]["messages"] == [{"role": "user", "content": "first question, edited"}]
    assert bodies[-1]["temperature"] == 0.7 and "top_p" in bodies[-1]  # the sampler fields

    page.once("dialog", lambda d: d.accept("Renamed chat"))
    page.locator("#conversations li.current .rename").click()
    page.reload()
    page.wait_for_selector("#conversations li")
    titles = page.locator("#conversations .title").all_text_contents()
    assert "Renamed chat" in titles and len(titles) == 2
    page.locator("#conversations li", has_text="Renamed chat").locator(".delete").click()
    page.reload()
    page.wait_for_selector("#conversations li")
    assert page.locator("#conversations .title").all_text_contents() == ["second question"]


def test_page_can_stop_a_generation(server, page):
    _open(page, server.base + "/")
    _settings(page, **{"max-tokens": 480})
    # Press Stop from inside the page as soon as the first piece shows (no race with the end).
    page.evaluate(
        """() => new MutationObserver((_, obs) => {
          const b = document.querySelector('.msg.assistant[data-done="false"] .bubble');
          if (b && b.textContent.length > 0) {
            obs.disconnect();
            document.getElementById('stop').click();
          }
        }).observe(document.getElementById('log'),
                   {subtree: true, childList: true, characterData: true})"""
    )
    _send(page, "one two three", 1)
    meta = page.locator(".msg.assistant .meta").text_content()
    assert "stopped" in meta and "480 tokens" not in meta
    assert page.is_enabled("#send")
