/**
 * The live chart: one line per metric against the step; losses on the left axis, the others
 * (accuracies, scores) on a right one, so both stay readable. Rebuilt when a metric appears.
 * uPlot (MIT, vendored in gpulayer_kernel/jupyter/vendor/) is defined in front of the bundle
 * by widget.py, so nothing is fetched.
 */
import type { IJobStore } from './store';

interface IPlot {
  destroy(): void;
  setData(data: (number | null)[][]): void;
  setSize(size: { width: number; height: number }): void;
}

declare const uPlot: new (
  options: Record<string, unknown>,
  data: (number | null)[][],
  target: HTMLElement
) => IPlot;

const COLORS = [
  '#1f6feb',
  '#cf222e',
  '#1a7f37',
  '#a07000',
  '#8250df',
  '#0a7b83',
  '#6e7781'
];
const HEIGHT = 180;

/** Draws `s`'s points in `box`; the returned function stops it. */
export function liveChart(box: HTMLElement, s: IJobStore): () => void {
  let plot: IPlot | null = null;
  let names: string[] = [];
  let pending = false;

  function columns(): (number | null)[][] {
    const xs = s.points.map(p => p[0]);
    return [xs, ...names.map(n => s.points.map(p => p[1][n] ?? null))];
  }

  function width(): number {
    const room = box.parentElement?.clientWidth || 600;
    return Math.max(240, Math.min(room, 900) - 16);
  }

  function build(): void {
    plot?.destroy();
    const losses = names.filter(n => n.includes('loss'));
    const right = names.length > losses.length && losses.length > 0;
    const series: Record<string, unknown>[] = [{ label: 'step' }];
    names.forEach((n, i) => {
      series.push({
        label: n,
        scale: right && !n.includes('loss') ? 'y2' : 'y',
        stroke: COLORS[i % COLORS.length],
        width: 1.5,
        spanGaps: true,
        points: { show: s.points.length < 40 }
      });
    });
    // Axes are drawn on the canvas: take the theme's colours from its CSS variables.
    const css = getComputedStyle(box);
    const fg = css.getPropertyValue('--jp-ui-font-color1').trim() || '#333';
    const grid = {
      stroke: css.getPropertyValue('--jp-border-color2').trim() || '#ddd',
      width: 1
    };
    const axes: Record<string, unknown>[] = [
      { label: 'step', stroke: fg, grid },
      { scale: 'y', label: right ? 'loss' : '', stroke: fg, grid }
    ];
    if (right) {
      axes.push({ scale: 'y2', side: 1, stroke: fg, grid: { show: false } });
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

  function redraw(): void {
    pending = false;
    const seen: string[] = [];
    for (const p of s.points) {
      for (const n of Object.keys(p[1])) {
        if (!seen.includes(n)) {
          seen.push(n);
        }
      }
    }
    const shown = s.points.length >= 2 && seen.length > 0;
    box.style.display = shown ? '' : 'none';
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

  // Points can arrive many times a second; draw at most once per animation frame.
  function schedule(): void {
    if (!pending) {
      pending = true;
      requestAnimationFrame(redraw);
    }
  }

  const resize = new ResizeObserver(() =>
    plot?.setSize({ width: width(), height: HEIGHT })
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
