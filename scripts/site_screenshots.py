"""Screenshots of the documentation site for its own "The documentation" page: the site built with
`mkdocs build --strict` into a temporary folder, served there by Python's http.server on a free port, and three pages
(getting started, a model page, a benchmark page) taken in headless Chromium at a laptop's window size.

    python scripts/site_screenshots.py             # writes docs/images/site-{getting-started,model,benchmark}.png
    python scripts/site_screenshots.py --out /tmp  # somewhere else

Needs the `docs` extra (mkdocs, Material, mkdocstrings) and the browser scripts/console_screenshots.py drives
(Selenium, Chromium and chromedriver). Knows nothing of the pages' content beyond their paths (PAGES).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # scripts.console_screenshots: the browser helpers, beside this script

from scripts.console_screenshots import LAPTOP, browser_problem, start_browser  # noqa: E402

PAGES = {
    "site-getting-started.png": "getting-started/",
    "site-model.png": "models/clover/",
    "site-benchmark.png": "benchmarks/throughput/",
}
"""Screenshot file -> the page's path in the built site."""


def build_site(site_dir: Path) -> None:
    """`mkdocs build --strict` of this checkout into `site_dir`; a warning (a broken link) stops it."""
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site_dir)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if build.returncode != 0:
        raise SystemExit(f"site_screenshots: mkdocs build failed:\n{build.stderr[-2000:]}")


@contextlib.contextmanager
def serve(site_dir: Path) -> Iterator[str]:
    """The built site over HTTP on a free local port, for the duration of the block: its base url."""
    handler = functools.partial(QuietHandler, directory=str(site_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # one line per request would bury the output
        pass


def take_screenshots(out: Path) -> list[Path]:
    """Builds, serves and photographs the PAGES into `out`; returns the files written."""
    problem = browser_problem()
    if problem is not None:
        raise SystemExit(f"site_screenshots: {problem}")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="diffuserve-site-") as site:
        build_site(Path(site))
        with serve(Path(site)) as url:
            driver = start_browser(LAPTOP)
            try:
                for name, path in PAGES.items():
                    driver.get(url + path)
                    driver.execute_script("return document.fonts.ready")  # system fonts: nothing is fetched
                    driver.save_screenshot(str(out / name))
                    written.append(out / name)
            finally:
                driver.quit()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images", help="folder to write the PNGs to")
    args = parser.parse_args(argv)
    for path in take_screenshots(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
