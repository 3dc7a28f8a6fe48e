// The GPUlayer job widget (anywidget ESM). Python sends facts already rendered to text
// (gpulayer_kernel/render.py); this file only lays them out, keeps the log lines,
// ticks the elapsed time, and wires the cancel button (see widget.py for why it talks to the
// Jupyter server directly while the cell blocks).

const MAX_LINES = 5000; // kept in the page per job; older lines are dropped from the view
// Log lines per job id. Keyed by the id, not the model: anywidget hands initialize() and each
// render() a different proxy of the same model.
const stores = new Map();

function store(model) {
  const key = model.get("job_id");
  let s = stores.get(key);
  if (!s) {
    s = { lines: [...(model.get("log_tail") || [])], listeners: new Set() };
    stores.set(key, s);
  }
  return s;
}

function pageConfig() {
  const el = document.getElementById("jupyter-config-data");
  if (!el) return null;
  try {
    return JSON.parse(el.textContent || "{}");
  } catch (e) {
    return null;
  }
}

function cookie(name) {
  const m = document.cookie.match("\\b" + name + "=([^;]*)\\b");
  return m ? m[1] : "";
}

// POST to the Jupyter server that served this page; false when there is none or it refused.
async function post(path) {
  const config = pageConfig();
  if (!config || typeof config.baseUrl !== "string") return false;
  const headers = { "X-XSRFToken": cookie("_xsrf") };
  if (config.token) headers["Authorization"] = "token " + config.token;
  try {
    const r = await fetch(config.baseUrl + path, {
      method: "POST",
      headers,
      credentials: "same-origin",
    });
    return r.ok;
  } catch (e) {
    return false;
  }
}

function fmt(seconds) {
  if (seconds < 10) return seconds.toFixed(2) + "s";
  if (seconds < 60) return seconds.toFixed(1) + "s";
  const m = Math.floor(seconds / 60);
  if (seconds < 3600) return m + "m " + String(Math.floor(seconds % 60)).padStart(2, "0") + "s";
  return Math.floor(seconds / 3600) + "h " + String(m % 60).padStart(2, "0") + "m";
}

function el(tag, cls, parent) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (parent) parent.appendChild(e);
  return e;
}

function initialize({ model }) {
  const s = store(model);
  model.on("msg:custom", (msg) => {
    if (!msg || msg.type !== "logs") return;
    s.lines.push(...msg.lines);
    if (s.lines.length > MAX_LINES) s.lines.splice(0, s.lines.length - MAX_LINES);
    for (const f of s.listeners) f(msg.lines);
  });
  model.on("change:log_tail", () => {
    s.lines = [...(model.get("log_tail") || [])];
    for (const f of s.listeners) f(null);
  });
}

function render({ model, el: root }) {
  const s = store(model);
  const box = el("div", "gpulayer-job", root);
  const head = el("div", "gl-head", box);
  const badge = el("span", "gl-state", head);
  const title = el("span", "gl-title", head);
  const clock = el("span", "gl-elapsed", head);
  const cost = el("span", "gl-cost", head);
  const button = el("button", "gl-cancel jupyter-button", head);
  button.textContent = "Cancel";
  const place = el("div", "gl-place", box);
  const pending = el("div", "gl-pending", box);
  const attempts = el("ul", "gl-attempts", box);
  const prog = el("div", "gl-progress", box);
  const bar = el("progress", "", prog);
  bar.max = 1;
  const progText = el("span", "gl-progress-text", prog);
  const filterRow = el("div", "gl-filter", box);
  el("span", "", filterRow).textContent = "ranks: ";
  const filter = el("select", "", filterRow);
  const pre = el("pre", "gl-logs", box);
  const note = el("div", "gl-note", box);

  let since = performance.now();
  let rank = "all";

  function lineText(line) {
    const [stream, r, text] = line;
    const prefix = r === null || r === undefined ? "" : "[rank " + r + "] ";
    return (stream === "system" ? "gpulayer: " : "") + prefix + text;
  }

  function visible(line) {
    return rank === "all" || String(line[1]) === rank;
  }

  function appendLines(lines) {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    for (const line of lines) {
      if (!visible(line)) continue;
      const span = el("span", "gl-" + line[0], pre);
      span.textContent = lineText(line) + "\n";
    }
    while (pre.childNodes.length > MAX_LINES) pre.removeChild(pre.firstChild);
    pre.style.display = pre.childNodes.length ? "" : "none";
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  function redrawLogs() {
    pre.textContent = "";
    appendLines(s.lines);
  }

  function onLines(lines) {
    if (lines === null) redrawLogs();
    else appendLines(lines);
  }
  s.listeners.add(onLines);

  function tick() {
    const e = model.get("elapsed");
    if (e < 0) {
      clock.textContent = "";
      return;
    }
    const extra = model.get("running") ? (performance.now() - since) / 1000 : 0;
    clock.textContent = fmt(e + extra);
  }

  function update() {
    const state = model.get("state");
    badge.textContent = state;
    badge.className = "gl-state gl-state-" + state;
    title.textContent = model.get("name") + " · " + model.get("job_id");
    const p = model.get("placement");
    place.textContent = p ? "on " + p : "";
    place.style.display = p ? "" : "none";
    const why = model.get("pending");
    pending.textContent = why
      ? "waiting: " + why + (model.get("waiting_helps") ? " (waiting helps)" : " (waiting won't help)")
      : "";
    pending.style.display = why ? "" : "none";
    cost.textContent = model.get("cost");
    cost.title = "charged so far, ≈ estimated for the attempt in progress";
    const tried = model.get("attempts") || [];
    attempts.textContent = "";
    for (const line of tried) el("li", "", attempts).textContent = line;
    attempts.style.display = tried.length ? "" : "none";
    const frac = model.get("progress");
    const ptext = model.get("progress_text");
    prog.style.display = ptext ? "" : "none";
    if (frac >= 0) bar.value = frac;
    else bar.removeAttribute("value");
    bar.style.display = frac >= 0 ? "" : "none";
    progText.textContent = ptext;
    const n = model.get("ranks");
    filterRow.style.display = n > 1 ? "" : "none";
    if (filter.options.length !== n + 1) {
      filter.textContent = "";
      for (const v of ["all", ...Array.from({ length: n }, (_, i) => String(i))]) {
        const o = el("option", "", filter);
        o.value = v;
        o.textContent = v;
      }
      filter.value = rank;
    }
    const terminal = model.get("terminal");
    button.style.display = terminal ? "none" : "";
    const msg = model.get("message");
    const outcome = model.get("outcome");
    note.textContent = [msg, outcome].filter(Boolean).join(" — ");
    note.style.display = note.textContent ? "" : "none";
    since = performance.now();
    tick();
  }

  filter.addEventListener("change", () => {
    rank = filter.value;
    redrawLogs();
  });

  button.addEventListener("click", async () => {
    button.disabled = true;
    button.textContent = "Cancelling…";
    if (!model.get("blocking")) {
      model.send({ type: "cancel" });
      return;
    }
    const url = model.get("cancel_url");
    if (url && (await post(url))) {
      note.textContent = "cancel requested";
      note.style.display = "";
      return;
    }
    const kid = model.get("kernel_id");
    if (kid && (await post("api/kernels/" + kid + "/interrupt"))) {
      note.textContent = "interrupting the kernel: the job is being cancelled";
      note.style.display = "";
      return;
    }
    note.textContent =
      "This page cannot reach the Jupyter server: interrupt the kernel (■) to cancel the job.";
    note.style.display = "";
    button.disabled = false;
    button.textContent = "Cancel";
  });

  model.on("change", update);
  const timer = setInterval(tick, 1000);
  update();
  redrawLogs();
  return () => {
    clearInterval(timer);
    s.listeners.delete(onLines);
    model.off("change", update);
  };
}

export default { initialize, render };
