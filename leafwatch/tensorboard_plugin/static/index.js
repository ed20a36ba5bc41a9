// The Leafwatch tab: the findings table and the gradient coverage grid of each run.
// Plain JS (an ES module TensorBoard loads in an iframe), no build step, nothing external.

const ROW_HEIGHT = 22;
const OVERSCAN = 12;
const TABLE_PAGE = 200;
const SEVERITIES = ["error", "warning", "info"];
const STATUSES = ["open", "intermittent", "resolved", "ignored"];
const ALL = "__all__";

const state = {
  runs: [],
  run: null,
  kind: ALL,
  severity: ALL,
  status: ALL,
  search: "",
  reports: {},
  tableLimit: TABLE_PAGE,
  grid: null,
  tree: null,
  expanded: new Set(),
  expandedFor: null,
  onlyMissed: false,
  window: { first: null, last: null },
};

// -- small DOM helpers --------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

// What a fix is (its remedy's applicability; details.applicability in records before it), in the words of
// the console's "fix (code):" / "fix (advice):".
const FIX_MARKS = { code: "code", words: "advice" };

function fixMark(f) {
  return (f.remedy || {}).applicability || (f.details || {}).applicability;
}

// Text with `code` spans (the causes and fixes quote code that way) as DOM nodes.
function richText(text) {
  const parts = String(text || "").split("`");
  return parts.map((part, i) => (i % 2 ? el("code", {}, part) : part)).filter((p) => p !== "");
}

function compact(n) {
  if (n >= 1e6) return `${+(n / 1e6).toFixed(n >= 1e7 ? 0 : 1)}M`;
  if (n >= 1e4) return `${+(n / 1e3).toFixed(n >= 1e5 ? 0 : 1)}k`;
  return `${n}`;
}

function stepRange(a, b) {
  if (a === null || a === undefined) return "";
  return a === b || b === null || b === undefined ? `${a}` : `${a}\u2013${b}`;
}

function rangesText(ranges, truncated) {
  const text = ranges.map(([a, b]) => stepRange(a, b)).join(", ");
  return truncated ? `${text}, \u2026` : text;
}

async function getJson(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || `${path}: HTTP ${response.status}`);
  return data;
}

// -- layout --------------------------------------------------------------------------------
const ui = {};

function buildPage() {
  const link = el("link", { rel: "stylesheet", href: "./style.css" });
  document.head.append(link, el("meta", { name: "color-scheme", content: "light dark" }));
  document.title = "Leafwatch";
  const select = (id, label, onchange) =>
    el("label", { class: "field" }, label, (ui[id] = el("select", { id, onchange })));
  ui.search = el("input", {
    id: "lw-search", type: "search", placeholder: "name contains\u2026",
    oninput: () => { state.search = ui.search.value.trim(); state.tableLimit = TABLE_PAGE; renderTable(); },
  });
  ui.status = el("div", { class: "status", role: "status" });
  ui.overview = el("section", { class: "panel", id: "lw-runs", "aria-labelledby": "lw-runs-title", hidden: true });
  ui.summary = el("div", { class: "summary", id: "lw-summary" });
  ui.table = el("div", { class: "table-wrap", id: "lw-findings" });
  ui.coverageNote = el("p", { class: "note", id: "lw-coverage-note" });
  ui.grid = el("div", { class: "grid", id: "lw-grid" });
  ui.tooltip = el("div", { class: "tooltip", hidden: true, role: "tooltip" });
  ui.first = el("input", { type: "number", id: "lw-first", placeholder: "first", min: 0 });
  ui.last = el("input", { type: "number", id: "lw-last", placeholder: "last", min: 0 });
  const root = el("main", { class: "lw" },
    el("header", { class: "bar" },
      el("h1", {}, "Leafwatch"),
      select("lw-run", "Run", () => pickRun(ui["lw-run"].value)),
      select("lw-kind", "Kind", () => { state.kind = ui["lw-kind"].value; renderTable(); }),
      select("lw-severity", "Severity", () => { state.severity = ui["lw-severity"].value; renderTable(); }),
      select("lw-status", "Status", () => { state.status = ui["lw-status"].value; renderTable(); }),
      el("label", { class: "field" }, "Name", ui.search),
      el("button", { type: "button", onclick: () => load() }, "Reload"),
      ui.status),
    ui.overview,
    el("section", { class: "panel", "aria-labelledby": "lw-findings-title" },
      el("h2", { id: "lw-findings-title" }, "Findings"), ui.summary, ui.table),
    el("section", { class: "panel", "aria-labelledby": "lw-coverage-title" },
      el("div", { class: "panel-head" },
        el("h2", { id: "lw-coverage-title" }, "Gradient coverage"),
        legend(),
        el("div", { class: "controls" },
          el("button", { type: "button", onclick: () => expandAll(true) }, "Expand all"),
          el("button", { type: "button", onclick: () => expandAll(false) }, "Collapse all"),
          el("label", { class: "check" },
            el("input", { type: "checkbox", id: "lw-only-missed",
              onchange: (e) => { state.onlyMissed = e.target.checked; renderGrid(); } }),
            "only tensors that missed a gradient or are in no optimizer"),
          el("form", { class: "window", onsubmit: (e) => { e.preventDefault(); applyWindow(); } },
            "steps ", ui.first, " to ", ui.last,
            el("button", { type: "submit" }, "Zoom"),
            el("button", { type: "button", onclick: () => { ui.first.value = ""; ui.last.value = ""; applyWindow(); } }, "All")))),
      ui.coverageNote, ui.grid),
    ui.tooltip);
  document.body.append(root);
}

function legend() {
  const item = (cls, text) => el("span", { class: "legend-item" }, el("span", { class: `swatch ${cls}` }), text);
  return el("div", { class: "legend", "aria-label": "legend" },
    item("got", "got a gradient"),
    item("partial", "some checks without"),
    item("missed", "no gradient"),
    item("unheld", "in no optimizer (no optimizer step updates it)"),
    item("unchecked", "not checked (another optimizer stepped)"));
}

function fillSelect(select, values, current, allLabel) {
  clear(select);
  if (allLabel) select.append(el("option", { value: ALL }, allLabel));
  for (const value of values) select.append(el("option", { value }, value));
  select.value = values.includes(current) || current === ALL ? current : (allLabel ? ALL : values[0]);
}

// -- data ----------------------------------------------------------------------------------
async function load() {
  ui.status.textContent = "Loading\u2026";
  try {
    const { runs } = await getJson("./runs");
    state.runs = runs;
    if (!runs.length) {
      ui.status.textContent = "";
      clear(ui.summary).append(el("p", { class: "note" },
        "No Leafwatch records in this log directory yet. Pass writer=SummaryWriter(log_dir) to " +
        "leafwatch.Monitor, or use the LeafWatch callback with a TensorBoard logger."));
      return;
    }
    const names = runs.map((r) => r.run);
    if (state.run === null) state.run = new URLSearchParams(window.location.search).get("run");
    if (state.run !== ALL && !names.includes(state.run)) state.run = firstToShow(runs);
    fillSelect(ui["lw-run"], names, state.run, "All runs");
    state.run = ui["lw-run"].value;
    renderOverview();
    await refresh();
  } catch (error) {
    ui.status.textContent = `Could not load: ${error.message}`;
  }
}

// The runs newest first: by when each last wrote a Leafwatch record, then by name.
function newestFirst(runs) {
  return [...runs].sort((a, b) => (b.wall_time || 0) - (a.wall_time || 0) || compareText(a.run, b.run));
}

// The run the tab opens on: the newest one with an open error (what needs attention), else the newest.
function firstToShow(runs) {
  const ordered = newestFirst(runs);
  return (ordered.find((r) => r.open_errors > 0) || ordered[0]).run;
}

function pickRun(run) {
  state.run = run;
  ui["lw-run"].value = run;
  state.window = { first: null, last: null };
  ui.first.value = "";
  ui.last.value = "";
  renderOverview();
  refresh();
}

function whenText(wallTime) {
  if (!wallTime) return "";
  const d = new Date(wallTime * 1000);
  const two = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ${two(d.getHours())}:${two(d.getMinutes())}`;
}

// The run overview (with more than one run): each run, newest first, with the open errors and
// warnings of its latest report; a click picks it.
function renderOverview() {
  clear(ui.overview);
  ui.overview.hidden = state.runs.length < 2;
  if (ui.overview.hidden) return;
  const count = (n, severity) => (n
    ? el("span", { class: `badge sev-${severity}` }, `${n} ${severity}${n === 1 ? "" : "s"}`)
    : el("span", { class: "meta" }, "0"));
  const rows = newestFirst(state.runs).map((r) => el("tr", {
    class: `run-row${r.open_errors ? " has-errors" : ""}`, "data-run": r.run, "data-errors": r.open_errors || 0,
    "data-warnings": r.open_warnings || 0, "aria-current": r.run === state.run ? "true" : null },
  el("td", { class: "name" }, el("button", { type: "button", class: "pick", onclick: () => pickRun(r.run) }, r.run)),
  el("td", { class: "errors" }, count(r.open_errors || 0, "error")),
  el("td", { class: "warnings" }, count(r.open_warnings || 0, "warning")),
  el("td", { class: "step" }, r.last_step ? `${r.last_step}` : ""),
  el("td", { class: "when" }, whenText(r.wall_time))));
  const withErrors = state.runs.filter((r) => r.open_errors > 0).length;
  ui.overview.append(
    el("div", { class: "panel-head" },
      el("h2", { id: "lw-runs-title" }, "Runs"),
      el("span", { class: "note" }, `${state.runs.length} runs, newest first; ${withErrors} with open errors`)),
    el("div", { class: "runs-wrap" }, el("table", { class: "runs" },
      el("thead", {}, el("tr", {}, ["Run", "Open errors", "Open warnings", "Last step", "Last written"].map(
        (h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows))));
}

async function refresh() {
  ui.status.textContent = "Loading\u2026";
  try {
    if (state.run === ALL) state.reports = (await getJson("./findings")).runs;
    else state.reports = { [state.run]: await getJson(`./findings?run=${encodeURIComponent(state.run)}`) };
    updateFilters();
    state.tableLimit = TABLE_PAGE;
    renderTable();
    await loadGrid();
    ui.status.textContent = "";
  } catch (error) {
    ui.status.textContent = `Could not load: ${error.message}`;
  }
}

function updateFilters() {
  const kinds = new Set();
  const severities = new Set();
  for (const report of Object.values(state.reports)) {
    for (const f of report.findings) { kinds.add(f.kind); severities.add(f.severity); }
  }
  fillSelect(ui["lw-kind"], [...kinds].sort(), state.kind, "All kinds");
  state.kind = ui["lw-kind"].value;
  fillSelect(ui["lw-severity"], SEVERITIES.filter((s) => severities.has(s)), state.severity, "All severities");
  state.severity = ui["lw-severity"].value;
  fillSelect(ui["lw-status"], STATUSES, state.status, "All statuses");
  state.status = ui["lw-status"].value;
}

// -- findings table ------------------------------------------------------------------------
function compareText(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;  // code-point order, as Python compares str
}

function compareKeys(a, b) {
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    if (a[i] === b[i]) continue;
    if (a[i] === undefined) return -1;
    if (b[i] === undefined) return 1;
    return typeof a[i] === "number" && typeof b[i] === "number" ? a[i] - b[i] : compareText(String(a[i]), String(b[i]));
  }
  return 0;
}

// When a finding was seen: findings of the structure scan at fit start have step 0.
function stepsText(first, last) {
  if (first === null || first === undefined) return "";
  if (first === 0 && (last === 0 || last === null || last === undefined)) return "at start";
  return first === 0 ? `start\u2013${last}` : stepRange(first, last);
}

// The tensors of a finding: a mistake lists them in `members` (records of version 1 were one
// finding per tensor; the server groups those too).
function tensorNames(f) {
  return (f.members && f.members.length ? f.members : [f]).map((m) => m.name);
}

// A mistake of several tensors: their names, collapsed until asked for.
function membersCell(f) {
  if (!f.members || f.members.length < 2) return null;
  return el("details", { class: "members" },
    el("summary", {}, `${f.members.length} tensors`),
    el("ul", {}, f.members.map((m) => el("li", { class: `member st-${m.status}` }, el("code", {}, m.name),
      m.status !== f.status ? ` (${m.status})` : ""))));
}

function findingRows() {
  const rows = [];
  for (const [run, report] of Object.entries(state.reports)) {
    for (const f of report.findings) {
      if (state.kind !== ALL && f.kind !== state.kind) continue;
      if (state.severity !== ALL && f.severity !== state.severity) continue;
      if (state.status !== ALL && f.status !== state.status) continue;
      if (state.search && !tensorNames(f).concat([f.name]).some((n) => n.toLowerCase().includes(state.search.toLowerCase()))) continue;
      rows.push({ run, f });
    }
  }
  // The server gives each finding its Finding.sort_key (the one order, shared with the CLI):
  // merging runs keeps it, then orders by run.
  rows.sort((x, y) => compareKeys(x.f.sort_key || [], y.f.sort_key || []) || compareText(x.run, y.run));
  return rows;
}

// Where a code fix goes: "after model.py:12" (inserted after the optimizer's statement) or
// "model.py:8" / "model.py:8-10" (in place of those lines); the full path in its title.
function placeText(edit) {
  const file = String(edit.path).split(/[\\/]/).pop();
  if (edit.action === "insert_after") return `after ${file}:${edit.end}`;
  return edit.start === edit.end ? `${file}:${edit.start}` : `${file}:${edit.start}\u2013${edit.end}`;
}

// A finding's code fix, to copy: its hunk when the run recorded one (a unified diff of the
// user's file), else its code and the place it goes. Advice has none.
function fixSnippet(f) {
  const remedy = f.remedy || {};
  const text = f.hunk || (remedy.applicability === "code" ? remedy.code : "");
  if (!text) return null;
  const lines = String(text).replace(/\n$/, "").split("\n");
  const code = f.hunk
    ? lines.map((line) => el("span", { class: line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") ? "at" : null }, `${line}\n`))
    : `${lines.join("\n")}\n`;
  const button = el("button", { type: "button", class: "copy", "aria-label": `copy the fix of ${f.name}` }, "Copy");
  button.addEventListener("click", () => copyText(String(text), button));
  const edit = remedy.edit;
  return el("div", { class: `fix-snippet${f.hunk ? " hunk" : ""}` },
    el("div", { class: "snippet-head" },
      el("span", { class: "place", title: edit ? edit.path : null }, f.hunk ? "patch" : edit ? placeText(edit) : "paste"),
      verifiedMark(f.verified), button),
    el("pre", {}, el("code", {}, code)));
}

// What `leafwatch report --diff --verify` found of this hunk: the patched copy run again.
const VERIFIED = {
  fixed: (v) => ["verified: fixed", `the patched script, run again for ${v.steps} of the run's ${v.of} optimizer steps, no longer has this finding`],
  still_open: (v) => ["verified: still open", `the patched script, run again for ${v.steps} of the run's ${v.of} optimizer steps, still has this finding`],
  undecided: (v) => ["verify: undecided", v.decided_step > v.steps
    ? `the rerun stopped after step ${v.steps}, before step ${v.decided_step}, at which the run decided this finding`
    : "the rerun left this finding undecided: it ended before the checks that decide it"],
};

function verifiedMark(v) {
  const said = v && VERIFIED[v.outcome];
  if (!said) return null;
  const [label, title] = said(v);
  const extra = v.new ? ` (the rerun also had ${v.new} new finding${v.new === 1 ? "" : "s"})` : "";
  return el("span", { class: `verified ${v.outcome}`, title: `${title}${extra}`, "data-outcome": v.outcome }, label);
}

async function copyText(text, button) {
  let copied = false;
  try {
    await navigator.clipboard.writeText(text);
    copied = true;
  } catch (error) {  // no clipboard permission in this frame: the selection route
    const area = el("textarea", { class: "offscreen", readonly: true });
    area.value = text;
    document.body.append(area);
    area.select();
    try { copied = document.execCommand("copy"); } catch (again) { copied = false; }
    area.remove();
  }
  button.dataset.copied = copied ? "true" : "false";
  button.textContent = copied ? "Copied" : "Copy failed: select the text";
  clearTimeout(button.resetTimer);
  button.resetTimer = setTimeout(() => { button.textContent = "Copy"; }, 2500);
}

function renderSummary() {
  clear(ui.summary);
  for (const [run, report] of Object.entries(state.reports)) {
    const counts = {};
    for (const f of report.findings) counts[f.status] = (counts[f.status] || 0) + 1;
    const errors = report.findings.filter((f) => f.status === "open" && f.severity === "error").length;
    const parts = STATUSES.filter((s) => counts[s]).map((s) => `${counts[s]} ${s}`);
    ui.summary.append(el("p", { class: "run-summary" },
      el("strong", {}, run), ` \u2014 report ${report.step === 0 ? "at start" : `at step ${report.step ?? "?"}`}: `,
      report.findings.length ? parts.join(", ") : report.nothing_to_check ? `nothing to check (${report.nothing_to_check})` : "no findings",
      errors ? el("span", { class: "badge sev-error" }, `${errors} open error${errors > 1 ? "s" : ""}`) : null));
  }
}

function renderTable() {
  renderSummary();
  const rows = findingRows();
  const allRuns = state.run === ALL;
  clear(ui.table);
  if (!rows.length) {
    const reports = Object.values(state.reports);
    const any = reports.some((r) => r.findings.length);
    const idle = reports.length && reports.every((r) => r.nothing_to_check);
    ui.table.append(el("p", { class: "note" }, any ? "No finding matches the filters."
      : idle ? `Nothing to check: ${reports[0].nothing_to_check}.` : "No findings: every checked tensor trains."));
    return;
  }
  const head = ["Severity", "Status", "Kind", "Name", "Cause", "Fix", "Steps"];
  if (allRuns) head.unshift("Run");
  const body = el("tbody");
  for (const { run, f } of rows.slice(0, state.tableLimit)) {
    const seen = stepsText(f.first_step, f.last_step);
    body.append(el("tr", { class: `finding st-${f.status}`, "data-kind": f.kind, "data-name": f.name, "data-run": run },
      allRuns ? el("td", {}, run) : null,
      el("td", {}, el("span", { class: `badge sev-${f.severity}` }, f.severity)),
      el("td", {}, el("span", { class: `status-${f.status}` }, f.status)),
      el("td", { class: "kind" }, f.kind),
      el("td", { class: "name", title: f.message || "" },
        (f.details || {}).described ? f.name : el("code", {}, f.name), membersCell(f),
        (f.details || {}).location ? el("div", { class: "location" }, richText(f.details.location)) : null,
        f.aliases && f.aliases.length ? el("div", { class: "aliases" }, `also ${f.aliases.join(", ")}`) : null,
        f.shape ? el("div", { class: "meta" }, `[${f.shape.join(", ")}] ${f.dtype || ""} ${f.device || ""}`) : null),
      el("td", { class: "cause" },
        f.status === "ignored" && f.details && f.details.ignored_because
          ? el("div", { class: "ignored-because" }, `ignored: ${f.details.ignored_because}`) : null,
        richText(f.cause || f.message)),
      el("td", { class: "fix" }, f.fix && FIX_MARKS[fixMark(f)]
        ? el("span", { class: `badge fix-mark fix-${fixMark(f)}` }, FIX_MARKS[fixMark(f)]) : null,
      richText(f.fix), fixSnippet(f)),
      el("td", { class: "steps", title: `seen in ${f.steps_seen ?? "?"} check(s)` }, seen)));
  }
  const table = el("table", { class: "findings" },
    el("thead", {}, el("tr", {}, head.map((h) => el("th", { scope: "col" }, h)))), body);
  ui.table.append(table);
  if (rows.length > state.tableLimit) {
    ui.table.append(el("button", { type: "button", class: "more",
      onclick: () => { state.tableLimit += 5 * TABLE_PAGE; renderTable(); } },
      `Show more (${rows.length - state.tableLimit} of ${rows.length} not shown)`));
  }
}

// -- coverage grid -------------------------------------------------------------------------
// The grid of the run picked; "All runs": every run on one step axis, a row group per run.
async function loadGrid() {
  const width = ui.grid.clientWidth || document.documentElement.clientWidth || 1000;
  const bins = Math.max(20, Math.min(200, Math.floor((width - 364) / 4)));
  let query = `./coverage?bins=${bins}`;
  if (state.run !== ALL) query += `&run=${encodeURIComponent(state.run)}`;
  if (state.window.first !== null) query += `&first=${state.window.first}`;
  if (state.window.last !== null) query += `&last=${state.window.last}`;
  const picked = state.run;
  const grid = await getJson(query);
  if (picked !== state.run) return;  // another run was picked meanwhile: its own load draws it
  state.grid = grid;
  if (!grid.rows.length) {
    clear(ui.grid);
    state.tree = null;
    ui.coverageNote.textContent = `No coverage records for ${state.run === ALL ? "any run" : "this run"} (or for these steps).`;
    return;
  }
  state.tree = buildTree(grid);
  if (state.expandedFor !== state.run) {
    state.expanded = defaultExpanded(state.tree);
    state.expandedFor = state.run;
  }
  const tensor = (r) => `${r.run ?? ""}\u0000${r.name}`;
  const tensors = new Set(grid.rows.map(tensor)).size;
  const missedRows = new Set(grid.rows.filter((r) => r.missed).map(tensor)).size;
  const unheldRows = new Set(grid.rows.filter((r) => r.in_no_optimizer).map(tensor)).size;
  const runs = new Set(grid.rows.map((r) => r.run)).size;
  ui.coverageNote.textContent =
    `${tensors} tensors${state.run === ALL ? ` of ${runs} run${runs === 1 ? "" : "s"}` : ""}` +
    ` \u00d7 steps ${stepRange(grid.first_step, grid.last_step)}` +
    (grid.width > 1 ? ` in ${grid.columns.length} columns of ${grid.width} steps` : "") +
    ` \u2014 ${missedRows} tensor${missedRows === 1 ? "" : "s"} missed a gradient at least once` +
    (unheldRows ? `, ${unheldRows} in no optimizer (no optimizer step updates ${unheldRows === 1 ? "it" : "them"})` : "") + ".";
  renderGrid();
}

function applyWindow() {
  const value = (input) => (input.value === "" ? null : Math.max(0, parseInt(input.value, 10)));
  state.window = { first: value(ui.first), last: value(ui.last) };
  loadGrid().catch((error) => { ui.coverageNote.textContent = `Could not load: ${error.message}`; });
}

// The label of the row group of the tensors that no optimizer holds (they never train).
const UNHELD = "in no optimizer";

function treeNode(key, path, label, depth, kind) {
  return { key, path, label, depth, kind, children: new Map(), param: null };
}

function childOf(node, name, make) {
  let child = node.children.get(name);
  if (!child) node.children.set(name, (child = make()));
  return child;
}

// Each node has a `key` (unique in the tree: what expands) and a `path` (the module or tensor
// name it stands for). Under "All runs", each run is a node of its own; in a run (or the run),
// the tensors that no optimizer holds form a group of their own after the others.
function buildTree(grid) {
  const ncols = grid.columns.length;
  const root = treeNode("", "", "", -1, "root");
  for (const row of grid.rows) {
    let section = root;
    let key = "";
    if (row.run !== undefined) {
      key = `${row.run}\u0000`;
      section = childOf(root, `\u0000run\u0000${row.run}`, () => treeNode(`\u0000run\u0000${row.run}`, row.run, row.run, 0, "run"));
    }
    if (row.in_no_optimizer) {
      const depth = section.depth + 1;
      key += "\u0000unheld\u0000";
      section = childOf(section, "\u0000unheld", () => treeNode(key, UNHELD, UNHELD, depth, "unheld"));
    }
    const parts = row.name.split(".");
    let node = section;
    parts.forEach((part, i) => {
      const depth = node.depth + 1;
      node = childOf(node, part, () => {
        const path = parts.slice(0, i + 1).join(".");
        return treeNode(key + path, path, part, depth, "module");
      });
    });
    node.param = row;
  }
  const aggregate = (node, run, unheld) => {
    node.run = node.kind === "run" ? node.path : run;
    node.unheld = unheld;
    node.checks = new Array(ncols).fill(0);
    node.missedCols = new Array(ncols).fill(0);
    node.unheldCols = new Array(ncols).fill(0);
    node.count = 0;
    node.missedTensors = 0;
    node.unheldTensors = 0;
    if (node.param) {
      const profile = grid.profiles[node.param.profile];
      const into = node.param.in_no_optimizer ? node.unheldCols : node.checks;
      for (let c = 0; c < ncols; c++) into[c] += profile[c];
      for (const [c, n] of node.param.missed_cols) node.missedCols[c] += n;
      node.count += 1;
      if (node.param.missed) node.missedTensors += 1;
      if (node.param.in_no_optimizer) node.unheldTensors += 1;
    }
    for (const child of node.children.values()) {
      aggregate(child, node.run, unheld || child.kind === "unheld");
      for (let c = 0; c < ncols; c++) {
        node.checks[c] += child.checks[c];
        node.missedCols[c] += child.missedCols[c];
        node.unheldCols[c] += child.unheldCols[c];
      }
      node.count += child.count;
      node.missedTensors += child.missedTensors;
      node.unheldTensors += child.unheldTensors;
    }
    node.totalChecks = node.checks.reduce((a, b) => a + b, 0) + node.unheldCols.reduce((a, b) => a + b, 0);
    node.totalMissed = node.missedCols.reduce((a, b) => a + b, 0);
  };
  aggregate(root, undefined, false);
  return root;
}

// A node worth opening: it holds a tensor that missed a gradient or that no optimizer holds.
function troubled(node) {
  return node.totalMissed > 0 || node.unheldTensors > 0;
}

function defaultExpanded(root) {
  // Open the way to every tensor that missed a gradient or is in no optimizer; keep healthy
  // modules folded. Each run of "All runs" is open, and so is a lone top module.
  const open = new Set();
  const walk = (node) => {
    const modules = [...node.children.values()].filter((ch) => ch.kind === "module");
    if ((node.kind === "root" || node.kind === "run") && modules.length === 1 && modules[0].children.size) open.add(modules[0].key);
    for (const child of node.children.values()) {
      if (child.children.size && (child.kind === "run" || troubled(child))) { open.add(child.key); walk(child); }
    }
  };
  walk(root);
  return open;
}

function expandAll(on) {
  if (!state.tree) return;
  state.expanded = new Set();
  if (on) {
    const walk = (node) => { for (const ch of node.children.values()) if (ch.children.size) { state.expanded.add(ch.key); walk(ch); } };
    walk(state.tree);
  }
  renderGrid();
}

function visibleNodes() {
  const out = [];
  const walk = (node) => {
    for (const child of node.children.values()) {
      if (state.onlyMissed && !troubled(child)) continue;
      out.push(child);
      if (child.children.size && state.expanded.has(child.key)) walk(child);
    }
  };
  walk(state.tree);
  return out;
}

// A cell's colour from its checks: of tensors in an optimizer (`checks`, `missed` of them
// without a gradient) and of tensors in no optimizer (`unheld`: they never train).
function cellClass(checks, missed, unheld = 0) {
  if (!checks && !unheld) return "unchecked";
  if (!missed && !unheld) return "got";
  if (missed + unheld < checks + unheld) return "partial";
  return missed ? "missed" : "unheld";
}

function colors() {
  const style = getComputedStyle(document.documentElement);
  const get = (name) => style.getPropertyValue(name).trim();
  return { got: get("--got"), partial: get("--partial"), missed: get("--missed"), unheld: get("--unheld"),
    unchecked: get("--unchecked") };
}

function renderGrid() {
  const previous = ui.grid.querySelector(".grid-body");
  const scrollTop = previous && ui.grid.dataset.run === state.run ? previous.scrollTop : 0;
  clear(ui.grid);
  ui.grid.dataset.run = state.run;  // (ALL: "All runs")
  const grid = state.grid;
  if (!grid || !state.tree) return;
  const ncols = grid.columns.length;
  const labelWidth = 340;
  const available = Math.max(200, (ui.grid.clientWidth || document.documentElement.clientWidth || 1000) - labelWidth - 24);
  const cell = Math.max(2, Math.min(16, Math.floor(available / ncols)));
  const nodes = visibleNodes();
  const palette = colors();

  const axis = el("div", { class: "axis", style: `padding-left:${labelWidth}px` });
  const axisInner = el("div", { class: "axis-inner", style: `width:${ncols * cell}px` });
  const ticks = Math.max(1, Math.min(ncols, 7, Math.floor((ncols * cell) / 80) + 1));
  for (let t = 0; t < ticks; t++) {
    const c = ticks === 1 ? 0 : Math.round((t * (ncols - 1)) / (ticks - 1));
    const last = t === ticks - 1 && ticks > 1;
    axisInner.append(el("span", { class: last ? "tick end" : "tick", style: `left:${(c + (last ? 1 : 0)) * cell}px` },
      `${last ? grid.columns[c][1] : grid.columns[c][0]}`));
  }
  axis.append(axisInner, el("span", { class: "axis-label" }, "step"));

  const body = el("div", { class: "grid-body", tabindex: "0", "aria-label": "coverage grid" });
  const spacer = el("div", { class: "spacer", style: `height:${nodes.length * ROW_HEIGHT}px` });
  body.append(spacer);
  ui.grid.append(axis, body);

  const drawRow = (node, index) => {
    const isParam = !!node.param && !node.children.size;
    const expandable = node.children.size > 0;
    const open = state.expanded.has(node.key);
    const toggle = expandable
      ? el("button", { type: "button", class: "toggle", "aria-expanded": open ? "true" : "false",
          "aria-label": `${open ? "collapse" : "expand"} ${node.path}`,
          onclick: () => { if (open) state.expanded.delete(node.key); else state.expanded.add(node.key); renderGrid(); } },
          open ? "\u25be" : "\u25b8")
      : el("span", { class: "toggle-space" });
    const prefix = node.kind === "module" ? node.path.slice(0, node.path.length - node.label.length) : "";
    const name = isParam
      ? el("code", { class: "tensor" }, el("span", { class: "prefix" }, prefix), node.label)
      : el("span", { class: "module" }, el("code", {}, node.label), el("span", { class: "meta" }, ` ${node.count} tensor${node.count === 1 ? "" : "s"}`));
    let stat;
    if (isParam && node.param.in_no_optimizer) {
      stat = el("span", { class: "stat unheld", title: `no optimizer held it at ${node.param.checks} checks: no optimizer step updates it` },
        "no optimizer");
    } else if (isParam) {
      const p = node.param;
      stat = p.missed
        ? el("span", { class: "stat bad", title: `no gradient at steps ${rangesText(p.missed_steps, p.missed_steps_truncated)}` },
            `missed ${compact(p.missed)}/${compact(p.checks)}`)
        : el("span", { class: "stat ok", title: `a gradient at each of ${p.checks} checks` }, "ok");
    } else if (node.kind === "unheld") {
      stat = el("span", { class: "stat unheld", title: "no optimizer holds them: no optimizer step updates them" }, "no optimizer");
    } else {
      const parts = [node.missedTensors ? `${node.missedTensors} missed` : "",
        node.unheldTensors ? `${node.unheldTensors} in no optimizer` : ""].filter(Boolean);
      stat = parts.length
        ? el("span", { class: node.missedTensors ? "stat bad" : "stat unheld" }, parts.join(", "))
        : el("span", { class: "stat ok" }, "all ok");
    }
    const canvas = el("canvas", { class: "cells", width: ncols * cell, height: ROW_HEIGHT - 6,
      style: `width:${ncols * cell}px;height:${ROW_HEIGHT - 6}px` });
    const ctx = canvas.getContext("2d");
    const gap = cell >= 8 ? 1 : 0;
    for (let c = 0; c < ncols; c++) {
      ctx.fillStyle = palette[cellClass(node.checks[c], node.missedCols[c], node.unheldCols[c])];
      ctx.fillRect(c * cell, 0, cell - gap, ROW_HEIGHT - 6);
    }
    canvas.addEventListener("mousemove", (event) => showTip(event, node, cell));
    canvas.addEventListener("mouseleave", () => { ui.tooltip.hidden = true; });
    const attrs = {
      class: `row ${isParam ? "param" : "group"}${node.totalMissed ? " has-missed" : ""}${node.unheldTensors ? " has-unheld" : ""}`,
      style: `top:${index * ROW_HEIGHT}px`,
      role: "row",
      "data-name": node.path,
      "data-kind": node.kind === "module" ? (isParam ? "tensor" : "module") : node.kind,
      "data-run": node.run,
      "data-in-no-optimizer": node.unheld ? "true" : null,
      "data-missed": isParam ? node.param.missed : node.totalMissed,
      "data-checks": node.totalChecks,
    };
    if (isParam && node.param.missed) attrs["data-missed-steps"] = rangesText(node.param.missed_steps, node.param.missed_steps_truncated);
    return el("div", attrs,
      el("div", { class: "label", style: `width:${labelWidth}px;padding-left:${6 + node.depth * 14}px`, title: node.path },
        toggle, name, stat),
      canvas);
  };

  let drawn = [-1, -1];
  const paint = () => {
    const top = body.scrollTop;
    const height = body.clientHeight || 600;
    const from = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const to = Math.min(nodes.length, Math.ceil((top + height) / ROW_HEIGHT) + OVERSCAN);
    if (from === drawn[0] && to === drawn[1]) return;
    drawn = [from, to];
    clear(spacer);
    for (let i = from; i < to; i++) spacer.append(drawRow(nodes[i], i));
  };
  body.addEventListener("scroll", () => requestAnimationFrame(paint));
  body.scrollTop = scrollTop;
  paint();
}

function showTip(event, node, cell) {
  const grid = state.grid;
  const rect = event.target.getBoundingClientRect();
  const c = Math.min(grid.columns.length - 1, Math.max(0, Math.floor((event.clientX - rect.left) / cell)));
  const [a, b] = grid.columns[c];
  const checks = node.checks[c];
  const missed = node.missedCols[c];
  const unheld = node.unheldCols[c];
  const plural = (n) => `${n} check${n === 1 ? "" : "s"}`;
  const parts = [];
  if (checks) parts.push(`gradient in ${checks - missed} of ${plural(checks)}`);
  if (unheld) parts.push(`in no optimizer at ${plural(unheld)}: no optimizer step updates ${node.param ? "it" : "them"}`);
  const what = !parts.length
    ? "not checked (another optimizer stepped)"
    : parts.join("; ") + (node.param ? "" : ` (over ${node.count} tensors)`);
  ui.tooltip.textContent = `${node.path} \u2014 steps ${stepRange(a, b)}: ${what}`;
  ui.tooltip.hidden = false;
  ui.tooltip.style.left = `${Math.min(event.clientX + 12, window.innerWidth - 360)}px`;
  ui.tooltip.style.top = `${event.clientY + 14}px`;
}

let resizeTimer = null;
const AUTO_RELOAD_MS = 30000;

export async function render() {
  buildPage();
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(renderGrid, 150);
  });
  // TensorBoard's reload button does not reach an iframed tab: reload on a timer while visible.
  setInterval(() => { if (!document.hidden && state.runs.length) load(); }, AUTO_RELOAD_MS);
  await load();
}
