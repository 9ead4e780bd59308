"""The inspector's main pages as small PNGs for the docs, taken by the headless Chromium the browser tests
use, over the sample run (`devtools.sample_run`) and a LoCoMo benchmark run built in a temporary folder.

    python -m devtools.screenshots --out docs/img      (`make inspect-screenshots`)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from urllib.parse import quote

COLORS = 96  # a palette this small keeps each page a few tens of kB and reads the same


def save(driver, path: Path) -> None:
    from io import BytesIO

    from PIL import Image

    image = Image.open(BytesIO(driver.get_screenshot_as_png())).convert("RGB")
    image.quantize(COLORS, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(f"{path} ({path.stat().st_size // 1024} kB)")


def take(base: str, driver, out: Path, user: str, record_id: str) -> None:
    from selenium.webdriver import ActionChains

    def shot(name: str, path: str, action=None) -> None:
        driver.get(base + path)
        if action:
            action()
        save(driver, out / f"inspect-{name}.png")

    def pin_record() -> None:
        record = driver.find_elements("css selector", "#records .record")[1]
        ActionChains(driver).move_to_element(record).click().perform()

    def first_window() -> str:
        driver.get(f"{base}/s/2/windows?order=worst")
        return driver.find_element("css selector", "#windows tbody td a").get_attribute("href")

    shot("datagen-report", "/s/0")
    shot("datagen-windows", "/s/0/jobs?task=extract")
    shot("datagen-window", "/s/0/job?id=" + quote("toy-0001/w0002"), pin_record)
    shot("eval-run", "/s/2")
    shot("eval-window", first_window().removeprefix(base))
    shot("compare", "/compare?a=1&b=2")
    shot("store-search", f"/s/3/search?u=toy-0000&q={quote('Where does Jonas live now')}")
    shot("store-record", f"/s/3/record?u={quote(user)}&id={quote(record_id)}")
    shot("locomo-window", "/s/4/window?id=" + quote("conv-26/w0001"))


def locomo_run(root: Path) -> str:
    """The rule extractor scored against LoCoMo's annotations of one conversation (the thresholds the
    benchmark fits on locomo10.json, given, so no fit runs here)."""
    from eval.cli import main as eval_main

    out = root / "locomo-rule"
    args = ["extraction", "--benchmark", "locomo", "--conversations", "conv-26", "--extractor", "turns"]
    args += ["--set", "locomo.thresholds={cosine: 0.64, token_f1: 0.3}", "--out", str(out)]
    if eval_main(args) != 0:
        raise SystemExit("the LoCoMo benchmark run failed (see above)")
    return str(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img", help="folder for the PNGs")
    args = parser.parse_args(argv)
    from devtools.browser import chromium, served
    from devtools.sample_run import build
    from inspector.cli import open_all
    from inspector.config import InspectConfig

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        paths, store = build(Path(root))
        config = InspectConfig(index_dir=str(Path(root) / "index"), page_size=15)
        paths.append(locomo_run(Path(root)))  # source 4
        driver = chromium(1200, 760)
        try:
            with served(open_all(paths, config), config) as base:
                take(base, driver, out, store["user"], store["edited"]["id"])
        finally:
            driver.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
