// The job page's charts (uPlot, vendored): loss, loss scale on a log2 axis with overflow steps marked (only for a
// job that scales its loss), throughput.

const COLORS = { loss: "#1f6feb", scale: "#8250df", overflow: "#d1242f", samples: "#1a7f37", tokens: "#bf8700" };
/** Whole-step tick increments for the x axis (steps are integers). */
const STEP_INCRS = [1, 2, 5].flatMap((m) => Array.from({ length: 10 }, (_, e) => m * 10 ** e)).sort((a, b) => a - b);

function baseOptions(title, width, yLabel) {
  return {
    title,
    width,
    height: 220,
    scales: { x: { time: false } },
    axes: [
      { label: "step", stroke: "#57606a", grid: { stroke: "#eaeef2" }, incrs: STEP_INCRS },
      { label: yLabel, stroke: "#57606a", grid: { stroke: "#eaeef2" }, size: 64 },
    ],
    legend: { live: true },
    cursor: { drag: { x: true, y: false } },
  };
}

/** Series data of the three charts, grown one step record at a time. */
export class ChartData {
  constructor() {
    this.step = [];
    this.loss = [];
    this.scale = [];
    this.overflow = [];
    this.samples = [];
    this.tokens = [];
    this.hasTokens = false;
  }

  /** Append a step record (records arrive in step order; a rewind truncates first). */
  push(record) {
    this.step.push(record.step);
    this.loss.push(record.loss ?? null);
    this.scale.push(record.loss_scale ?? null);
    this.overflow.push(record.overflow ? record.loss_scale : null);
    this.samples.push(record.samples_per_second ?? null);
    this.tokens.push(record.tokens_per_second ?? null);
    if (record.tokens_per_second != null) this.hasTokens = true;
  }

  /** Forget records after `step` (a retried attempt resumed from a checkpoint there). */
  truncate(step) {
    const keep = this.step.findIndex((s) => s > step);
    if (keep < 0) return;
    for (const key of ["step", "loss", "scale", "overflow", "samples", "tokens"]) this[key].length = keep;
  }

  get lastStep() {
    return this.step.length ? this.step[this.step.length - 1] : 0;
  }
}

/**
 * The charts of one job in `container`; call update() after pushing records (redraws are batched per frame).
 * `lossScale`: whether to draw the loss-scale chart (false for a job whose precision scales nothing: its scale is always 1).
 */
export class JobCharts {
  constructor(container, data, { lossScale = true } = {}) {
    this.data = data;
    this.container = container;
    this.pending = false;
    const width = Math.max(320, container.clientWidth - 8);
    this.loss = new uPlot(
      { ...baseOptions("Training loss", width, "loss"), series: [{ label: "step" }, { label: "loss", stroke: COLORS.loss, width: 1.5 }] },
      [[], []],
      this.holder("chart-loss"),
    );
    this.scale = lossScale ? this.scaleChart(width) : null;
    const throughput = baseOptions("Throughput", width, "samples/s");
    throughput.scales.tokens = {};
    throughput.axes.push({ scale: "tokens", side: 1, label: "tokens/s", stroke: COLORS.tokens, grid: { show: false }, size: 64 });
    this.throughput = new uPlot(
      {
        ...throughput,
        series: [
          { label: "step" },
          { label: "samples/s", stroke: COLORS.samples, width: 1.5 },
          { label: "tokens/s", stroke: COLORS.tokens, width: 1.5, scale: "tokens", show: false },
        ],
      },
      [[], [], []],
      this.holder("chart-throughput"),
    );
    this.onResize = () => this.resize();
    window.addEventListener("resize", this.onResize);
  }

  /** The loss-scale chart: a log2 axis, overflowing (skipped) steps marked in red. */
  scaleChart(width) {
    const options = baseOptions("Loss scale (log2 axis; red: overflow, step skipped)", width, "loss scale");
    options.scales.y = { distr: 3, log: 2 };
    options.axes[1].values = (u, ticks) => ticks.map((v) => (v > 0 ? `2^${Math.round(Math.log2(v))}` : ""));
    return new uPlot(
      {
        ...options,
        series: [
          { label: "step" },
          { label: "loss scale", stroke: COLORS.scale, width: 1.5, value: (u, v) => (v == null ? "-" : `2^${Math.log2(v).toFixed(1)}`) },
          { label: "overflow", stroke: COLORS.overflow, fill: COLORS.overflow, paths: () => null, points: { show: true, size: 7, fill: COLORS.overflow } },
        ],
      },
      [[], [], []],
      this.holder("chart-scale"),
    );
  }

  /** The charts drawn, in page order. */
  get charts() {
    return [this.loss, this.scale, this.throughput].filter((chart) => chart !== null);
  }

  holder(testid) {
    const div = document.createElement("div");
    div.className = "chart";
    div.dataset.testid = testid;
    div.dataset.points = "0";
    this.container.append(div);
    return div;
  }

  /** Redraw with the current data on the next animation frame (at most once per frame). */
  update() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      const d = this.data;
      this.loss.setData([d.step, d.loss]);
      if (this.scale) this.scale.setData([d.step, d.scale, d.overflow]);
      this.throughput.setData([d.step, d.samples, d.tokens]);
      if (this.throughput.series[2].show !== d.hasTokens) this.throughput.setSeries(2, { show: d.hasTokens });
      for (const chart of this.charts) chart.root.parentElement.dataset.points = String(d.step.length);
    });
  }

  resize() {
    const width = Math.max(320, this.container.clientWidth - 8);
    for (const chart of this.charts) chart.setSize({ width, height: 220 });
  }

  destroy() {
    window.removeEventListener("resize", this.onResize);
    for (const chart of this.charts) chart.destroy();
  }
}
