// The "box" view: what the one model is busy with. Each lane's queue, running sequences,
// TTFT/ITL p50/p95 and rejections (GET /api/lanes), the KV cache's use, and background
// jobs with their progress (GET /api/jobs, optional). Polled every 2 s while shown.
// An admin also sees who is using the box (the `members` rows /api/lanes gives only an admin):
// each member, and each user behind a proxy such as Open WebUI, with counts, never text.

import { call } from "./api.js";

const POLL_MS = 2000;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  node.append(...children);
  return node;
}

function ms(value) {
  return value === null || value === undefined ? "–" : `${Math.round(value)} ms`;
}

// The share of a lane's prompt tokens read from the prompt cache, since the server started.
function cached(cache) {
  if (!cache || !cache.prompt_tokens) return "–";
  return `${Math.round(100 * cache.hit_rate)}%`;
}

function meter(label, used, total) {
  const wrap = el("div", { class: "meter" });
  const bar = el("progress", { max: String(total || 1), value: String(used || 0), "aria-label": label });
  wrap.append(el("span", { class: "meter-label", text: `${label}: ${used} / ${total}` }), bar);
  return wrap;
}

// Tokens of the last hour: the prompts', those of them found cached, the answers'; then KV cells now.
const MEMBER_COLUMNS = ["Member", "Running", "Waiting", "Prompt 1 h", "Cached 1 h", "Answer 1 h", "Cells held",
  "Cells cached"];

// "owui › alice" for a proxy's user, the member's name otherwise.
function who(row) {
  return row.user ? `${row.member} › ${row.user}` : row.member;
}

export class BoxView {
  constructor(root) {
    this.root = root;
    this.loop = null;
    this.lanes = root.querySelector("#box-lanes");
    this.kv = root.querySelector("#box-kv");
    this.jobs = root.querySelector("#box-jobs");
    this.status = root.querySelector("#box-status");
    this.members = null; // the "who is using the box" section, made when an admin's snapshot has rows
  }

  show() {
    if (this.loop) return;
    const loop = (this.loop = { timer: null }); // one loop at a time, however often shown and hidden
    const tick = async () => {
      if (!document.hidden) await this.refresh();
      if (this.loop === loop) loop.timer = setTimeout(tick, POLL_MS);
    };
    tick();
  }

  hide() {
    if (this.loop) clearTimeout(this.loop.timer);
    this.loop = null;
  }

  async refresh() {
    const [lanes, jobs] = await Promise.allSettled([call("GET", "/api/lanes"), call("GET", "/api/jobs")]);
    if (lanes.status === "fulfilled") {
      this.renderLanes(lanes.value);
      this.status.textContent = `Updated ${new Date().toLocaleTimeString()}`;
    } else {
      this.status.textContent = lanes.reason.status === 503 ? "The model is loading…" : `Lanes unavailable: ${lanes.reason.message}`;
    }
    this.renderJobs(jobs.status === "fulfilled" ? jobs.value : null, jobs.reason);
  }

  renderLanes(snapshot) {
    const rows = Object.entries(snapshot.lanes || {}).map(([name, lane]) => {
      const ttft = lane.ttft_ms || {};
      const itl = lane.itl_ms || {};
      const cell = (label, text, cls = "num") => el("td", { class: cls, "data-label": label, text });
      return el("tr", {},
        el("th", { scope: "row", text: name }),
        cell("Class", lane.policy ? lane.policy.lane_class : "", ""),
        cell("Queued", String(lane.queued)),
        cell("Running", String(lane.running)),
        cell("TTFT p50 / p95", `${ms(ttft.p50)} / ${ms(ttft.p95)}`),
        cell("ITL p50 / p95", `${ms(itl.p50)} / ${ms(itl.p95)}`),
        cell("Done (5 min)", String(lane.finished ?? "–")),
        cell("Prompt cached", cached(lane.prompt_cache)),
        cell("Rejected", String(lane.rejected ?? 0)));
    });
    this.lanes.replaceChildren(...rows);
    this.renderMembers(snapshot.members);
    const kv = snapshot.kv || {};
    this.kv.replaceChildren(
      meter("KV cells", kv.cells_used, kv.cells_total),
      meter("Cached prefix cells", kv.cells_cached ?? 0, kv.cells_total),
      meter("Sequences", kv.seqs_used, kv.seqs_total),
    );
  }

  renderMembers(members) {
    if (!Array.isArray(members)) { // not an admin: nothing about anyone else
      if (this.members) this.members.remove();
      this.members = null;
      return;
    }
    if (!this.members) this.members = this.membersSection();
    const body = this.members.querySelector("tbody");
    if (!members.length) {
      const none = el("td", { colspan: String(MEMBER_COLUMNS.length), class: "muted", text: "No one in the last hour." });
      body.replaceChildren(el("tr", {}, none));
      return;
    }
    body.replaceChildren(...members.map((row) => {
      const tokens = row.tokens_hour || {};
      const values = [row.running, row.waiting, tokens.prompt, tokens.cached, tokens.output, row.cells_used, row.cells_cached];
      return el("tr", { "data-key": row.key },
        el("th", { scope: "row", text: who(row) }),
        ...values.map((v, i) => el("td", { class: "num", "data-label": MEMBER_COLUMNS[i + 1], text: String(v ?? 0) })));
    }));
  }

  // The section, placed after the lanes' table (before "Memory").
  membersSection() {
    const head = el("tr", {}, ...MEMBER_COLUMNS.map((name) => el("th", { scope: "col", text: name })));
    const table = el("table", { class: "lanes members", "aria-labelledby": "box-members-title" },
      el("thead", {}, head), el("tbody", { id: "box-members" }));
    const section = el("section", { class: "box-members" },
      el("h3", { id: "box-members-title", text: "Who is using the box" }),
      el("div", { class: "table-wrap" }, table));
    const memory = this.kv.previousElementSibling; // the "Memory" heading
    this.kv.parentNode.insertBefore(section, memory && memory.tagName === "H3" ? memory : this.kv);
    return section;
  }

  renderJobs(body, error) {
    const list = Array.isArray(body) ? body : body && Array.isArray(body.jobs) ? body.jobs : null;
    if (!list) {
      const why = error && error.status === 404 ? "This box runs no background jobs." : "Background jobs are not available.";
      this.jobs.replaceChildren(el("p", { class: "muted", text: why }));
      return;
    }
    if (!list.length) {
      this.jobs.replaceChildren(el("p", { class: "muted", text: "No background jobs." }));
      return;
    }
    this.jobs.replaceChildren(...list.map((job) => this.job(job)));
    const docs = body && body.documents;
    if (docs) {
      const line = `Documents: ${docs.indexed ?? 0} indexed, ${docs.summarised ?? 0} summarised, ` +
        `${docs.skipped ?? 0} skipped, ${docs.chunks ?? 0} chunks.`;
      this.jobs.append(el("p", { class: "muted small documents", text: line }));
    }
  }

  job(job) {
    const run = job.last_run || null;
    const card = el("article", { class: "job" });
    const schedule = job.schedule ? ` · ${job.schedule}` : "";
    card.append(el("h4", { text: `${job.name}${schedule}` }));
    if (job.description) card.append(el("p", { class: "muted", text: job.description }));
    if (!run) {
      card.append(el("p", { class: "muted", text: "Never run yet." }));
      return card;
    }
    const total = run.items_total || 0;
    const done = run.items_done || 0;
    const progress = el("progress", { max: String(total || 1), "aria-label": `${job.name} progress` });
    if (total || run.status !== "running") progress.value = total ? done : 1; // no total while running: indeterminate
    const counts = total ? `${done} / ${total}` : `${done}`;
    card.append(
      el("p", { class: `job-status ${run.status}`, text: `${run.status} · ${counts} items` }),
      progress,
    );
    if (run.current_item && run.status === "running") card.append(el("p", { class: "muted small", text: run.current_item }));
    return card;
  }
}
