// The dashboard: a list of runs, and a page per run fed by server-sent events.
"use strict";
// The access token comes once, in the address `prodigy ui` printed. It is kept for this tab
// only (a reload finds it; no other tab, site or server does) and taken off the address bar
// and the tab's history at once. Every request sends it in a header: never in a cookie, which
// the browser would send to every server on this host whatever its port.
const token = (() => {
  const given = new URLSearchParams(location.search).get("token");
  let kept = null;
  try {
    if (given) sessionStorage.setItem("prodigy_token", given);
    kept = sessionStorage.getItem("prodigy_token");
  } catch (e) {
    // No storage (a browser setting): the token lives as long as the page.
  }
  if (location.search) history.replaceState(null, "", "/" + location.hash);
  return given || kept || "";
})();
const $ = (s) => document.querySelector(s);
const esc = (t) => String(t ?? "").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
// A task on the agent backend: `slurm 41_0 on n1`, `container prodigy-job-0`.
const task = (t) => `${esc(t.backend)} ${esc(t.id)}${t.node ? ` on ${esc(t.node)}` : ""}`;
const secs = (s) => {
  if (s == null) return "-";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + r + "s";
};
const usd = (n) => (n == null ? "-" : "$" + Number(n).toFixed(4));
const state = (s) => `<span class="state ${esc(String(s).split("_")[0])}">${esc(String(s).replace(/_/g, " "))}</span>`;
// A request to the server, with the token.
async function call(url, options = {}) {
  const r = await fetch(url, { ...options, credentials: "omit", headers: { ...options.headers, "X-Prodigy-Token": token } });
  if (r.status === 401) {
    $("#main").innerHTML = `<p><b>This tab has no access to the dashboard:</b> open the URL <code>prodigy ui</code> printed (with its <code>?token=</code>).</p>`;
  }
  return r;
}
async function getJson(url) {
  const r = await call(url);
  if (!r.ok) throw new Error(await r.text());
  return r.json();
}
// The events of URL, each given to ON(type, data) as it comes, until the returned controller
// aborts; read from a fetch, since an EventSource cannot send the token's header. Like an
// EventSource it connects again when the stream breaks (the server was restarted), but not when
// it is refused.
function listen(url, on) {
  const stop = new AbortController();
  (async () => {
    while (!stop.signal.aborted) {
      try {
        const r = await call(url, { signal: stop.signal });
        if (!r.ok) return;
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n?/g, "\n");
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            let type = "message";
            const data = [];
            for (const line of block.split("\n")) {
              if (line.startsWith("event:")) type = line.slice(6).trim();
              else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
            }
            if (data.length) on(type, data.join("\n"));
          }
        }
      } catch (e) {
        if (stop.signal.aborted) return;
      }
      await new Promise((wake) => setTimeout(wake, 3000));
    }
  })();
  return stop;
}
let source = null;
let table = { status: "", sort: "index", desc: false, offset: 0, limit: 50 };
let graphTimer = null;

function route() {
  if (source) { source.abort(); source = null; }
  const h = location.hash;
  if (h.startsWith("#/run/")) runPage(decodeURIComponent(h.slice(6)));
  else listPage();
}
window.addEventListener("hashchange", route);

async function listPage() {
  $("#where").textContent = "runs and jobs";
  $("#main").innerHTML = `<p><input id="filter" placeholder="filter: id, workflow, repository, state" size="50"></p><div id="runs"></div>`;
  const data = await getJson("/api/runs");
  const draw = () => {
    const q = $("#filter").value.toLowerCase();
    const rows = data.runs.filter((r) => !q || [r.id, r.workflow, r.repo, JSON.stringify(r.state)].join(" ").toLowerCase().includes(q));
    $("#runs").innerHTML = `<table><tr><th>id</th><th>kind</th><th>state</th><th>items</th><th>Claude</th><th>duration</th><th>started</th><th>workflow</th></tr>${rows.map((r) => `<tr class="row" data-id="${esc(r.id)}"><td>${esc(r.id)}</td><td>${esc(r.kind)}</td><td>${state(r.state)}</td><td>${r.items ? `${r.items.succeeded}/${r.items.total} ok${r.items.failed ? `, ${r.items.failed} failed` : ""}` : "-"}</td><td>${usd(r.cost_usd)}</td><td>${secs(r.duration_secs)}</td><td>${esc(r.started_at)}</td><td>${esc(r.workflow)}</td></tr>`).join("")}</table>`;
    document.querySelectorAll("#runs tr.row").forEach((tr) => (tr.onclick = () => (location.hash = "#/run/" + encodeURIComponent(tr.dataset.id))));
  };
  $("#filter").oninput = draw;
  draw();
}

async function runPage(id) {
  $("#where").textContent = id;
  table = { status: "", sort: "index", desc: false, offset: 0, limit: 50 };
  $("#main").innerHTML = `<div id="head"></div><div class="stats" id="stats"></div><div class="actions" id="actions"></div>
  <div class="cols"><div><h3>Plan</h3><div class="graph" id="graph"></div></div>
  <div><h3>Running agents</h3><div id="agents"></div><div id="queue"></div>
  <h3>Items</h3><p>status <select id="status"><option value="">every</option>${["pending","running","retrying","succeeded","failed","skipped"].map((s) => `<option>${s}</option>`).join("")}</select> <span class="pager"><button id="prev">◀</button><button id="next">▶</button><span id="pos"></span></span></p>
  <div id="items"></div><div id="detail" hidden></div></div></div>`;
  $("#status").onchange = () => { table.status = $("#status").value; table.offset = 0; loadItems(id); };
  $("#prev").onclick = () => { table.offset = Math.max(0, table.offset - table.limit); loadItems(id); };
  $("#next").onclick = () => { table.offset += table.limit; loadItems(id); };
  const picture = await getJson(`/api/runs/${encodeURIComponent(id)}`);
  draw(id, picture);
  source = listen(`/api/runs/${encodeURIComponent(id)}/updates`, (type, data) => {
    if (type === "picture") draw(id, JSON.parse(data));
  });
}

function draw(id, p) {
  const c = p.counts, s = p.summary;
  $("#head").innerHTML = `<h2>${esc(s.kind)} ${esc(s.id)} ${state(p.state)} <span class="muted">${esc(p.phase ?? "")}</span></h2><p class="muted">${esc(s.workflow)} · started ${esc(s.started_at)} · ${secs(p.duration_secs)}</p>${p.pause ? `<p><b>Paused:</b> the Claude usage limit (${esc(p.pause.limit_type)}) resets at ${esc(p.pause.resets_at)}</p>` : ""}${p.claude_slots ? `<p id="slots">Claude: ${p.claude_slots.slots} of ${p.claude_slots.max} slots, rate limited</p>` : ""}${p.stopping ? `<p><b>Stopping:</b> ${esc(p.stopping)}</p>` : ""}${p.reading ? `<p id="reading"><b>Reading its events:</b> ${Math.floor((100 * p.reading.read_bytes) / p.reading.total_bytes)}%, the figures below are of what is read so far</p>` : ""}`;
  const stat = (k, v, name) => `<div class="stat" data-stat="${k}"><b>${v}</b>${name}</div>`;
  $("#stats").innerHTML = [
    stat("done", `${c.succeeded + c.failed + c.skipped}/${c.total}`, "done"),
    stat("succeeded", c.succeeded, "succeeded"), stat("failed", c.failed, "failed"), stat("skipped", c.skipped, "skipped"),
    stat("running", c.running, "running"), stat("pending", c.pending, "pending"), stat("dlq", c.dlq, "in DLQ"), stat("retries", c.retries, "retries"),
    p.breaker ? stat("breaker", p.breaker.replace("_", "-"), "breaker") : "",
    p.items_per_min != null ? stat("rate", p.items_per_min.toFixed(1), "items/min") : "",
    p.eta_secs != null ? stat("eta", secs(p.eta_secs), "ETA") : "",
    stat("cost", usd(p.spend.cost_usd), `Claude (${p.spend.calls} calls, ${p.spend.turns} turns)`),
    p.spend.forecast_usd != null ? stat("forecast", usd(p.spend.forecast_usd), "forecast for the rest") : "",
  ].join("");
  $("#actions").innerHTML = p.actions ? `${s.kind === "job" && c.dlq > 0 && p.state !== "running" ? `<button id="retry">Retry the ${c.dlq} DLQ items</button>` : ""}${p.state === "running" || p.state === "paused" ? `<button id="stop">Stop</button>` : ""}<span id="acted" class="muted"></span>` : "";
  const act = async (what) => {
    const r = await call(`/api/runs/${encodeURIComponent(id)}/${what}`, { method: "POST" });
    // What the server says is shown whole: a retry that ends at once says how it went.
    const text = (await r.text()).trim();
    let said = text;
    try { said = JSON.parse(text).said ?? ""; } catch { /* plain text: an error */ }
    $("#acted").textContent = r.ok ? ` ${what}: requested${said ? `: ${said}` : ""}` : ` ${what}: ${said}`;
  };
  if ($("#retry")) $("#retry").onclick = () => act("dlq-retry");
  if ($("#stop")) $("#stop").onclick = () => act("stop");
  $("#agents").innerHTML = p.agents.length ? `<table id="agents-table"><tr><th>agent</th><th>item</th><th>step</th><th>elapsed</th><th>activity</th></tr>${p.agents.map((a) => `<tr class="row" data-item="${esc(a.item_id ?? "")}"><td>${esc(a.agent_id)}</td><td>${esc(a.item_id ?? "-")}</td><td>${esc(a.step ?? "-")}</td><td>${secs(a.elapsed_secs)}</td><td>${a.tool ? esc(a.tool) : ""}${a.turns != null ? ` <span class="muted">turn ${a.turns}</span>` : ""}${a.task ? ` ${task(a.task)}` : ""}</td></tr>`).join("")}</table>` : `<p class="muted">none</p>`;
  document.querySelectorAll("#agents-table tr.row").forEach((tr) => { if (tr.dataset.item) tr.onclick = () => openItem(id, tr.dataset.item); });
  // The verified merge queue's lane: queued, verifying, landed, sent back, and what the last
  // failed verification printed.
  const q = p.queue;
  $("#queue").innerHTML = q ? `<h3>Merge queue</h3><div class="stats" id="queue-lane">${[
    stat("queued", q.queued, "queued"),
    stat("verifying", q.verifying, `verifying${q.verifying_items.length ? ` (${esc(q.verifying_items.join(", "))})` : ""}`),
    stat("landed", q.landed, "landed"), stat("sent-back", q.redispatched, "sent back"),
    stat("refused", q.refused, "refused"), stat("verifications", q.verifications, "verifications"),
  ].join("")}</div>${q.last_failure ? `<p>last failed verification (${esc(q.last_failure.item_ids.join(", "))}):</p><pre id="queue-output">${esc(q.last_failure.output)}</pre>` : ""}` : "";
  // The graph and the table at most twice a second.
  if (!graphTimer) {
    graphTimer = setTimeout(async () => {
      graphTimer = null;
      const r = await call(`/api/runs/${encodeURIComponent(id)}/graph.svg`);
      if (r.ok && $("#graph")) $("#graph").innerHTML = await r.text();
      if ($("#items")) loadItems(id);
    }, 500);
  }
}

async function loadItems(id) {
  const q = new URLSearchParams({ status: table.status, sort: table.sort, desc: table.desc, offset: table.offset, limit: table.limit });
  const data = await getJson(`/api/runs/${encodeURIComponent(id)}/items?${q}`);
  const cols = [["index", "item"], ["status", "status"], ["attempts", "attempts"], ["duration", "duration"], ["cost", "cost"], ["agent", "agent"]];
  $("#items").innerHTML = `<table id="items-table"><tr>${cols.map(([k, n]) => `<th data-sort="${k}">${n}${table.sort === k ? (table.desc ? " ▼" : " ▲") : ""}</th>`).join("")}<th>task</th><th>input</th></tr>${data.rows.map((r) => `<tr class="row" data-item="${esc(r.item_id)}"><td>${esc(r.item_id)}</td><td>${esc(r.status)}${r.in_dlq ? " (DLQ)" : ""}</td><td>${r.attempts}</td><td>${secs(r.duration_secs)}</td><td>${usd(r.cost_usd)}</td><td>${esc(r.agent_id ?? "")}</td><td>${r.task ? task(r.task) : ""}</td><td><code>${esc(r.short)}</code></td></tr>`).join("")}</table>`;
  $("#pos").textContent = ` ${Math.min(table.offset + 1, data.matched)}–${Math.min(table.offset + table.limit, data.matched)} of ${data.matched}`;
  document.querySelectorAll("#items-table th[data-sort]").forEach((th) => (th.onclick = () => {
    if (table.sort === th.dataset.sort) table.desc = !table.desc; else { table.sort = th.dataset.sort; table.desc = false; }
    loadItems(id);
  }));
  document.querySelectorAll("#items-table tr.row").forEach((tr) => (tr.onclick = () => openItem(id, tr.dataset.item)));
}

// A DLQ error type as `prodigy dlq show` names it: `CommandFailed (exit 1)`,
// `ClaudeFailed (rate_limit)`, `Timeout`.
function errorType(t) {
  if (typeof t === "string") return t;
  const [name, fields] = Object.entries(t ?? {})[0] ?? ["Unknown", {}];
  const detail = fields && (fields.kind ?? (fields.exit_code != null ? `exit ${fields.exit_code}` : null));
  return detail != null ? `${name} (${detail})` : name;
}

async function openItem(id, item) {
  const d = await getJson(`/api/runs/${encodeURIComponent(id)}/items/${encodeURIComponent(item)}`);
  const box = $("#detail");
  box.hidden = false;
  const attempts = d.events.filter((e) => e.event_type === "attempt_finished");
  box.innerHTML = `<h3>${esc(item)} <span class="muted">${esc(d.row.status)}</span></h3>
  <p>input: <code>${esc(JSON.stringify(d.data))}</code></p>
  <h4>Attempts</h4><table><tr><th>step</th><th>run</th><th>attempt</th><th>exit</th><th>duration</th></tr>${attempts.map((e) => `<tr><td>${esc(e.step)}</td><td>${e.run}</td><td>${e.attempt}</td><td>${e.exit_code ?? (e.timed_out ? "timed out" : "-")}</td><td>${secs(e.duration_secs)}</td></tr>`).join("")}</table>
  <h4>Output</h4>${d.outputs.map((o) => `<div class="output"><p><b>${esc(o.step ?? "step " + o.number)}</b> <span class="muted">attempt ${o.attempt || "?"} · ${esc(o.outcome ?? "running")} · ${o.output_bytes} bytes${o.truncated ? ", its end" : ""}</span></p><pre>${esc(o.tail)}</pre></div>`).join("") || '<p class="muted">none</p>'}
  <h4>Claude calls</h4>${d.claude.map((c, i) => `<div class="claude-call"><p><b>call ${i + 1}</b> <span class="muted">${c.turns} turns, ${c.tool_calls} tool calls · ${esc(c.log)}</span></p><pre>${esc(c.lines.join("\n"))}${c.result ? "\n= " + esc(c.result) : ""}</pre></div>`).join("") || '<p class="muted">none</p>'}
  ${d.dlq ? `<h4>DLQ entry</h4>${d.dlq.failure_history.map((f) => `<p>${esc(f.timestamp)} ${esc(errorType(f.error_type))}: ${esc(f.error_message)} <span class="muted">(${esc(f.step_failed)})</span></p>${f.command_output ? `<pre>exit ${f.command_output.exit_code ?? "-"}\n${esc(f.command_output.stdout)}${esc(f.command_output.stderr)}</pre>` : ""}`).join("")}` : ""}
  <details><summary>events (${d.events.length})</summary><pre>${esc(d.events.map((e) => JSON.stringify(e)).join("\n"))}</pre></details>`;
  // An item far down the list: its details come into view.
  box.scrollIntoView({ block: "start" });
}

route();
