// A small, safe Markdown renderer for model output: every piece of source text is
// HTML-escaped before any markup is added, so nothing the model says can become an
// element or an attribute of its own. Handles fenced code, inline code, headings,
// bold/italic, lists, block quotes, rules and links (http, https and mailto only).
// Images are not rendered: `![alt](url)` stays text. Unclosed fences (mid-stream)
// render as code up to the end.

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const SAFE_URL = /^(https?:\/\/|mailto:)[^\s]*$/i;
const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const MARK = "\u0000"; // placeholders for finished HTML; stripped from the source first

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

export function renderMarkdown(source) {
  const lines = String(source).replaceAll(MARK, "").replace(/\r\n?/g, "\n").split("\n");
  const html = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) {
      i += 1;
    } else if ((m = line.match(FENCE))) {
      const end = closingFence(lines, i + 1, m[1]);
      html.push(codeBlock(lines.slice(i + 1, end).join("\n"), m[2]));
      i = end + 1;
    } else if ((m = line.match(HEADING))) {
      const level = Math.min(m[1].length + 2, 6); // h3..h6: a message sits under the page's own headings
      html.push(`<h${level}>${inline(m[2])}</h${level}>`);
      i += 1;
    } else if (RULE.test(line)) {
      html.push("<hr>");
      i += 1;
    } else if (ITEM.test(line)) {
      i = list(lines, i, html);
    } else if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && (m = lines[i].match(QUOTE))) {
        quoted.push(m[1]);
        i += 1;
      }
      html.push(`<blockquote>${renderMarkdown(quoted.join("\n"))}</blockquote>`);
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) {
        para.push(lines[i].trim());
        i += 1;
      }
      html.push(`<p>${para.map(inline).join("<br>")}</p>`);
    }
  }
  return html.join("\n");
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || ITEM.test(line) || QUOTE.test(line);
}

function closingFence(lines, from, opener) {
  for (let j = from; j < lines.length; j += 1) {
    const t = lines[j].trim();
    if (t.startsWith(opener[0].repeat(opener.length)) && !t.replace(/[`~]/g, "")) return j;
  }
  return lines.length;
}

function codeBlock(code, lang) {
  const label = lang ? `<span class="code-lang">${escapeHtml(lang)}</span>` : "";
  return `<pre class="code">${label}<code>${escapeHtml(code)}</code></pre>`;
}

// Consecutive list items, nested by indentation (two spaces or more opens a level).
function list(lines, start, html) {
  const stack = []; // [{indent, tag}]
  let i = start;
  let m;
  while (i < lines.length && (m = lines[i].match(ITEM))) {
    const indent = m[1].replace(/\t/g, "    ").length;
    const tag = /\d/.test(m[2]) ? "ol" : "ul";
    while (stack.length && indent < stack[stack.length - 1].indent) closeLevel(stack, html);
    if (stack.length && indent <= stack[stack.length - 1].indent + 1 && tag !== stack[stack.length - 1].tag) {
      closeLevel(stack, html); // "- a" then "1. b" at the same depth: a new list
    }
    const top = stack[stack.length - 1];
    if (!top || indent > top.indent + 1) {
      const startAt = tag === "ol" ? parseInt(m[2], 10) : 1;
      html.push(tag === "ol" && startAt !== 1 ? `<ol start="${startAt}">` : `<${tag}>`);
      stack.push({ indent, tag });
    } else {
      html.push("</li>");
    }
    const text = [m[3]];
    i += 1;
    while (i < lines.length && lines[i].trim() && /^\s{2,}\S/.test(lines[i]) && !ITEM.test(lines[i])) {
      text.push(lines[i].trim()); // a continuation line of this item
      i += 1;
    }
    html.push(`<li>${text.map(inline).join("<br>")}`);
    while (i < lines.length && !lines[i].trim() && ITEM.test(lines[i + 1] || "")) i += 1; // loose lists
  }
  while (stack.length) closeLevel(stack, html);
  return i;
}

function closeLevel(stack, html) {
  html.push(`</li></${stack.pop().tag}>`);
}

// Inline markup over escaped text. Code spans and links become placeholders first, so
// emphasis never reaches inside them.
export function inline(text) {
  const done = [];
  const hold = (fragment) => `${MARK}${done.push(fragment) - 1}${MARK}`;
  let s = escapeHtml(text).replaceAll(MARK, "");
  s = s.replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (_, _ticks, code) => hold(`<code>${code.trim()}</code>`));
  s = s.replace(/!?\[([^\]]*)\]\(([^()\s]+)\)/g, (whole, label, url) => {
    if (whole.startsWith("!") || !SAFE_URL.test(url)) return whole;
    return hold(`<a href="${url}" target="_blank" rel="noopener noreferrer nofollow">${emphasis(label) || url}</a>`);
  });
  s = emphasis(s);
  const placeholder = new RegExp(`${MARK}(\\d+)${MARK}`, "g");
  while (s.includes(MARK)) s = s.replace(placeholder, (_, n) => done[Number(n)]); // a link may hold code
  return s;
}

function emphasis(s) {
  return s
    .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^\w])__(?=\S)([\s\S]*?\S)__(?!\w)/g, "$1<strong>$2</strong>")
    .replace(/(^|[^*\w])\*(?=[^\s*])([^*]*?[^\s*])\*(?!\*)/g, "$1<em>$2</em>")
    .replace(/(^|[^\w])_(?=[^\s_])([^_]*?[^\s_])_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~(?=\S)([\s\S]*?\S)~~/g, "<del>$1</del>");
}

// Plain text for speech: the words without the markup.
export function plainText(source) {
  return String(source)
    .replace(/```[\s\S]*?(```|$)/g, " (code) ")
    .replace(/`([^`]*)`/g, "$1")
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/[*_~#>]+/g, "")
    .replace(/\s+/g, " ")
    .trim();
}
