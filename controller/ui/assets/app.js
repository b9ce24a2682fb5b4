// The continuum web view: reads the server's /ui/events stream (Server-Sent
// Events over fetch, so the API's bearer token can go in a header) and
// renders each snapshot; the Datalog box posts to /v1/catalog/query. Plain
// DOM, no framework; every value goes in through textContent.

const TOKEN_KEY = "continuum.token";
/** Rows the query table shows at most (the rest are counted, not drawn). */
const MAX_QUERY_ROWS = 500;
/** Reconnect delays: doubling from the first to the last, in ms. */
const RETRY_FIRST_MS = 1000;
const RETRY_MAX_MS = 10000;

const $ = (id) => document.getElementById(id);
const charts = {};

function token() {
  return sessionStorage.getItem(TOKEN_KEY) ?? "";
}

function authHeaders() {
  const t = token();
  return t ? { authorization: `Bearer ${t}` } : {};
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function headerCell(row, text) {
  const th = document.createElement("th");
  th.scope = "row";
  th.textContent = text;
  row.appendChild(th);
}

function fmtMs(v) {
  return v === null || v === undefined ? "–" : v.toFixed(1);
}

// ---- workers -------------------------------------------------------------

function renderWorkers(snap) {
  const body = $("workers-table").tBodies[0];
  const live = snap.workers.filter((w) => w.live);
  const rows = live.map((w) => {
    const tr = document.createElement("tr");
    tr.dataset.worker = w.workerId;
    const s = w.status;
    headerCell(tr, w.workerId);
    cell(tr, w.freePages);
    cell(tr, s ? `${s.residentPages} / ${s.totalPages}` : null);
    cell(tr, w.queuedRequests);
    cell(tr, w.runningRequests);
    cell(tr, s?.residentHitTokens);
    cell(tr, s?.restoredChunks.ram);
    cell(tr, s?.restoredChunks.ssd);
    cell(tr, s?.restoredChunks.peer);
    cell(tr, s?.restoredChunks.s3);
    cell(tr, s?.computedTokens);
    cell(tr, s?.publishedChunks);
    cell(tr, s?.catalogOffset);
    cell(tr, s?.catalogLag);
    cell(tr, w.heartbeatAgeMs === null ? null : Math.round(w.heartbeatAgeMs));
    return tr;
  });
  if (rows.length === 0) {
    const tr = document.createElement("tr");
    const td = cell(tr, "No live worker.", "text");
    td.colSpan = 15;
    rows.push(tr);
  }
  body.replaceChildren(...rows);
  const gone = snap.workers.filter((w) => !w.live).map((w) => w.workerId);
  $("offline").textContent =
    gone.length === 0 ? "" : `Offline (no heartbeat within the TTL): ${gone.join(", ")}`;
  $("catalog").textContent = snap.catalog
    ? `This server's catalog replica: offset ${snap.catalog.offset}, lag ${snap.catalog.lag}.`
    : "No catalog is attached to this server.";
}

// ---- latency charts ------------------------------------------------------

function describe(name, points, p50, p99, count, windowS) {
  const withData = points.filter((p) => p[p99] !== null);
  if (withData.length === 0) return `${name}: nothing observed in the last ${points.length} s.`;
  const last = points[points.length - 1];
  const worst = Math.max(...withData.map((p) => p[p99]));
  const now =
    last[p99] === null
      ? `nothing observed in the last ${windowS} s`
      : `now p50 ${fmtMs(last[p50])} ms, p99 ${fmtMs(last[p99])} ms over the last ${windowS} s (${last[count]} observations)`;
  return `${name}: ${now}; highest p99 ${fmtMs(worst)} ms in the last ${points.length} s.`;
}

function renderChart(id, captionId, name, points, p50, p99, count, windowS) {
  const text = describe(name, points, p50, p99, count, windowS);
  $(id).setAttribute("aria-label", text);
  $(captionId).textContent = text;
  if (typeof uPlot !== "function") return;
  const data = [points.map((p) => p.t / 1000), points.map((p) => p[p50]), points.map((p) => p[p99])];
  if (!charts[id]) {
    charts[id] = new uPlot(
      {
        width: Math.min(640, document.body.clientWidth - 40),
        height: 220,
        scales: { x: { time: true } },
        axes: [{ stroke: "#1a1a1a" }, { stroke: "#1a1a1a", label: "ms" }],
        series: [
          {},
          { label: "p50", stroke: "#1f4fa8", width: 2, spanGaps: false },
          { label: "p99", stroke: "#8a2c00", width: 2, dash: [6, 4], spanGaps: false },
        ],
      },
      data,
      $(id),
    );
  } else {
    charts[id].setData(data);
  }
}

function renderLatency(snap) {
  const pts = snap.latency;
  renderChart(
    "ttft-chart",
    "ttft-caption",
    "Time to first token",
    pts,
    "ttftP50",
    "ttftP99",
    "ttftCount",
    snap.windowS,
  );
  renderChart(
    "itl-chart",
    "itl-caption",
    "Inter-token latency",
    pts,
    "itlP50",
    "itlP99",
    "itlCount",
    snap.windowS,
  );
}

// ---- decisions -----------------------------------------------------------

function candidatesCell(tr, d) {
  const td = document.createElement("td");
  td.className = "text";
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = `${d.ranked.length} ranked, ${d.dropped.length} dropped`;
  details.appendChild(summary);
  const list = document.createElement("ul");
  for (const c of d.ranked) {
    const li = document.createElement("li");
    li.textContent = `${c.workerId} · ${c.source} · ${c.cachedTokens} cached · predicted ${fmtMs(c.predictedTtftMs)} ms`;
    list.appendChild(li);
  }
  for (const c of d.dropped) {
    const li = document.createElement("li");
    li.textContent = `${c.workerId} · ${c.source} · dropped: ${c.reason}`;
    list.appendChild(li);
  }
  if (d.omitted > 0) {
    const li = document.createElement("li");
    li.textContent = `${d.omitted} more not listed`;
    list.appendChild(li);
  }
  details.appendChild(list);
  td.appendChild(details);
  tr.appendChild(td);
}

function renderDecisions(snap) {
  const body = $("decisions-table").tBodies[0];
  if (snap.decisions === null) {
    $("decisions-note").textContent =
      "This server runs its one worker in process: nothing is routed, so there are no routing decisions.";
    $("decisions-table").hidden = true;
    return;
  }
  $("decisions-table").hidden = false;
  $("decisions-note").textContent = "";
  const rows = snap.decisions.map((d) => {
    const tr = document.createElement("tr");
    tr.dataset.request = d.requestId;
    headerCell(tr, new Date(d.time).toLocaleTimeString());
    cell(tr, d.requestId, "text");
    cell(tr, d.attempt);
    cell(tr, d.promptTokens);
    cell(tr, d.workerId ?? "none feasible", "text");
    cell(tr, d.source, "text");
    cell(tr, d.cachedTokens);
    cell(tr, fmtMs(d.predictedTtftMs));
    cell(tr, fmtMs(d.measuredTtftMs));
    candidatesCell(tr, d);
    return tr;
  });
  body.replaceChildren(...rows);
}

// ---- the event stream ----------------------------------------------------

function render(snap) {
  $("mode").textContent = snap.mode === "fleet" ? "· fleet controller" : "· embedded server";
  renderWorkers(snap);
  renderLatency(snap);
  renderDecisions(snap);
  $("status").textContent = `Live · updated ${new Date(snap.time).toLocaleTimeString()}`;
}

function showLogin(message) {
  $("login").hidden = false;
  $("login-error").textContent = message;
  $("status").textContent = "Not connected: a token is needed.";
}

async function stream() {
  const res = await fetch("/ui/events", { headers: authHeaders() });
  if (res.status === 401) {
    showLogin(token() ? "That token was refused." : "");
    return "auth";
  }
  if (!res.ok || !res.body) throw new Error(`the server answered ${res.status}`);
  $("login").hidden = true;
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("the server closed the stream");
    buf += value;
    let end = buf.indexOf("\n\n");
    while (end >= 0) {
      const frame = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = frame
        .split("\n")
        .filter((l) => l.startsWith("data: "))
        .map((l) => l.slice(6))
        .join("\n");
      if (data) render(JSON.parse(data));
      end = buf.indexOf("\n\n");
    }
  }
}

async function connect() {
  let delay = RETRY_FIRST_MS;
  for (;;) {
    try {
      if ((await stream()) === "auth") return;
    } catch (err) {
      $("status").textContent = `Disconnected (${err.message}); retrying in ${delay / 1000} s`;
    }
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(RETRY_MAX_MS, delay * 2);
  }
}

// ---- the Datalog box -----------------------------------------------------

function findColumns(query, width) {
  const m = /:find\s+([\s\S]*?)(?=\s:(?:in|where|with|keys)\b|\]\s*$)/.exec(query);
  const names = m ? m[1].trim().split(/\s+/) : [];
  return Array.from({ length: width }, (_, i) => names[i] ?? `column ${i + 1}`);
}

function renderQuery(query, result) {
  const table = $("query-table");
  const rows = Array.isArray(result) ? result : [[result]];
  const width = rows.reduce((w, r) => Math.max(w, Array.isArray(r) ? r.length : 1), 0);
  const head = document.createElement("tr");
  for (const name of findColumns(query, Math.max(width, 1))) {
    const th = document.createElement("th");
    th.scope = "col";
    th.className = "text";
    th.textContent = name;
    head.appendChild(th);
  }
  table.tHead.replaceChildren(head);
  const shown = rows.slice(0, MAX_QUERY_ROWS).map((r) => {
    const tr = document.createElement("tr");
    for (const v of Array.isArray(r) ? r : [r])
      cell(tr, typeof v === "string" ? v : JSON.stringify(v), "text");
    return tr;
  });
  table.tBodies[0].replaceChildren(...shown);
  $("query-caption").textContent =
    rows.length > MAX_QUERY_ROWS
      ? `${rows.length} rows; the first ${MAX_QUERY_ROWS} shown`
      : `${rows.length} ${rows.length === 1 ? "row" : "rows"}`;
  table.hidden = false;
}

async function runQuery(event) {
  event.preventDefault();
  const query = $("query").value;
  $("query-error").textContent = "";
  const res = await fetch("/v1/catalog/query", {
    method: "POST",
    headers: { "content-type": "application/json", ...authHeaders() },
    body: JSON.stringify({ query }),
  });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) {
    $("query-table").hidden = true;
    $("query-error").textContent = body.error?.message ?? `the server answered ${res.status}`;
    return;
  }
  renderQuery(query, body.result);
}

$("query-form").addEventListener("submit", (e) => {
  runQuery(e).catch((err) => {
    $("query-error").textContent = err.message;
  });
});
$("query").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("query-form").requestSubmit();
});
$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value);
  connect();
});

connect();
