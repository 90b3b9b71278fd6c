"""Make docs/index-verdict.png, the README's picture: the verdict at the top of a run's index.

    python docs/screenshot.py outputs/default [--out docs/index-verdict.png]

Opens the run's index.html in Debian's chromium through playwright (the test extra installs
playwright; no browser is downloaded) and photographs the page from its title to the end of the
verdict section, at 1200 pixels wide."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def screenshot(run_dir: Path, out: Path, width: int = 1200) -> Path:
    from playwright.sync_api import sync_playwright

    index = (run_dir / "index.html").resolve()
    if not index.exists():
        raise FileNotFoundError(f"no index.html in {run_dir}: run `spire run` (or `make run`) first")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise FileNotFoundError("chromium not found: apt-get install chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": width, "height": 900}, device_scale_factor=1)
        page.goto(index.as_uri())
        # The verdict runs from its heading to the next section's heading.
        bottom = page.evaluate("""() => {
            const verdict = document.getElementById('verdict');
            let node = verdict.nextElementSibling;
            while (node && node.tagName !== 'H2') node = node.nextElementSibling;
            return node ? node.getBoundingClientRect().top + window.scrollY : document.body.scrollHeight;
        }""")
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), clip={"x": 0, "y": 0, "width": width, "height": min(bottom, 640)})
        browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run's output folder, e.g. outputs/default")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "index-verdict.png")
    args = parser.parse_args(argv)
    try:
        print(screenshot(args.run_dir, args.out))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
