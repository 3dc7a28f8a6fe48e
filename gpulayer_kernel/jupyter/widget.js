// The GPUlayer job widget (anywidget ESM). Python sends facts already rendered to text
// (gpulayer_kernel/render.py); this file only lays them out, keeps the log lines and chart
// points, ticks the elapsed time, and wires the cancel button (see widget.py for why it talks
// to the Jupyter server directly while the cell blocks). `uPlot` is defined above this file:
// widget.py bundles uPlot's browser build in front of it (vendor/), so nothing is fetched.

const MAX_LINES = 5000; // kept in the page per job; older lines are dropped from the view
const MAX_POINTS = 5000; // chart points kept in the page per job
const COLORS = ["#1f6feb", "#cf222e", "#1a7f37", "#a07000", "#8250df", "#0a7b83", "#6e7781"];
// Log lines per job id. Keyed by the id, not the model: anywidget hands initialize() and each
// render() a different proxy of the same model.
const stores = new Map();

function store(model) {
  const key = model.get("job_id");
  let s = stores.get(key);
  if (!s) {
    s = {
      lines: [...(model.get("log_tail") || [])],
      points: [...(model.get("chart") || [])],
      listeners: new Set(),
      charts: new Set(),
    };
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

// The Lab panel's formatDuration and Python's render.duration, rule for rule: "4s", "3m 05s",
// "2h 10m", "3d 4h" (labextension/test/durations.json holds the examples all three are tested on).
export function fmt(seconds) {
  if (!Number.isFinite(seconds)) return "\u2013";
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return s + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m " + String(s % 60).padStart(2, "0") + "s";
  const h = Math.floor(m / 60);
  if (h < 24) return h + "h " + String(m % 60).padStart(2, "0") + "m";
  return Math.floor(h / 24) + "d " + (h % 24) + "h";
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
    if (msg && msg.type === "points") {
      s.points.push(...msg.points);
      if (s.points.length > MAX_POINTS) s.points.splice(0, s.points.length - MAX_POINTS);
      for (const f of s.charts) f();
      return;
    }
    if (!msg || msg.type !== "logs") return;
    s.lines.push(...msg.lines);
    if (s.lines.length > MAX_LINES) s.lines.splice(0, s.lines.length - MAX_LINES);
    for (const f of s.listeners) f(msg.lines);
  });
  model.on("change:log_tail", () => {
    s.lines = [...(model.get("log_tail") || [])];
    for (const f of s.listeners) f(null);
  });
  model.on("change:chart", () => {
    const saved = model.get("chart") || [];
    if (saved.length >= s.points.length) s.points = [...saved];
    for (const f of s.charts) f();
  });
}

// The live chart: one line per metric against the step; losses on the left axis, the others
// (accuracies, scores) on a right one, so both stay readable. Rebuilt when a metric appears.
function liveChart(box, s) {
  let plot = null;
  let names = [];
  let pending = false;

  function columns() {
    const xs = s.points.map((p) => p[0]);
    return [xs, ...names.map((n) => s.points.map((p) => (n in p[1] ? p[1][n] : null)))];
  }

  function width() {
    return Math.max(240, Math.min(box.parentElement.clientWidth || 600, 900) - 16);
  }

  function build() {
    if (plot) plot.destroy();
    const losses = names.filter((n) => n.includes("loss"));
    const right = names.length > losses.length && losses.length > 0;
    const series = [{ label: "step" }];
    names.forEach((n, i) => {
      series.push({
        label: n,
        scale: right && !n.includes("loss") ? "y2" : "y",
        stroke: COLORS[i % COLORS.length],
        width: 1.5,
        spanGaps: true,
        points: { show: s.points.length < 40 },
      });
    });
    // Axes are drawn on the canvas: take the theme's colours from its CSS variables.
    const css = getComputedStyle(box);
    const fg = css.getPropertyValue("--jp-ui-font-color1").trim() || "#333";
    const grid = { stroke: css.getPropertyValue("--jp-border-color2").trim() || "#ddd", width: 1 };
    const axes = [
      { label: "step", stroke: fg, grid },
      { scale: "y", label: right ? "loss" : "", stroke: fg, grid },
    ];
    if (right) axes.push({ scale: "y2", side: 1, stroke: fg, grid: { show: false } });
    plot = new uPlot(
      {
        width: width(),
        height: 180,
        series,
        axes,
        scales: { x: { time: false } },
        legend: { live: true },
        cursor: { drag: { x: true, y: false } },
      },
      columns(),
      box,
    );
  }

  function redraw() {
    pending = false;
    const seen = [];
    for (const p of s.points) for (const n of Object.keys(p[1])) if (!seen.includes(n)) seen.push(n);
    box.style.display = s.points.length >= 2 && seen.length ? "" : "none";
    if (box.style.display === "none") return;
    if (!plot || seen.length !== names.length) {
      names = seen;
      build();
    } else {
      plot.setData(columns());
    }
  }

  // Points can arrive many times a second; draw at most once per animation frame.
  function schedule() {
    if (!pending) {
      pending = true;
      requestAnimationFrame(redraw);
    }
  }

  const resize = new ResizeObserver(() => plot && plot.setSize({ width: width(), height: 180 }));
  resize.observe(box.parentElement);
  s.charts.add(schedule);
  redraw();
  return () => {
    s.charts.delete(schedule);
    resize.disconnect();
    if (plot) plot.destroy();
  };
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
  const chartBox = el("div", "gl-chart", box);
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
    // The sentence says per reason whether waiting helps; add it only where it does not.
    const said = why && /waiting (helps|won't help)/.test(why);
    const helps = model.get("waiting_helps") ? " (waiting helps)" : " (waiting won't help)";
    pending.textContent = why ? "waiting: " + why + (said ? "" : helps) : "";
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
  const stopChart = liveChart(chartBox, s);
  return () => {
    stopChart();
    clearInterval(timer);
    s.listeners.delete(onLines);
    model.off("change", update);
  };
}

export default { initialize, render };
