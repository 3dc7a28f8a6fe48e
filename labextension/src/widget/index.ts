/**
 * The GPUlayer job widget (an anywidget ESM, bundled by `jlpm build:widget` into
 * gpulayer_kernel/jupyter/widget.js). Python sends facts already rendered to text
 * (gpulayer_kernel/render.py); this only lays them out, keeps the log lines and chart points,
 * ticks the elapsed time (the panel's `formatDuration`), and wires the Cancel button, which
 * calls the API through the panel's requester (see widget.py for why it talks to the Jupyter
 * server directly while the cell blocks).
 */
import { joinUrl, requester } from '../api/requester';
import { formatDuration } from '../model/format';
import { liveChart } from './chart';
import { pageTransport } from './page';
import {
  IWidgetModel,
  LogLine,
  MAX_LINES,
  MAX_POINTS,
  Point,
  keepLast,
  store
} from './store';

export { formatDuration };

function text(model: IWidgetModel, name: string): string {
  const v: unknown = model.get(name);
  return typeof v === 'string' ? v : '';
}

function num(model: IWidgetModel, name: string): number {
  const v: unknown = model.get(name);
  return typeof v === 'number' ? v : NaN;
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls: string,
  parent: HTMLElement
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  parent.appendChild(e);
  return e;
}

interface IMessage {
  type?: unknown;
  lines?: LogLine[];
  points?: Point[];
}

function initialize({ model }: { model: IWidgetModel }): void {
  // Each message looks its job's store up again: a store no view drew may have been dropped
  // (store.ts), and the next view starts a new one.
  model.on('msg:custom', (msg: IMessage | null) => {
    const s = store(model);
    if (msg?.type === 'points' && msg.points) {
      s.points.push(...msg.points);
      keepLast(s.points, MAX_POINTS);
      s.charts.forEach(f => f());
    } else if (msg?.type === 'logs' && msg.lines) {
      const lines = msg.lines;
      s.lines.push(...lines);
      keepLast(s.lines, MAX_LINES);
      s.listeners.forEach(f => f(lines));
    }
  });
  model.on('change:log_tail', () => {
    const s = store(model);
    s.lines = [...((model.get('log_tail') as LogLine[] | null) ?? [])];
    s.listeners.forEach(f => f(null));
  });
  model.on('change:chart', () => {
    const s = store(model);
    const saved = (model.get('chart') as Point[] | null) ?? [];
    if (saved.length >= s.points.length) {
      s.points = [...saved];
    }
    s.charts.forEach(f => f());
  });
}

/** Asks the page's Jupyter server to cancel the job (served control plane) or interrupt the
 * kernel (embedded); what the note should say, or null when neither answered. */
async function cancelFromPage(model: IWidgetModel): Promise<string | null> {
  const transport = pageTransport();
  if (!transport) {
    return null;
  }
  const cancelPath = text(model, 'cancel_path');
  if (cancelPath) {
    try {
      await requester(transport)(cancelPath, { method: 'POST' });
      return 'cancel requested';
    } catch {
      // the route failed: interrupting the kernel cancels it too
    }
  }
  const kernel = text(model, 'kernel_id');
  if (kernel) {
    const url = joinUrl(transport.baseUrl, `api/kernels/${kernel}/interrupt`);
    try {
      if ((await transport.send(url, { method: 'POST' })).ok) {
        return 'interrupting the kernel: the job is being cancelled';
      }
    } catch {
      // no answer: said below
    }
  }
  return null;
}

function render({
  model,
  el: root
}: {
  model: IWidgetModel;
  el: HTMLElement;
}): () => void {
  const s = store(model);
  const box = el('div', 'gpulayer-job', root);
  const head = el('div', 'gl-head', box);
  const badge = el('span', 'gl-state', head);
  const title = el('span', 'gl-title', head);
  const clock = el('span', 'gl-elapsed', head);
  const cost = el('span', 'gl-cost', head);
  const button = el('button', 'gl-cancel jupyter-button', head);
  button.textContent = 'Cancel';
  const place = el('div', 'gl-place', box);
  const pending = el('div', 'gl-pending', box);
  const attempts = el('ul', 'gl-attempts', box);
  const prog = el('div', 'gl-progress', box);
  const bar = el('progress', '', prog);
  bar.max = 1;
  const progText = el('span', 'gl-progress-text', prog);
  const chartBox = el('div', 'gl-chart', box);
  const filterRow = el('div', 'gl-filter', box);
  el('span', '', filterRow).textContent = 'ranks: ';
  const filter = el('select', '', filterRow);
  const pre = el('pre', 'gl-logs', box);
  const note = el('div', 'gl-note', box);

  let since = performance.now();
  let rank = 'all';

  function say(words: string): void {
    note.textContent = words;
    note.style.display = words ? '' : 'none';
  }

  function lineText([stream, r, words]: LogLine): string {
    const prefix = r === null || r === undefined ? '' : `[rank ${r}] `;
    return (stream === 'system' ? 'gpulayer: ' : '') + prefix + words;
  }

  function appendLines(lines: LogLine[]): void {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    for (const line of lines) {
      if (rank === 'all' || String(line[1]) === rank) {
        el('span', `gl-${line[0]}`, pre).textContent = lineText(line) + '\n';
      }
    }
    while (pre.childNodes.length > MAX_LINES && pre.firstChild) {
      pre.removeChild(pre.firstChild);
    }
    pre.style.display = pre.childNodes.length ? '' : 'none';
    if (atBottom) {
      pre.scrollTop = pre.scrollHeight;
    }
  }

  function redrawLogs(): void {
    pre.textContent = '';
    appendLines(s.lines);
  }

  function onLines(lines: LogLine[] | null): void {
    if (lines === null) {
      redrawLogs();
    } else {
      appendLines(lines);
    }
  }
  s.listeners.add(onLines);

  function tick(): void {
    const elapsed = num(model, 'elapsed');
    if (!(elapsed >= 0)) {
      clock.textContent = '';
      return;
    }
    const extra = model.get('running') ? (performance.now() - since) / 1000 : 0;
    clock.textContent = formatDuration(elapsed + extra);
  }

  function update(): void {
    const state = text(model, 'state');
    badge.textContent = state;
    badge.className = `gl-state gl-state-${state}`;
    title.textContent = `${text(model, 'name')} · ${text(model, 'job_id')}`;
    const p = text(model, 'placement');
    place.textContent = p ? `on ${p}` : '';
    place.style.display = p ? '' : 'none';
    const why = text(model, 'pending');
    // The sentence says per reason whether waiting helps; add it only where it does not.
    const said = /waiting (helps|won't help)/.test(why);
    const helps = model.get('waiting_helps')
      ? ' (waiting helps)'
      : " (waiting won't help)";
    pending.textContent = why ? `waiting: ${why}${said ? '' : helps}` : '';
    pending.style.display = why ? '' : 'none';
    cost.textContent = text(model, 'cost');
    cost.title = 'charged so far, ≈ estimated for the attempt in progress';
    const tried = (model.get('attempts') as string[] | null) ?? [];
    attempts.textContent = '';
    for (const line of tried) {
      el('li', '', attempts).textContent = line;
    }
    attempts.style.display = tried.length ? '' : 'none';
    const frac = num(model, 'progress');
    const ptext = text(model, 'progress_text');
    prog.style.display = ptext ? '' : 'none';
    if (frac >= 0) {
      bar.value = frac;
    } else {
      bar.removeAttribute('value');
    }
    bar.style.display = frac >= 0 ? '' : 'none';
    progText.textContent = ptext;
    const n = num(model, 'ranks') || 0;
    filterRow.style.display = n > 1 ? '' : 'none';
    if (filter.options.length !== n + 1) {
      filter.textContent = '';
      for (const v of [
        'all',
        ...Array.from({ length: n }, (_, i) => String(i))
      ]) {
        const o = el('option', '', filter);
        o.value = v;
        o.textContent = v;
      }
      filter.value = rank;
    }
    button.style.display = model.get('terminal') ? 'none' : '';
    say(
      [text(model, 'message'), text(model, 'outcome')]
        .filter(Boolean)
        .join(' — ')
    );
    since = performance.now();
    tick();
  }

  filter.addEventListener('change', () => {
    rank = filter.value;
    redrawLogs();
  });

  button.addEventListener('click', () => {
    button.disabled = true;
    button.textContent = 'Cancelling…';
    if (!model.get('blocking')) {
      model.send({ type: 'cancel' }); // the kernel is idle: Python cancels through its bridge
      return;
    }
    void cancelFromPage(model).then(words => {
      if (words) {
        say(words);
        return;
      }
      say(
        'This page cannot reach the Jupyter server: interrupt the kernel (■) to cancel the job.'
      );
      button.disabled = false;
      button.textContent = 'Cancel';
    });
  });

  model.on('change', update);
  const timer = setInterval(tick, 1000);
  update();
  redrawLogs();
  const stopChart = liveChart(chartBox, s);
  return () => {
    stopChart();
    clearInterval(timer);
    s.listeners.delete(onLines);
    model.off('change', update);
  };
}

export default { initialize, render };
