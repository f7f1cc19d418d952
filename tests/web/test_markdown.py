"""The Markdown renderer (web/markdown.js) in the real browser: what it renders, and that no
input can make it produce an element or attribute of its own (script, handlers, bad links).

Run: .venv/bin/python -m pytest tests/web/test_markdown.py
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.model, pytest.mark.browser]

ALLOWED_TAGS = {"P", "BR", "STRONG", "EM", "DEL", "CODE", "PRE", "SPAN", "UL", "OL", "LI", "BLOCKQUOTE", "HR",
                "H3", "H4", "H5", "H6", "A"}
ALLOWED_ATTRIBUTES = {"href", "target", "rel", "class", "start"}
HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    "<svg/onload=alert(1)>",
    '"><img src=x onerror=alert(1)>',
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x](data:text/html,<script>alert(1)</script>)",
    "[x](vbscript:msgbox(1))",
    '[x](https://a.example/" onmouseover="alert(1))',
    "[x](https://a.example/\"onmouseover=alert(1)//)",
    "[<img src=x onerror=alert(1)>](https://a.example)",
    "![x](https://a.example/x.png)",
    "`<script>alert(1)</script>`",
    "```\n</code></pre><script>alert(1)</script>\n```",
    "```<script>\nx\n```",
    "**<b onmouseover=alert(1)>x</b>**",
    "- <iframe src=javascript:alert(1)>",
    "> <object data=javascript:alert(1)>",
    "# <style>*{display:none}</style>",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
    "\u0000<script>\u00000\u0000",
    "<a href=javascript:alert(1)>x</a>",
    "1. <math><mi xlink:href=javascript:alert(1)>x</mi></math>",
]
RENDER = """async (sources) => {
    const { renderMarkdown } = await import('/markdown.js');
    return sources.map((source) => {
        const box = document.createElement('div');
        box.innerHTML = renderMarkdown(source);
        return {
            html: box.innerHTML,
            text: box.textContent,
            tags: [...box.querySelectorAll('*')].map((e) => e.tagName),
            attributes: [...box.querySelectorAll('*')].flatMap((e) => e.getAttributeNames()),
            hrefs: [...box.querySelectorAll('a')].map((a) => a.getAttribute('href')),
        };
    });
}"""


@pytest.fixture(scope="module")
def page(browser, server):
    context = browser.new_context(base_url=server.url)
    page = context.new_page()
    page.goto("/healthz")  # any page of the server: the module is imported from its origin
    yield page
    context.close()


def render(page, *sources: str) -> list[dict]:
    return page.evaluate(RENDER, list(sources))


def test_hostile_input_renders_as_text(page):
    for source, out in zip(HOSTILE, render(page, *HOSTILE)):
        assert set(out["tags"]) <= ALLOWED_TAGS, (source, out["html"])
        assert set(out["attributes"]) <= ALLOWED_ATTRIBUTES, (source, out["html"])
        assert all(h.startswith(("https://", "http://", "mailto:")) for h in out["hrefs"]), (source, out["html"])
        assert '"' not in "".join(out["hrefs"]), (source, out["html"])
    img, script = render(page, HOSTILE[0], HOSTILE[1])
    assert img["text"] == "<img src=x onerror=alert(1)>" and script["text"] == "<script>alert(1)</script>"


def test_markdown_renders(page):
    out = render(page, "Some **bold**, *italic*, ~~gone~~ and `a < b`.",
                 "```python\nif a < b:\n    print('<hi>')\n```",
                 "- one\n- two\n  - nested\n\n3. three\n4. four",
                 "# Title\n\n> quoted\n\n---\n[docs](https://example.org/a_b?x=1&y=2) mail [me](mailto:a@b.c)",
                 "snake_case_names stay_as_they_are")
    inline, code, lists, blocks, words = out
    assert inline["html"] == ("<p>Some <strong>bold</strong>, <em>italic</em>, <del>gone</del> and "
                              "<code>a &lt; b</code>.</p>")
    assert code["tags"] == ["PRE", "SPAN", "CODE"] and "print('<hi>')" in code["text"]
    assert lists["tags"].count("LI") == 5 and lists["tags"].count("UL") == 2 and lists["tags"].count("OL") == 1
    assert 'start="3"' in lists["html"]
    assert blocks["tags"][:2] == ["H3", "BLOCKQUOTE"] and "HR" in blocks["tags"]
    assert blocks["hrefs"] == ["https://example.org/a_b?x=1&y=2", "mailto:a@b.c"]
    assert words["tags"] == ["P"] and words["text"] == "snake_case_names stay_as_they_are"


def test_an_unfinished_stream_renders(page):
    # mid-answer the text may stop anywhere: an open fence, half a link, a lone star
    for source in ["```py\nx = 1", "[half](https://exa", "**bold", "- item\n  con", "`code"]:
        (out,) = render(page, source)
        assert out["text"].strip(), source
        assert set(out["tags"]) <= ALLOWED_TAGS
