"""Elements from a browser page's own DOM: exact geometry and names, no OCR.

When the caller has the live page (Playwright, sync or async; duck-typed, Playwright is
never imported), its DOM knows what the pixels only suggest: where each input, button,
checkbox and link is, and what it is called (its ``<label>``, ``aria-label`` or
``aria-labelledby``, placeholder, title, value or text). :func:`page_elements` reads the
visible ones in one ``page.evaluate`` call and returns them as layout
:class:`~clef_engine.backbones.vision.layout.Element` s, so the box head ranks them the
same way it ranks elements read from a screenshot. An element hidden behind another (a
modal, a cookie banner) is left out: the point at its centre must hit it.

Example:
    >>> evidence = page_evidence(page)          # a Playwright page on a sign-in form
    >>> [e.label for e in evidence.elements if e.role == "field"]
    ['Email address', 'password']
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from clef_engine.backbones.vision.layout import Element, ImageEvidence, _attach_labels

MAX_ELEMENTS = 600
"""Elements read from one page (controls first, then headings and short texts)."""

_JS = """([fullPage, limit]) => {
  const vw = window.innerWidth, vh = window.innerHeight;
  const sx = fullPage ? window.scrollX : 0, sy = fullPage ? window.scrollY : 0;
  const clean = s => (s || "").replace(/\\s+/g, " ").trim().slice(0, 120);
  const byIds = ids => clean((ids || "").split(/\\s+/).map(
    id => { const n = document.getElementById(id); return n ? n.innerText || n.textContent : ""; }
  ).join(" "));
  const roleOf = e => {
    const r = (e.getAttribute("role") || "").toLowerCase(), t = e.tagName.toLowerCase();
    const type = (e.getAttribute("type") || "text").toLowerCase();
    if (["checkbox", "radio", "switch"].includes(r)) return "checkbox";
    if (["textbox", "searchbox", "combobox"].includes(r)) return "field";
    if (["button", "tab", "menuitem"].includes(r)) return "button";
    if (r === "link") return "link";
    if (t === "input") {
      if (type === "checkbox" || type === "radio") return "checkbox";
      if (["submit", "button", "reset", "image"].includes(type)) return "button";
      if (type === "hidden") return null;
      return "field";
    }
    if (t === "textarea" || t === "select" || e.isContentEditable) return "field";
    if (t === "button" || t === "summary") return "button";
    if (t === "a" && e.hasAttribute("href")) return "link";
    if (/^h[1-6]$/.test(t)) return "heading";
    if (t === "label") return "text";
    return "text";
  };
  const ownText = e => {
    let s = "";
    for (const n of e.childNodes) if (n.nodeType === 3) s += n.textContent;
    return clean(s);
  };
  const controls = "input,textarea,select,button,summary,a[href],[role],[contenteditable=true]";
  const texts = "h1,h2,h3,h4,h5,h6,label,p,span,div,li,td,th,dt,dd,strong,b,em,small";
  const seen = new Set(), out = [];
  const add = (e, isControl) => {
    if (seen.has(e) || out.length >= limit) return;
    seen.add(e);
    const role = roleOf(e);
    if (!role) return;
    if (!isControl && role !== "heading" && !ownText(e)) return;
    const st = getComputedStyle(e);
    if (st.visibility === "hidden" || st.display === "none" || Number(st.opacity) === 0) return;
    let r = e.getBoundingClientRect();
    // Zero-sized (a custom checkbox hides its input; its label stays, as text).
    if (r.width < 2 || r.height < 2) return;
    const cx = Math.min(vw - 1, Math.max(0, r.left + r.width / 2));
    const cy = Math.min(vh - 1, Math.max(0, r.top + r.height / 2));
    if (r.bottom <= 0 || r.top >= vh || r.right <= 0 || r.left >= vw) { if (!fullPage) return; }
    else {
      const hit = document.elementFromPoint(cx, cy);
      const labels = e.labels ? Array.from(e.labels) : [];
      if (hit && hit !== e && !e.contains(hit) && !hit.contains(e) &&
          !labels.some(l => l === hit || l.contains(hit))) return;
    }
    const labelText = clean([
      e.getAttribute("aria-label"), byIds(e.getAttribute("aria-labelledby")),
      ...(e.labels ? Array.from(e.labels).map(l => l.innerText) : []),
    ].filter(Boolean).join(" "));
    const tag = e.tagName.toLowerCase();
    const type = (e.getAttribute("type") || "").toLowerCase();
    let text;
    if (tag === "input" || tag === "textarea") {
      text = ["submit", "button", "reset"].includes(type) ? clean(e.value) :
        clean(e.value || e.getAttribute("placeholder") || "");
    } else if (tag === "select") {
      text = clean(e.options[e.selectedIndex] ? e.options[e.selectedIndex].text : "");
    } else {
      text = isControl ? clean(e.innerText || e.textContent) : ownText(e) || clean(e.innerText);
    }
    const extra = clean([e.getAttribute("title"), e.getAttribute("alt"),
      !labelText && !text ? (e.getAttribute("name") || e.id || "") : ""].join(" "));
    out.push({role, text, label: clean([labelText, extra].join(" ")), type,
      box: [r.left + sx, r.top + sy, r.right + sx, r.bottom + sy]});
  };
  document.querySelectorAll(controls).forEach(e => add(e, true));
  document.querySelectorAll(texts).forEach(e => add(e, false));
  const w = fullPage ? document.documentElement.scrollWidth : vw;
  const h = fullPage ? document.documentElement.scrollHeight : vh;
  return {width: w, height: h, elements: out};
}"""


def _to_evidence(raw: Mapping[str, Any]) -> ImageEvidence:
    width, height = max(1, int(raw["width"])), max(1, int(raw["height"]))
    elements = []
    for item in raw.get("elements", []):
        left, top, right, bottom = (float(v) for v in item["box"])
        box = (max(0.0, left), max(0.0, top), min(float(width), right), min(float(height), bottom))
        if box[2] - box[0] < 1 or box[3] - box[1] < 1:
            continue
        role = str(item["role"])
        text, label = str(item.get("text") or ""), str(item.get("label") or "")
        kind = str(item.get("type") or "")
        if (
            role == "field"
            and kind in ("password", "email", "search")
            and kind not in (f"{label} {text}".lower())
        ):
            label = f"{label} {kind}".strip()  # an unlabelled password input is still one
        if role == "link":
            role = "text" if not text else "link"
        elements.append(Element(text, box, box, role, 1.0, label or None))
    # A field without a <label for> or aria name is named by the text beside it, as on
    # a screenshot ("Work email" above an input whose placeholder is "you@company.com").
    return ImageEvidence("dom", width, height, _attach_labels(elements), source="dom")


def page_evidence(page: Any, *, full_page: bool = False) -> ImageEvidence:
    """The visible elements of a sync Playwright page, in CSS pixels of its viewport (or of
    the whole document with ``full_page``), as evidence the box head reads."""
    if inspect.iscoroutinefunction(page.evaluate):
        raise TypeError("an async Playwright page: use `await apage_evidence(page)`")
    return _to_evidence(page.evaluate(_JS, [full_page, MAX_ELEMENTS]))


async def apage_evidence(page: Any, *, full_page: bool = False) -> ImageEvidence:
    """Async :func:`page_evidence` (async Playwright pages; sync ones are accepted too)."""
    raw = page.evaluate(_JS, [full_page, MAX_ELEMENTS])
    return _to_evidence(await raw if inspect.isawaitable(raw) else raw)


def has_dom(page: Any) -> bool:
    """Whether ``page`` can be asked for its DOM (a Playwright ``Page``: ``evaluate``)."""
    return callable(getattr(page, "evaluate", None))
