"""Make docs/index-verdict.png, the README's picture: the verdict at the top of a run's index.

    make screenshot            (after `make run`; the same as the line below)
    python docs/screenshot.py outputs/default [--out docs/index-verdict.png]

Opens the run's index.html in Debian's chromium through playwright (the test extra installs
playwright; no browser is downloaded) and photographs the page from its title to the end of the
verdict section, at 1200 pixels wide. The picture names the run it shows in a PNG text chunk
("Source": the params file, when the run started and on which machine, from its run.json), so a
picture not made from a run by this script is told apart (tests/system/test_report_browser.py)."""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import zlib
from pathlib import Path

SOURCE = "Source"  # the PNG text chunk's keyword that names the run


def source(run_dir: Path) -> str:
    """The run a picture of `run_dir`'s index shows, in words, from its run.json."""
    run = json.loads((run_dir / "run.json").read_text())
    return f"spire run of {run['params_file']}, started {run['started']}, on {run['machine']}"


def with_text(png: bytes, keyword: str, text: str) -> bytes:
    """`png` with a tEXt chunk (`keyword`, `text`, Latin-1) after its header chunk."""
    data = keyword.encode("latin-1") + b"\0" + text.encode("latin-1", "replace")
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data + struct.pack(">I", zlib.crc32(b"tEXt" + data))
    end = 8 + 4 + 4 + 13 + 4  # signature, then IHDR: length, type, 13 bytes, CRC
    return png[:end] + chunk + png[end:]


def text_chunks(png: bytes) -> dict[str, str]:
    """A PNG's tEXt chunks, keyword -> text."""
    out, at = {}, 8
    while at < len(png):
        (length,), kind = struct.unpack(">I", png[at:at + 4]), png[at + 4:at + 8]
        if kind == b"tEXt":
            keyword, _, text = png[at + 8:at + 8 + length].partition(b"\0")
            out[keyword.decode("latin-1")] = text.decode("latin-1")
        at += 12 + length
    return out


def screenshot(run_dir: Path, out: Path, width: int = 1200) -> Path:
    from playwright.sync_api import sync_playwright

    index = (run_dir / "index.html").resolve()
    if not index.exists() or not (run_dir / "run.json").exists():
        raise FileNotFoundError(f"no index.html and run.json in {run_dir}: run `spire run` (or `make run`) first")
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
        png = page.screenshot(clip={"x": 0, "y": 0, "width": width, "height": min(bottom, 640)})
        browser.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(with_text(png, SOURCE, source(run_dir)))
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
