"""Render the held-out set of real template pages from their npm packages.

The pages are open-source HTML templates (admin dashboards, shops, blogs) that were never
written for this project. ``benchmarks/data/template_pages/manifest.json`` names each page:
the npm package, its pinned version and licence (MIT or Apache-2.0), the page file in the
package, the page type written by hand, the split (``tune``: prototypes may be checked
against it; ``heldout``: only ever measured), and a few element targets (a CSS selector and
the instructions a browser agent would give a ``box`` question).

This script fetches each package with ``npm pack`` (the npm registry, nothing else), checks
its licence, and screenshots every page in the system Chromium at 1280x800. Pages are
served from the unpacked package under a fake host per package, so root-relative asset
paths (``/assets/main.css``) resolve. A package whose pages load their libraries from
``node_modules/`` (as after ``npm install`` in its folder) names them, pinned and licence
checked like the package, under ``node_modules`` in its manifest entry; each is fetched the
same way and served at ``node_modules/<name>/``. A page that loads a stylesheet, a
library or an icon font from a CDN gets it only where its entry maps that exact URL to a
file of the package or of its ``node_modules`` (``cdn``; such a package's pages lose their
``integrity`` hashes, which name the CDN's bytes). Every other request (web fonts, CDNs,
analytics) is aborted, as in a sandboxed browser agent. Each page gets
``<id>.png`` and the targets' boxes in ``targets.json``.

Run:  python benchmarks/template_pages.py [--cache /tmp/clef-templates]
      [--split heldout] [--package NAME] [--only ID-PART] [--manifest PATH]
Then: python benchmarks/vision_screenshots.py   (reads the renders)

With a filter, only the chosen pages are rendered (and only their packages fetched); their
entries are merged into the existing ``targets.json``, which is replaced in one rename, so
renders of other pages are left as they are for whoever is reading them.
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import re
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
    """The manifest: ``{"packages": {name: {version, licence, root, ...}}, "pages": [...]}``."""
    return json.loads(path.read_text())


def _slug(package: str) -> str:
    return package.replace("@", "").replace("/", "-")


def declared_licence(meta: dict[str, Any]) -> str | None:
    """The licence a ``package.json`` declares: its ``license`` string, or the ``type`` of
    the older forms (``"license": {"type": ...}`` and a ``"licenses"`` list of one entry);
    ``None`` when it declares none or several."""
    found = meta.get("license")
    if found is None and isinstance(meta.get("licenses"), list) and len(meta["licenses"]) == 1:
        found = meta["licenses"][0]
    if isinstance(found, dict):
        found = found.get("type")
    return found if isinstance(found, str) else None


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
    found = declared_licence(meta)
    if found != licence or licence not in LICENCES:
        raise SystemExit(f"{package}@{version}: licence {found!r}, manifest says {licence!r}")
    if meta.get("version") != version:
        raise SystemExit(f"{package}: version {meta.get('version')} != {version}")
    return target / "package"


def _sources(name: str, spec: dict[str, Any], cache: Path) -> dict[str, Path]:
    """URL path prefix -> folder it is served from: the package, then its ``node_modules``."""
    sources = {"": fetch(name, spec["version"], spec["licence"], cache) / spec.get("root", "")}
    for dep, pin in spec.get("node_modules", {}).items():
        sources[f"node_modules/{dep}/"] = fetch(dep, pin["version"], pin["licence"], cache)
    return sources


def _resolve(sources: dict[str, Path], want: str) -> Path | None:
    """The file a URL path names under ``sources`` (URL prefix -> folder, the longest
    prefix wins), or ``None``: no such file, or a path that leaves its folder."""
    want = want.lstrip("/")
    prefix = max((p for p in sources if want.startswith(p)), key=len, default=None)
    if prefix is None:
        return None
    root = sources[prefix].resolve()
    path = (root / want[len(prefix) :]).resolve()
    return path if path.is_file() and root in path.parents else None


def select(
    manifest: dict[str, Any],
    only: str | None = None,
    split: str | None = None,
    package: str | None = None,
) -> list[dict[str, Any]]:
    """The manifest's pages whose id contains ``only``, of ``split`` and from ``package``."""
    if package and package not in manifest["packages"]:
        raise SystemExit(f"--package {package!r} is not in the manifest")
    return [
        spec
        for spec in manifest["pages"]
        if (not only or only in spec["id"])
        and (not split or spec["split"] == split)
        and (not package or spec["package"] == package)
    ]


def render(
    manifest: dict[str, Any],
    cache: Path,
    out: Path,
    only: str | None = None,
    split: str | None = None,
    package: str | None = None,
) -> None:
    """Screenshot the manifest's pages into ``out`` (PNG + ``targets.json``).

    Args:
        manifest: The parsed manifest (see :func:`load_manifest`).
        cache: Folder for the ``npm pack`` tarballs and their unpacked trees.
        out: Folder for ``<id>.png`` and ``targets.json``.
        only: Render only pages whose id contains this.
        split: Render only pages of this split (``tune`` or ``heldout``).
        package: Render only pages of this npm package.
    """
    pages = select(manifest, only, split, package)
    if not pages:
        raise SystemExit("no page of the manifest matches the filters")
    wanted = {spec["package"] for spec in pages}
    hosts = {
        f"{_slug(name)}.{HOST}": _sources(name, spec, cache)
        for name, spec in manifest["packages"].items()
        if name in wanted
    }

    # A CDN URL a package maps to one of its own files: served as if asked for that file.
    cdn = {
        url: (f"{_slug(name)}.{HOST}", path)
        for name, spec in manifest["packages"].items()
        if name in wanted
        for url, path in spec.get("cdn", {}).items()
    }
    for url, (host, path) in cdn.items():
        if _resolve(hosts[host], path) is None:
            raise SystemExit(f"cdn {url}: {path} is not a file of its package")
    mapped = {host for host, _ in cdn.values()}

    def serve(route: Any) -> None:
        url = urlsplit(route.request.url)
        host, want = cdn.get(route.request.url, (url.hostname or "", unquote(url.path)))
        path = _resolve(hosts.get(host, {}), want)
        if path is None:
            route.abort()
            return
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        body = path.read_bytes()
        # A page asks a CDN for its file cross-origin; its own files are served as before.
        headers = {"Access-Control-Allow-Origin": "*"} if route.request.url in cdn else {}
        if mime == "text/html" and host in mapped:
            # The mapped file is the package's build of the CDN's file, not the same bytes:
            # drop the page's subresource-integrity hashes, or Chromium refuses it.
            body = re.sub(rb"""\sintegrity=(?:"[^"]*"|'[^']*')""", b"", body)
        route.fulfill(status=200, body=body, content_type=mime, headers=headers)

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
        for spec in pages:
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
    partial = len(pages) < len(manifest["pages"])
    merged = json.loads(targets.read_text()) if partial and targets.is_file() else {}
    merged.update(boxes)
    tmp = targets.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(merged, indent=1) + "\n")
    tmp.replace(targets)  # one rename: a reader never sees a half-written file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/clef-templates"))
    parser.add_argument("--out", type=Path, default=DATA / "renders")
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help="manifest to render")
    parser.add_argument("--only", default=None, help="render only page ids containing this")
    parser.add_argument("--split", default=None, help="render only pages of this split")
    parser.add_argument("--package", default=None, help="render only pages of this package")
    args = parser.parse_args()
    if find_chromium() is None:
        raise SystemExit("no Chromium found: apt-get install chromium")
    render(load_manifest(args.manifest), args.cache, args.out, args.only, args.split, args.package)


if __name__ == "__main__":
    main()
