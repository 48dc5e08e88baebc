"""The web console in real browsers: headless Chromium (Selenium) and headless Firefox (Marionette) driving the
page of a live `diffuserve serve` of the bundled model, with an API key; every test but the screenshots runs in
both. Each answer the page shows is checked against the server's API (the same request without the page), the
planner's figure against `diffuserve plan --json`, and the page's console log must stay free of errors. A
browser's tests are skipped, with the reason, only where it cannot be run (scripts/run.sh installs Debian's
chromium, chromium-driver and firefox-esr when it can).

The browser helpers are scripts/console_screenshots.py's, whose screenshots (Chromium's) are taken here too;
tests/server/firefox_driver.py gives Firefox the Selenium methods they call.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.browser_proxy import FaultyProxy
from tests.server.firefox_driver import FirefoxDriver, firefox_problem

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("console_screenshots", ROOT / "scripts" / "console_screenshots.py")
assert _spec is not None and _spec.loader is not None
shots = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shots)

pytestmark = pytest.mark.slow
BROWSERS = {
    name: pytest.param(name, marks=pytest.mark.skipif(problem is not None, reason=f"no {name}: {problem}"))
    for name, problem in (("chromium", shots.browser_problem()), ("firefox", firefox_problem()))
}

API_KEY = "console-key"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    process, url = shots.start_server("--api-key", API_KEY)
    yield url
    shots.stop_server(process)


@pytest.fixture(scope="module", params=BROWSERS.values())
def browser(request: pytest.FixtureRequest, server: str) -> Iterator[Any]:
    driver = shots.start_browser() if request.param == "chromium" else FirefoxDriver(shots.LAPTOP)
    shots.open_console(driver, server, API_KEY)
    yield driver
    driver.quit()


class ConsoleLog:
    """The browser's console entries of one test; HTTP errors the test provokes on purpose may be allowed."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.allowed_http_errors = False

    def errors(self) -> list[dict[str, Any]]:
        entries = [e for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]
        if self.allowed_http_errors:
            entries = [e for e in entries if e.get("source") != "network"]
        return entries


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Any]:
    """The signed-in page, loaded afresh (settings as the server gives them, a new conversation: the model knows
    single turns), at laptop width; its console log is checked after the test."""
    shots.resize(browser, shots.LAPTOP)
    shots.open_console(browser, server, API_KEY)
    shots.select_view(browser, "chat")
    log = ConsoleLog(browser)
    log.errors()  # drop what earlier tests left
    browser.console_log = log
    yield browser
    assert log.errors() == []


def _api_chat(server: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"messages": messages}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.post(server + "/v1/chat/completions", json=body, headers=headers, timeout=60).json()


def _api_steps(server: str, text: str, **fields: Any) -> list[dict[str, Any]]:
    body = {
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "stream_options": {"include_denoising": True},
        **fields,
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    steps = []
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, headers=headers, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                steps += json.loads(line[6:]).get("denoising", [])
    return steps


def _by(name: str) -> Any:
    from selenium.webdriver.common.by import By

    return getattr(By, name)


def _focused(driver: Any) -> Any:
    return driver.execute_script("return document.activeElement")


def test_the_page_loads_signed_in(page: Any, server: str):
    shots.open_console(page, server, API_KEY)
    assert page.find_element(_by("ID"), "model-name").text == "default-model"
    assert shots.page_load_ms(page) > 0
    # every request the page made went to this server
    urls = page.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert urls and all(url.startswith(server) for url in urls), urls


def test_a_chat_message_gets_the_answer(page: Any, server: str):
    conversation: list[dict[str, str]] = []
    for text in ("What is 27+15?", "Reverse hello"):  # the second turn goes with the first (the model's template)
        answer = shots.send_chat(page, text)
        conversation.append({"role": "user", "content": text})
        expected = _api_chat(server, conversation)
        conversation.append({"role": "assistant", "content": expected["choices"][0]["message"]["content"]})
        assert answer["content"] == expected["choices"][0]["message"]["content"]
        usage = expected["usage"]
        assert f"{usage['completion_tokens']} tokens · {usage['num_forwards']} forwards" in answer["meta"]
    assert conversation[1]["content"] == "42"


def test_the_denoising_cells_fill_step_by_step(page: Any, server: str):
    from selenium.webdriver.common.keys import Keys

    shots.send_chat(page, shots.CHAT_PROMPT)
    shots.select_view(page, "denoising")
    steps = _api_steps(server, shots.CHAT_PROMPT)
    assert len(steps) > len({s["block"] for s in steps})  # some block took several steps
    slider = page.find_element(_by("ID"), "replay-step")
    assert slider.get_attribute("max") == str(len(steps))
    page.find_element(_by("ID"), "replay-first").click()
    assert page.find_elements(_by("CSS_SELECTOR"), "#denoise-blocks .cell[data-position]") == []
    decided: dict[int, int] = {}  # position -> step of its block that last wrote it
    for k, step in enumerate(steps, start=1):
        slider.send_keys(Keys.ARROW_RIGHT)
        decided.update(dict.fromkeys(step["positions"], step["step"]))
        cells = page.find_elements(_by("CSS_SELECTOR"), "#denoise-blocks .cell[data-position]")
        shown = {int(c.get_attribute("data-position")): int(c.get_attribute("data-step")) for c in cells}
        assert shown == decided, f"after step {k}"
        assert page.find_element(_by("ID"), "replay-label").text == f"step {k} of {len(steps)}"
    assert page.find_elements(_by("CSS_SELECTOR"), "#denoise-blocks .cell.mask") == []
    page.find_element(_by("ID"), "replay-play").click()  # a replay from the start runs to the end
    shots.wait(page, lambda d: d.find_element(_by("ID"), "replay-label").text == f"step {len(steps)} of {len(steps)}")


def test_verified_drafts_show_kept_rejected_and_causal(page: Any, server: str):
    """decoder=verified: after each entry of the trace, every cell shows the step that wrote it and what the causal
    checks made of it (kept, rejected: struck through, causal), as the API's `check` entries say."""
    from selenium.webdriver.common.keys import Keys

    prompt = "Reverse hello"  # the bundled model's causal reading rejects some of its drafts here
    steps = _api_steps(server, prompt, decoder="verified")
    assert any(s["check"] and s["check"]["rejected_positions"] for s in steps)
    page.find_element(_by("CSS_SELECTOR"), "#set-decoder option[value='verified']").click()
    shots.send_chat(page, prompt)
    shots.select_view(page, "denoising")
    slider = page.find_element(_by("ID"), "replay-step")
    assert slider.get_attribute("max") == str(len(steps))
    page.find_element(_by("ID"), "replay-first").click()
    expected: dict[int, tuple[int, str | None]] = {}  # position -> (step, check state)
    for k, step in enumerate(steps, start=1):
        slider.send_keys(Keys.ARROW_RIGHT)
        check = step["check"]
        if check is None:
            expected.update(dict.fromkeys(step["positions"], (step["step"], None)))
        else:
            expected.update({p: (expected[p][0], "kept") for p in check["accepted_positions"]})
            expected.update(dict.fromkeys(check["rejected_positions"], (step["step"], "rejected")))
            if check["causal_position"] is not None:
                expected[check["causal_position"]] = (step["step"], "causal")
        cells = page.find_elements(_by("CSS_SELECTOR"), "#denoise-blocks .cell[data-position]")
        shown = {
            int(c.get_attribute("data-position")): (int(c.get_attribute("data-step")), c.get_attribute("data-check"))
            for c in cells
        }
        assert shown == expected, f"after step {k}"
        for cell in page.find_elements(_by("CSS_SELECTOR"), "#denoise-blocks .cell[data-check='rejected']"):
            assert "line-through" in cell.value_of_css_property("text-decoration"), "a rejected draft is struck"
    legend = page.find_element(_by("ID"), "denoise-legend").text
    assert "rejected draft" in legend and "causal token" in legend
    kept = sum(len(s["check"]["accepted_positions"]) for s in steps if s["check"])
    checked = kept + sum(len(s["check"]["rejected_positions"]) for s in steps if s["check"])
    assert f"{kept} of {checked} checked drafts kept" in page.find_element(_by("ID"), "denoise-summary").text


def test_the_planner_shows_what_diffuserve_plan_says(page: Any):
    shown = shots.plan(page, "Clover-35B-A3B", "H200", "131072")
    command = [sys.executable, "-m", "diffuserve", "plan", "Clover-35B-A3B", "--hardware", "H200"]
    capacity = json.loads(
        subprocess.run(
            [*command, "--context-length", "131072", "--json"], capture_output=True, text=True, check=True
        ).stdout
    )["capacity"]
    assert int(shown.replace(",", "")) == capacity["max_seqs_by_kv"] * capacity["num_replicas"] == 21
    label = page.find_element(_by("ID"), "plan-fit-label").text
    assert label == "sequences fit at 131,072 tokens"
    assert page.find_elements(_by("CSS_SELECTOR"), "#plan-memory svg rect")
    assert len(page.find_elements(_by("CSS_SELECTOR"), "#plan-curve svg path")) == 2  # hybrid and full attention


def test_bad_input_is_a_readable_message(page: Any):
    page.console_log.allowed_http_errors = True  # the refusals are HTTP 400s, which Chromium logs
    shots.select_view(page, "chat")
    page.find_element(_by("ID"), "chat-input").clear()
    page.find_element(_by("ID"), "chat-send").click()
    assert "Type a message first" in page.find_element(_by("ID"), "chat-problem").text
    page.find_element(_by("ID"), "set-json").click()
    schema = page.find_element(_by("ID"), "set-schema")
    schema.clear()
    schema.send_keys("{not json")
    page.find_element(_by("ID"), "chat-input").send_keys("What is 27+15?")
    page.find_element(_by("ID"), "chat-send").click()
    assert "JSON schema: not valid JSON" in page.find_element(_by("ID"), "chat-problem").text
    page.find_element(_by("ID"), "set-json").click()
    problem = shots.plan(page, "Clover-35B-A3B", "H200", "262144")
    assert "No plan: context_length: 262144 exceeds Clover-35B-A3B's maximum of 131072 tokens" in problem
    assert "does not fit on 1 x RTX-4090" in shots.plan(page, "Clover-35B-A3B", "RTX-4090", "131072")
    assert not page.find_element(_by("ID"), "plan-result").is_displayed()


def test_json_schema_mode_answers_in_json(page: Any):
    page.find_element(_by("ID"), "set-json").click()  # the default schema: {"answer": integer}
    try:
        answer = shots.send_chat(page, "27+15 in JSON")
    finally:
        page.find_element(_by("ID"), "set-json").click()
    assert json.loads(answer["content"]) == {"answer": 42}


def test_phone_width_and_keyboard(page: Any):
    from selenium.webdriver.common.keys import Keys

    shots.resize(page, shots.PHONE)
    assert page.execute_script("return window.innerWidth") == shots.PHONE[0]
    for view in ("chat", "denoising", "planner"):
        shots.select_view(page, view)
        width = page.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"{view} overflows a phone-width window: {width}"
    tab = page.find_element(_by("ID"), "tab-planner")
    tab.send_keys(Keys.HOME)  # arrow keys, Home and End move between the views
    assert _focused(page).get_attribute("id") == "tab-chat"
    _focused(page).send_keys(Keys.ARROW_RIGHT)
    assert page.find_element(_by("ID"), "view-denoising").is_displayed()
    _focused(page).send_keys(Keys.END)
    assert page.find_element(_by("ID"), "view-planner").is_displayed()
    assert shots.send_chat(page, "Max of 3 8 1")["content"] == "8"


def test_a_server_dying_mid_stream_is_a_readable_message(page: Any, server: str):
    from selenium.webdriver.common.keys import Keys

    page.console_log.allowed_http_errors = True  # the broken stream and the refused connection are logged
    proxy = FaultyProxy(server).start()
    try:
        shots.open_console(page, proxy.url, API_KEY)
        proxy.mode = "break-stream"
        box = page.find_element(_by("ID"), "chat-input")
        box.send_keys("What is 27+15?", Keys.ENTER)
        problem = page.find_element(_by("ID"), "chat-problem")
        shots.wait(page, lambda d: problem.is_displayed())
        assert "The connection to the server broke before the answer finished" in problem.text
        assert box.get_property("value") == "What is 27+15?"  # ready to send again
        proxy.mode = "down"
        page.find_element(_by("ID"), "chat-send").click()
        shots.wait(page, lambda d: "Cannot reach the server" in problem.text)
        shots.wait(page, lambda d: "metrics unavailable" in d.find_element(_by("ID"), "m-status").text, 10)
        proxy.mode = "pass"
        assert shots.send_chat(page, "")["content"] == "42"  # the text waiting in the box
        assert not problem.is_displayed()
    finally:
        proxy.stop()
        shots.open_console(page, server, API_KEY)


@pytest.mark.parametrize("browser", [BROWSERS["chromium"]], indirect=True)  # through Chromium's DevTools
def test_screenshots_of_the_three_views(browser: Any, server: str, tmp_path: Path):
    made = shots.take_screenshots(browser, server, tmp_path, API_KEY)
    assert list(made) == ["chat", "denoising", "planner"]
    for view, path in made.items():
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        committed = ROOT / "docs" / "images" / path.name
        assert committed.is_file(), f"run `python scripts/console_screenshots.py` to add {committed}"
        assert committed.read_bytes()[16:20] == data[16:20], f"{view}: the docs' screenshot has another width"
