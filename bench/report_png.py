"""Render a run's HTML report to PNG with headless Chromium, for visual review (and the README's picture).

    python bench/report_png.py [RUN] [--out docs/images/report.png] [--crop 2400]

RUN defaults to runs/quickstart (`smelt quickstart` makes it). Writes RUN/report.html, the whole page as
RUN/report.png, and `--out`: the top `--crop` pixels of the page, reduced to a 256-colour palette so it
stays small enough for a README. Needs Debian's `chromium` package (`apt-get install chromium`); Pillow
(installed with the tensorboard extra) trims the empty bottom of the page and makes the palette image.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import write_result

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(browser: str, html: Path, png: Path, width: int, height: int) -> None:
    command = [
        browser,
        "--headless",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={width},{height}",
        f"--screenshot={png}",
        html.resolve().as_uri(),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    if result.returncode != 0 or not png.is_file():
        raise SystemExit(f"chromium failed (exit {result.returncode}):\n{result.stderr[-2000:]}")


def trim_and_crop(full: Path, out: Path, crop: int) -> tuple[int, int]:
    """Trim the white bottom of the full page in place; write its top `crop` pixels as a palette PNG."""
    try:
        from PIL import Image, ImageOps
    except ImportError:
        print("Pillow is not installed: the PNG is left untrimmed and --out is a copy of the full page")
        shutil.copyfile(full, out)
        return 0, 0
    image = Image.open(full).convert("RGB")
    box = ImageOps.invert(image).getbbox()  # the bounding box of everything that is not white
    if box:
        image = image.crop((0, 0, image.width, min(image.height, box[3] + 24)))
        image.save(full, optimize=True)
    top = image.crop((0, 0, image.width, min(crop, image.height)))
    top.convert("P", palette=Image.Palette.ADAPTIVE, colors=256).save(out, optimize=True)
    return image.size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "run", nargs="?", default="runs/quickstart", help="run directory (default: runs/quickstart)"
    )
    parser.add_argument("--out", default="docs/images/report.png", help="the cropped picture for the docs")
    parser.add_argument("--crop", type=int, default=2400, help="height in pixels of the cropped picture")
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--height", type=int, default=16000, help="window height: taller than the page")
    args = parser.parse_args()

    run = Path(args.run)
    if not run.is_dir():
        print(f"no run at {run}: run `smelt quickstart` first, or pass a run directory.", file=sys.stderr)
        return 2
    browser = find_browser()
    if browser is None:
        print(
            "headless Chromium is not installed (looked for " + ", ".join(BROWSERS) + "). On Debian or "
            "Ubuntu: `sudo apt-get install chromium`; then rerun this script. The HTML report itself "
            "needs no browser to be written.",
            file=sys.stderr,
        )
        return 1
    from smelt.report.single import write_run_report

    started = time.perf_counter()
    html = write_run_report(run)
    build_s = time.perf_counter() - started
    full, out = run / "report.png", Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    screenshot(browser, html, full, args.width, args.height)
    shot_s = time.perf_counter() - started
    width, height = trim_and_crop(full, out, args.crop)
    version = subprocess.run([browser, "--version"], capture_output=True, text=True).stdout.strip()
    write_result(
        "report_png",
        {
            "report_html_kb": round(html.stat().st_size / 1024, 1),
            "report_build_s": round(build_s, 3),
            "screenshot_s": round(shot_s, 2),
            "page_png_width_px": width,
            "page_png_height_px": height,
            "page_png_kb": round(full.stat().st_size / 1024, 1),
            "docs_png_kb": round(out.stat().st_size / 1024, 1),
            "browser": version,
            "report": str(html),
            "page_png": str(full),
            "docs_png": str(out),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
