"""Screenshots of the web console's three views (chat, denoising, planner) for the docs, taken in headless
Chromium on a live `diffuserve serve` of the bundled model, and the browser helpers the console's browser tests
use (tests/server/test_console_browser.py runs `take_screenshots` too, so the pictures stay makeable).

    python scripts/console_screenshots.py             # writes docs/images/console-{chat,denoising,planner}.png
    python scripts/console_screenshots.py --out /tmp  # somewhere else

Needs Selenium and a Chromium with its driver (Debian: `apt-get install chromium chromium-driver`). Also prints
one JSON line: the page's load time and the chat round trip, as the browser measured them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
LAPTOP = (1280, 900)
PHONE = (390, 844)
CHAT_PROMPT, CHAT_ANSWER = "Sort 5 1 0 2 2 7", "0 1 2 2 5 7"
"""What the screenshots show the bundled model answering: a question it gets right (checked before any picture),
whose blocks take more than one denoising step (the denoising view's browser test needs one)."""
PLAN = {"model": "Clover-35B-A3B", "hardware": "H200", "context": "131072"}
WAIT_S = 60


def browser_problem() -> str | None:
    """Why no browser test can run here (None when Selenium, Chromium and its driver are all present)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'diffuserve[test]')"
    if chromium_binary() is None or shutil.which("chromedriver") is None:
        return "no Chromium with chromedriver (Debian: apt-get install chromium chromium-driver)"
    return None


def chromium_binary() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def start_browser(size: tuple[int, int] = LAPTOP) -> Any:
    """Headless Chromium with a fresh profile, its console log kept (driver.get_log("browser"))."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium_binary() or "chromium"
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='diffuserve-chromium-')}")
    options.add_argument(f"--window-size={size[0]},{size[1]}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or "chromedriver"))


def resize(driver: Any, size: tuple[int, int]) -> None:
    """The window at `size`. Chromium's window is never narrower than 500 px, so a narrower page (a phone's) is
    its DevTools' emulation there; FirefoxDriver lifts Firefox's own 500 px floor."""
    driver.set_window_size(*size)
    if hasattr(driver, "execute_cdp_cmd"):
        if size[0] < 500:
            metrics = {"width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": False}
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        else:
            driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def start_server(*flags: str) -> tuple[subprocess.Popen, str]:
    """`diffuserve serve` of the bundled model on a free port, once it answers /health: (process, base url). Its
    output goes to a file (a pipe nobody reads would fill up and stall it)."""
    command = [sys.executable, "-m", "diffuserve", "serve", "--port", "0", "--uvicorn-log-level", "warning", *flags]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    log = Path(tempfile.mkstemp(prefix="diffuserve-serve-", suffix=".log")[1])
    with log.open("w") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while True:  # the usage hint names the port: "curl -s http://127.0.0.1:PORT/v1/..."
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", log.read_text())
        if match:
            break
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(process)
            raise RuntimeError(f"diffuserve serve did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    url = f"http://127.0.0.1:{match.group(1)}"
    while not _healthy(url):  # the hint comes just before uvicorn starts
        time.sleep(0.1)
    return process, url


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def stop_server(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait(driver: Any, condition: Any, timeout: float = WAIT_S) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def open_console(driver: Any, url: str, api_key: str | None = None) -> None:
    """Loads the page (signing in with `api_key` when the server has one) and waits until it is set up."""
    from selenium.webdriver.common.by import By

    driver.get(url + "/")
    if api_key is not None and driver.find_elements(By.ID, "key"):
        driver.find_element(By.ID, "key").send_keys(api_key)
        driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait(driver, lambda d: d.execute_script("return document.body.dataset.ready === 'true'"))


def select_view(driver: Any, name: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, f"tab-{name}").click()


def send_chat(driver: Any, text: str) -> dict[str, Any]:
    """Types `text`, sends it with Enter, waits for the answer: {"content", "meta", "seconds"}."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    select_view(driver, "chat")
    before = len(driver.find_elements(By.CSS_SELECTOR, ".message.assistant"))
    box = driver.find_element(By.ID, "chat-input")
    box.send_keys(text, Keys.ENTER)
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".message.assistant:not(.streaming)")) > before)
    reply = driver.find_elements(By.CSS_SELECTOR, ".message.assistant")[-1]
    meta = reply.find_element(By.CSS_SELECTOR, ".meta")
    seconds = meta.get_attribute("data-seconds")
    return {
        "content": reply.find_element(By.CSS_SELECTOR, ".content").text,
        "meta": meta.text,
        "seconds": float(seconds) if seconds else None,
    }


def plan(driver: Any, model: str, hardware: str, context: str) -> str:
    """Plans on the planner page; returns the "sequences that fit" figure as shown (or the problem shown)."""
    from selenium.webdriver.common.by import By

    select_view(driver, "planner")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#plan-model option"))
    for select, value in (("plan-model", model), ("plan-hardware", hardware)):  # as a person picks: a click
        driver.find_element(By.CSS_SELECTOR, f"#{select} option[value='{value}']").click()
    field = driver.find_element(By.ID, "plan-context")
    field.clear()
    field.send_keys(context)
    driver.execute_script("document.getElementById('plan-result').hidden = true")
    driver.find_element(By.ID, "plan-submit").click()
    shown = wait(
        driver,
        lambda d: next(
            (
                d.find_element(By.ID, i)
                for i in ("plan-result", "plan-problem")
                if d.find_element(By.ID, i).is_displayed()
            ),
            None,
        ),
    )
    return shown.text if shown.get_attribute("id") == "plan-problem" else driver.find_element(By.ID, "plan-fit").text


def page_load_ms(driver: Any) -> float:
    """The last navigation's start to its load event, in milliseconds (Navigation Timing)."""
    return float(
        driver.execute_script(
            "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd - n.startTime;"
        )
    )


def take_screenshots(driver: Any, url: str, out: Path, api_key: str | None = None) -> dict[str, Path]:
    """The three views at laptop width, after one chat answer and one plan: {view: PNG path}."""
    out.mkdir(parents=True, exist_ok=True)
    resize(driver, LAPTOP)
    open_console(driver, url, api_key)
    reply = send_chat(driver, CHAT_PROMPT)
    if reply["content"].strip() != CHAT_ANSWER:
        raise RuntimeError(
            f"console_screenshots: {CHAT_PROMPT!r} was answered {reply['content']!r}, not {CHAT_ANSWER!r}"
        )
    shots = {}
    for view in ("chat", "denoising", "planner"):
        if view == "planner":
            plan(driver, **PLAN)
        else:
            select_view(driver, view)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        metrics = {"width": LAPTOP[0], "height": max(LAPTOP[1], height), "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)  # the whole view in one picture
        shots[view] = out / f"console-{view}.png"
        driver.save_screenshot(str(shots[view]))
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return shots


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images", help="folder for the PNGs")
    args = parser.parse_args()
    problem = browser_problem()
    if problem:
        print(f"console_screenshots: {problem}", file=sys.stderr)
        return 1
    process, url = start_server()
    driver = start_browser()
    try:
        shots = take_screenshots(driver, url, args.out)
        open_console(driver, url)
        load_ms = page_load_ms(driver)
        answer = send_chat(driver, "What is 27+15?")
    finally:
        driver.quit()
        stop_server(process)
    for path in shots.values():
        print(f"wrote {path}")
    print(
        json.dumps(
            {"page_load_ms": round(load_ms, 1), "chat_round_trip_s": answer["seconds"], "answer": answer["content"]}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
