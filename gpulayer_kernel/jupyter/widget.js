// Built from labextension/src/widget/ by jlpm build:widget: edit the sources, not this file.
var __defProp = Object.defineProperty;
var __defNormalProp = (obj, key, value) => key in obj ? __defProp(obj, key, { enumerable: true, configurable: true, writable: true, value }) : obj[key] = value;
var __publicField = (obj, key, value) => __defNormalProp(obj, typeof key !== "symbol" ? key + "" : key, value);

// labextension/src/api/clock.ts
var ServerClock = class {
  constructor() {
    /** Seconds to add to the browser's clock to get the server's. */
    __publicField(this, "offset", 0);
  }
  observe(dateHeader, localMs = Date.now()) {
    if (!dateHeader) {
      return;
    }
    const serverMs = Date.parse(dateHeader);
    if (Number.isNaN(serverMs)) {
      return;
    }
    const offset = (serverMs - localMs) / 1e3;
    this.offset = Math.abs(offset) > 1.5 ? offset : 0;
  }
  /** Now, in server seconds since the epoch (what every `*_at` field uses). */
  now(localMs = Date.now()) {
    return localMs / 1e3 + this.offset;
  }
};

// labextension/src/api/errors.ts
var APIError = class extends Error {
  constructor(status, code, message, hint = "") {
    super(message);
    __publicField(this, "status", status);
    __publicField(this, "code", code);
    __publicField(this, "hint", hint);
    this.name = "APIError";
  }
  /** The server (or the control plane in it) could not be reached or is not serving. */
  get unreachable() {
    return this.status === 0 || this.status === 502 || this.status === 503;
  }
};
function errorFromAnswer(status, data, text2) {
  if (data && typeof data === "object") {
    const d = data;
    if (typeof d.message === "string") {
      return new APIError(
        status,
        typeof d.code === "string" ? d.code : `http_${status}`,
        d.message,
        typeof d.hint === "string" ? d.hint : ""
      );
    }
  }
  if (status === 404) {
    return new APIError(
      status,
      "not_installed",
      "the GPUlayer server extension is not enabled in this Jupyter server",
      "run `jupyter server extension enable gpulayer_kernel.jupyter` and restart it"
    );
  }
  const snippet = text2.replace(/<[^>]*>/g, " ").trim().slice(0, 200);
  return new APIError(
    status,
    `http_${status}`,
    snippet || `HTTP ${status}`,
    ""
  );
}

// labextension/src/api/requester.ts
var API_PATH = "gpulayer/api/v1";
function joinUrl(base, path) {
  return `${base.replace(/\/+$/, "")}/${path.replace(/^\/+/, "")}`;
}
function requester(transport, clock = new ServerClock()) {
  return async (path, options = {}) => {
    const url = joinUrl(joinUrl(transport.baseUrl, API_PATH), path);
    const init = { method: options.method ?? "GET" };
    if (options.signal) {
      init.signal = options.signal;
    }
    if (options.body !== void 0) {
      init.body = JSON.stringify(options.body);
      init.headers = { "Content-Type": "application/json" };
    }
    let response;
    try {
      response = await transport.send(url, init);
    } catch (error) {
      if (options.signal?.aborted) {
        throw error;
      }
      throw new APIError(
        0,
        "unreachable",
        "the Jupyter server does not answer",
        "it may have stopped or restarted; the panel keeps retrying"
      );
    }
    clock.observe(response.headers.get("Date"));
    const text2 = await response.text();
    let data = null;
    try {
      data = text2 ? JSON.parse(text2) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      throw errorFromAnswer(response.status, data, text2);
    }
    return data;
  };
}

// labextension/src/model/format.ts
function formatDuration(seconds) {
  if (!Number.isFinite(seconds)) {
    return "–";
  }
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s}s`;
  }
  const m = Math.floor(s / 60);
  if (m < 60) {
    return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  }
  const h = Math.floor(m / 60);
  if (h < 24) {
    return `${h}h ${String(m % 60).padStart(2, "0")}m`;
  }
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

// labextension/src/widget/chart.ts
var COLORS = [
  "#1f6feb",
  "#cf222e",
  "#1a7f37",
  "#a07000",
  "#8250df",
  "#0a7b83",
  "#6e7781"
];
var HEIGHT = 180;
function liveChart(box, s) {
  let plot = null;
  let names = [];
  let pending = false;
  function columns() {
    const xs = s.points.map((p) => p[0]);
    return [xs, ...names.map((n) => s.points.map((p) => p[1][n] ?? null))];
  }
  function width() {
    const room = box.parentElement?.clientWidth || 600;
    return Math.max(240, Math.min(room, 900) - 16);
  }
  function build() {
    plot?.destroy();
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
        points: { show: s.points.length < 40 }
      });
    });
    const css = getComputedStyle(box);
    const fg = css.getPropertyValue("--jp-ui-font-color1").trim() || "#333";
    const grid = {
      stroke: css.getPropertyValue("--jp-border-color2").trim() || "#ddd",
      width: 1
    };
    const axes = [
      { label: "step", stroke: fg, grid },
      { scale: "y", label: right ? "loss" : "", stroke: fg, grid }
    ];
    if (right) {
      axes.push({ scale: "y2", side: 1, stroke: fg, grid: { show: false } });
    }
    plot = new uPlot(
      {
        width: width(),
        height: HEIGHT,
        series,
        axes,
        scales: { x: { time: false } },
        legend: { live: true },
        cursor: { drag: { x: true, y: false } }
      },
      columns(),
      box
    );
  }
  function redraw() {
    pending = false;
    const seen = [];
    for (const p of s.points) {
      for (const n of Object.keys(p[1])) {
        if (!seen.includes(n)) {
          seen.push(n);
        }
      }
    }
    const shown = s.points.length >= 2 && seen.length > 0;
    box.style.display = shown ? "" : "none";
    if (!shown) {
      return;
    }
    if (!plot || seen.length !== names.length) {
      names = seen;
      build();
    } else {
      plot.setData(columns());
    }
  }
  function schedule() {
    if (!pending) {
      pending = true;
      requestAnimationFrame(redraw);
    }
  }
  const resize = new ResizeObserver(
    () => plot?.setSize({ width: width(), height: HEIGHT })
  );
  if (box.parentElement) {
    resize.observe(box.parentElement);
  }
  s.charts.add(schedule);
  redraw();
  return () => {
    s.charts.delete(schedule);
    resize.disconnect();
    plot?.destroy();
  };
}

// labextension/src/widget/page.ts
function pageConfig() {
  const el2 = document.getElementById("jupyter-config-data");
  if (!el2) {
    return null;
  }
  try {
    return JSON.parse(el2.textContent || "{}");
  } catch {
    return null;
  }
}
function cookie(name) {
  const m = document.cookie.match("\\b" + name + "=([^;]*)\\b");
  return m?.[1] ?? "";
}
function pageTransport() {
  const config = pageConfig();
  if (!config || typeof config.baseUrl !== "string") {
    return null;
  }
  const token = typeof config.token === "string" ? config.token : "";
  return {
    baseUrl: config.baseUrl,
    send: (url, init) => {
      const headers = new Headers(init.headers);
      headers.set("X-XSRFToken", cookie("_xsrf"));
      if (token) {
        headers.set("Authorization", `token ${token}`);
      }
      return fetch(url, { ...init, headers, credentials: "same-origin" });
    }
  };
}

// labextension/src/widget/store.ts
var MAX_LINES = 5e3;
var MAX_POINTS = 5e3;
var MAX_UNSEEN_JOBS = 100;
var stores = /* @__PURE__ */ new Map();
function store(model) {
  const key = String(model.get("job_id"));
  let s = stores.get(key);
  if (!s) {
    s = {
      lines: [...model.get("log_tail") ?? []],
      points: [...model.get("chart") ?? []],
      listeners: /* @__PURE__ */ new Set(),
      charts: /* @__PURE__ */ new Set()
    };
    stores.set(key, s);
    forgetUnseen();
  }
  return s;
}
function forgetUnseen() {
  const unseen = [...stores].filter(
    ([, s]) => s.listeners.size === 0 && s.charts.size === 0
  );
  for (const [key] of unseen.slice(0, unseen.length - MAX_UNSEEN_JOBS)) {
    stores.delete(key);
  }
}
function keepLast(items, max) {
  if (items.length > max) {
    items.splice(0, items.length - max);
  }
}

// labextension/src/widget/index.ts
function text(model, name) {
  const v = model.get(name);
  return typeof v === "string" ? v : "";
}
function num(model, name) {
  const v = model.get(name);
  return typeof v === "number" ? v : NaN;
}
function el(tag, cls, parent) {
  const e = document.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  parent.appendChild(e);
  return e;
}
function initialize({ model }) {
  model.on("msg:custom", (msg) => {
    const s = store(model);
    if (msg?.type === "points" && msg.points) {
      s.points.push(...msg.points);
      keepLast(s.points, MAX_POINTS);
      s.charts.forEach((f) => f());
    } else if (msg?.type === "logs" && msg.lines) {
      const lines = msg.lines;
      s.lines.push(...lines);
      keepLast(s.lines, MAX_LINES);
      s.listeners.forEach((f) => f(lines));
    }
  });
  model.on("change:log_tail", () => {
    const s = store(model);
    s.lines = [...model.get("log_tail") ?? []];
    s.listeners.forEach((f) => f(null));
  });
  model.on("change:chart", () => {
    const s = store(model);
    const saved = model.get("chart") ?? [];
    if (saved.length >= s.points.length) {
      s.points = [...saved];
    }
    s.charts.forEach((f) => f());
  });
}
async function cancelFromPage(model) {
  const transport = pageTransport();
  if (!transport) {
    return null;
  }
  const cancelPath = text(model, "cancel_path");
  if (cancelPath) {
    try {
      await requester(transport)(cancelPath, { method: "POST" });
      return "cancel requested";
    } catch {
    }
  }
  const kernel = text(model, "kernel_id");
  if (kernel) {
    const url = joinUrl(transport.baseUrl, `api/kernels/${kernel}/interrupt`);
    try {
      if ((await transport.send(url, { method: "POST" })).ok) {
        return "interrupting the kernel: the job is being cancelled";
      }
    } catch {
    }
  }
  return null;
}
function render({
  model,
  el: root
}) {
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
  function say(words) {
    note.textContent = words;
    note.style.display = words ? "" : "none";
  }
  function lineText([stream, r, words]) {
    const prefix = r === null || r === void 0 ? "" : `[rank ${r}] `;
    return (stream === "system" ? "gpulayer: " : "") + prefix + words;
  }
  function appendLines(lines) {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    for (const line of lines) {
      if (rank === "all" || String(line[1]) === rank) {
        el("span", `gl-${line[0]}`, pre).textContent = lineText(line) + "\n";
      }
    }
    while (pre.childNodes.length > MAX_LINES && pre.firstChild) {
      pre.removeChild(pre.firstChild);
    }
    pre.style.display = pre.childNodes.length ? "" : "none";
    if (atBottom) {
      pre.scrollTop = pre.scrollHeight;
    }
  }
  function redrawLogs() {
    pre.textContent = "";
    appendLines(s.lines);
  }
  function onLines(lines) {
    if (lines === null) {
      redrawLogs();
    } else {
      appendLines(lines);
    }
  }
  s.listeners.add(onLines);
  function tick() {
    const elapsed = num(model, "elapsed");
    if (!(elapsed >= 0)) {
      clock.textContent = "";
      return;
    }
    const extra = model.get("running") ? (performance.now() - since) / 1e3 : 0;
    clock.textContent = formatDuration(elapsed + extra);
  }
  function update() {
    const state = text(model, "state");
    badge.textContent = state;
    badge.className = `gl-state gl-state-${state}`;
    title.textContent = `${text(model, "name")} · ${text(model, "job_id")}`;
    const p = text(model, "placement");
    place.textContent = p ? `on ${p}` : "";
    place.style.display = p ? "" : "none";
    const why = text(model, "pending");
    const said = /waiting (helps|won't help)/.test(why);
    const helps = model.get("waiting_helps") ? " (waiting helps)" : " (waiting won't help)";
    pending.textContent = why ? `waiting: ${why}${said ? "" : helps}` : "";
    pending.style.display = why ? "" : "none";
    cost.textContent = text(model, "cost");
    cost.title = "charged so far, ≈ estimated for the attempt in progress";
    const tried = model.get("attempts") ?? [];
    attempts.textContent = "";
    for (const line of tried) {
      el("li", "", attempts).textContent = line;
    }
    attempts.style.display = tried.length ? "" : "none";
    const frac = num(model, "progress");
    const ptext = text(model, "progress_text");
    prog.style.display = ptext ? "" : "none";
    if (frac >= 0) {
      bar.value = frac;
    } else {
      bar.removeAttribute("value");
    }
    bar.style.display = frac >= 0 ? "" : "none";
    progText.textContent = ptext;
    const n = num(model, "ranks") || 0;
    filterRow.style.display = n > 1 ? "" : "none";
    if (filter.options.length !== n + 1) {
      filter.textContent = "";
      for (const v of [
        "all",
        ...Array.from({ length: n }, (_, i) => String(i))
      ]) {
        const o = el("option", "", filter);
        o.value = v;
        o.textContent = v;
      }
      filter.value = rank;
    }
    button.style.display = model.get("terminal") ? "none" : "";
    say(
      [text(model, "message"), text(model, "outcome")].filter(Boolean).join(" — ")
    );
    since = performance.now();
    tick();
  }
  filter.addEventListener("change", () => {
    rank = filter.value;
    redrawLogs();
  });
  button.addEventListener("click", () => {
    button.disabled = true;
    button.textContent = "Cancelling…";
    if (!model.get("blocking")) {
      model.send({ type: "cancel" });
      return;
    }
    void cancelFromPage(model).then((words) => {
      if (words) {
        say(words);
        return;
      }
      say(
        "This page cannot reach the Jupyter server: interrupt the kernel (■) to cancel the job."
      );
      button.disabled = false;
      button.textContent = "Cancel";
    });
  });
  model.on("change", update);
  const timer = setInterval(tick, 1e3);
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
var index_default = { initialize, render };
export {
  index_default as default,
  formatDuration
};
