// The job list (polled every 2 s) and the job page (history from /metrics, then live from the event stream).
// A job whose precision scales nothing (fp32, bf16, fp8: `loss_scaling` "none") shows "none" for its loss scale and
// no loss-scale chart; the job page lists every attempt, requeues and resumes included.

import {
  ApiError, TERMINAL, allMetrics, cancelJob, el, fmt, getCheckpoints, getEvals, getExports, getJob, listJobs, scaleText, scalesLoss,
  sizeText, statusBadge,
} from "./api.js";
import { ChartData, JobCharts } from "./charts.js";

const LIST_REFRESH_MS = 2000;
const CHECKPOINT_REFRESH_MS = 10000;

/** Render the job list into `view`; returns a cleanup function. */
export function jobList(view) {
  const body = el("tbody");
  const note = el("p", { class: "muted" }, "Loading…");
  view.replaceChildren(
    el("h1", {}, "Jobs"),
    note,
    el("table", { class: "jobs", dataset: { testid: "job-list" } },
      el("thead", {}, el("tr", {}, ["Job", "Status", "Step", "Loss", "Loss scale", "Skipped", "Created"].map((h) => el("th", {}, h)))),
      body),
  );
  let stopped = false;
  let timer = null;
  const rows = new Map(); // job id -> its <tr>, kept across refreshes
  async function refresh() {
    try {
      const { jobs } = await listJobs();
      if (stopped) return;
      note.textContent = jobs.length ? "" : "No jobs yet. Submit one.";
      placeRows(body, jobs.map((job) => upsertRow(rows, job)), rows);
    } catch (error) {
      note.textContent = `Cannot load jobs: ${error.message}`;
    }
    if (!stopped) timer = setTimeout(refresh, LIST_REFRESH_MS);
  }
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

// Rows are updated in place, never replaced: a refresh between a mousedown and its mouseup on a
// job's link would otherwise swallow the click.
function upsertRow(rows, job) {
  let row = rows.get(job.id);
  if (!row) {
    row = el("tr", { dataset: { jobId: job.id, testid: "job-row" } },
      el("td", {}, el("a", { href: `#/jobs/${job.id}` }, job.name || job.id.slice(0, 8)), el("div", { class: "muted id" }, job.id)),
      ...Array.from({ length: 5 }, () => el("td")),
      el("td", {}, new Date(job.created_at).toLocaleString()));
    rows.set(job.id, row);
  }
  const latest = job.latest || {};
  const cells = [statusBadge(job.status), `${job.step}/${job.max_steps}`, fmt(latest.loss), scaleText(job, latest),
    String(latest.skipped_steps ?? "-")];
  cells.forEach((value, i) => {
    const cell = row.children[i + 1];
    if (typeof value === "string") {
      if (cell.textContent !== value) cell.textContent = value;
    } else if (cell.firstChild?.outerHTML !== value.outerHTML) {
      cell.replaceChildren(value);
    }
  });
  return row;
}

// Put `wanted` rows in order in `body`, moving only rows out of place and dropping the others.
function placeRows(body, wanted, rows) {
  const keep = new Set(wanted);
  for (const [id, row] of rows) {
    if (!keep.has(row)) { row.remove(); rows.delete(id); }
  }
  wanted.forEach((row, i) => {
    if (body.children[i] !== row) body.insertBefore(row, body.children[i] || null);
  });
}

/** Render one job's page into `view`; returns a cleanup function. */
export function jobPage(view, id) {
  // The header's text is redrawn on every render; the cancel button is made once and only enabled or
  // disabled, so a click never lands on a button being replaced (a redraw between mousedown and mouseup loses it).
  const headerInfo = el("div", { class: "info" });
  const cancelButton = el("button", { class: "danger", disabled: true, dataset: { testid: "cancel" }, onclick: onCancel }, "Cancel job");
  const header = el("div", { class: "job-header" }, headerInfo, cancelButton);
  const stats = el("dl", { class: "stats", dataset: { testid: "job-stats" } });
  const problem = el("div", { class: "error-box", hidden: true, dataset: { testid: "job-error" } });
  const evalBox = el("div", { class: "eval-box", hidden: true, dataset: { testid: "job-eval" } });
  const chartsBox = el("div", { class: "charts" });
  const checkpointsBox = el("div", { class: "checkpoints", hidden: true, dataset: { testid: "checkpoints" } });
  const exportsBox = el("div", { class: "checkpoints", hidden: true, dataset: { testid: "exports" } });
  const attemptsBox = el("div", { class: "checkpoints", hidden: true, dataset: { testid: "attempts" } });
  view.replaceChildren(header, problem, evalBox, stats, attemptsBox, checkpointsBox, exportsBox, chartsBox);

  const data = new ChartData();
  let charts = null;
  let source = null;
  let job = null;
  let stopped = false;

  // What the job read and chose: rows, splits after drops, rows dropped without a supervised token, the pad token.
  function dataText(data) {
    const parts = [`${data.rows} rows: ${data.train_examples} train / ${data.held_out_examples} held out`];
    // HELD_OUT_MINIMUM (contracts/records.py): fewer held-out examples than this make noisy metrics.
    if (data.held_out_examples != null && data.held_out_examples < 10) parts[0] += " (fewer than 10: evaluation metrics are noisy)";
    const dropped = Object.entries(data.dropped_rows || {}).filter(([, n]) => n > 0);
    if (dropped.length) parts.push(`dropped ${dropped.map(([split, n]) => `${n} ${split.replace("_", " ")}`).join(", ")}`);
    if (data.pad_token) parts.push(`pad ${data.pad_token.token} (${data.pad_token.source})`);
    return parts.join("; ");
  }

  function rateText(value, job) {
    return job.throughput && value != null ? `${fmt(value, 5)} (whole run)` : fmt(value, 5);
  }

  function render() {
    const latest = data.step.length ? lastRecord : job.latest || {};
    const cancellable = !TERMINAL.has(job.status) && job.status !== "cancelling";
    headerInfo.replaceChildren(
      el("h1", {}, job.name || "Job", " ", statusBadge(job.status)),
      el("div", { class: "muted id" }, job.id),
      el("div", { class: "progress" },
        el("progress", { max: job.max_steps, value: Math.max(job.step, data.lastStep) }),
        el("span", { dataset: { testid: "job-progress" } }, ` ${Math.max(job.step, data.lastStep)}/${job.max_steps} steps`),
        ...(job.phase ? [el("span", { class: "muted", dataset: { testid: "job-phase" } }, ` · ${job.phase}…`)] : [])),
    );
    if (!cancelling) cancelButton.disabled = !cancellable;
    stats.replaceChildren(...[
      ["Loss", fmt(latest.loss)],
      ["Loss scale", scaleText(job, latest)],
      ["Updates", updatesText(latest)],
      // A succeeded job shows its whole-run rate; a running one its latest trailing window (>= 1 s).
      ["Samples/s", rateText(job.throughput ? job.throughput.samples_per_second : latest.samples_per_second, job)],
      ["Tokens/s", rateText(job.throughput ? job.throughput.tokens_per_second : latest.tokens_per_second, job)],
      ["Precision", precisionText(job)],
      ["Last overflow", overflowText(lastOverflow)],
      ["World size", job.world_size],
      ...(job.data ? [["Data", dataText(job.data)]] : []),
    ].flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    if (job.error) {
      problem.hidden = false;
      problem.replaceChildren(el("strong", {}, `Failed: ${job.error.reason}`), el("pre", {}, job.error.message));
    }
    renderAttempts();
    if (job.eval) {
      evalBox.hidden = false;
      const history = evals.length > 1
        ? [el("ol", { class: "eval-history", dataset: { testid: "eval-history" } },
          ...evals.map((e) => el("li", {}, `step ${e.step}: ${evalText(e)}`)))]
        : [];
      evalBox.replaceChildren(el("strong", {}, `Evaluation at step ${job.eval.step}: `), evalText(job.eval), ...history);
    }
  }

  // The attempts table, rebuilt only when an attempt changed (it has nothing to click, but redraws are not free).
  let shownAttempts = "";
  function renderAttempts() {
    const attempts = job.attempts || [];
    const shown = JSON.stringify(attempts);
    if (shown === shownAttempts) return;
    shownAttempts = shown;
    attemptsBox.hidden = attempts.length === 0;
    attemptsBox.replaceChildren(el("strong", {}, "Attempts"), attemptsTable(attempts));
  }

  function evalText(record) {
    return Object.entries(record).filter(([k]) => !["step", "time", "type"].includes(k)).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
  }

  let evals = [];
  function addEval(record) {
    evals = [...evals.filter((e) => e.step !== record.step), record].sort((a, b) => a.step - b.step);
  }

  // "applied N / skipped M" from a step record (its skipped_steps is cumulative), as the resource derives them.
  function updatesText(record) {
    if (record.step == null) return "-";
    const skipped = record.skipped_steps ?? 0;
    return `applied ${record.step - skipped} / skipped ${skipped}`;
  }

  function precisionText(job) {
    const switches = job.precision_switches || [];
    if (!switches.length) return job.spec.precision;
    const s = switches[switches.length - 1];
    return `${s.from} → ${s.to} at step ${s.step} (${s.reason}; rewound to step ${s.rewound_to_step})`;
  }

  function overflowText(record) {
    if (!record) return "-";
    const params = record.nonfinite_params || [];
    if (!params.length) return `step ${record.step}`;
    const more = (record.nonfinite_param_count || params.length) - 1;
    const ranks = (record.overflow_ranks || []).join(",");
    return `step ${record.step}: ${params[0].name} (${params[0].kind})${more > 0 ? ` +${more} more` : ""}${ranks ? ` on rank ${ranks}` : ""}`;
  }

  let lastRecord = {};
  let lastOverflow = null;
  function addRecord(record) {
    data.push(record);
    lastRecord = record;
    if (record.overflow) lastOverflow = record;
  }

  let cancelling = false;
  async function onCancel() {
    cancelling = true;
    cancelButton.disabled = true;
    try {
      job = await cancelJob(id);
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 409)) alert(`Cancel failed: ${error.message}`);
    } finally {
      cancelling = false;
    }
    render();
  }

  function follow() {
    source = new EventSource(`/jobs/${encodeURIComponent(id)}/events?after_step=${data.lastStep}`);
    source.addEventListener("step", (e) => {
      addRecord(JSON.parse(e.data));
      charts.update();
      renderSoon();
    });
    source.addEventListener("rewind", (e) => {
      const step = JSON.parse(e.data).step;
      data.truncate(step);
      if (lastOverflow && lastOverflow.step > step) lastOverflow = null;
      evals = evals.filter((e) => e.step <= step);
      charts.update();
    });
    source.addEventListener("eval", (e) => {
      job = { ...job, eval: JSON.parse(e.data) };
      addEval(job.eval);
      renderSoon();
    });
    source.addEventListener("status", (e) => {
      job = JSON.parse(e.data);
      render();
      refreshCheckpoints();
      if (TERMINAL.has(job.status)) source.close();
    });
  }

  // The job's checkpoint files as download links (the session cookie authenticates a plain GET);
  // read again on every status change and, while the job runs, every CHECKPOINT_REFRESH_MS (mid-run checkpoints).
  let checkpointTimer = null;
  let shownCheckpoints = "";
  async function refreshCheckpoints() {
    refreshExports();
    let files = [];
    try {
      files = await getCheckpoints(id);
    } catch (error) {
      return; // the list is a convenience: the rest of the page stays as it is
    }
    if (stopped) return;
    const shown = JSON.stringify(files.map((f) => [f.attempt, f.name, f.size_bytes]));
    if (shown === shownCheckpoints) return; // unchanged: leave the links alone (a click may be under way)
    shownCheckpoints = shown;
    checkpointsBox.hidden = files.length === 0;
    checkpointsBox.replaceChildren(el("strong", {}, "Checkpoints"), el("ul", {}, ...files.slice().reverse().map((f) =>
      el("li", { dataset: { testid: "checkpoint" } },
        el("a", { href: f.url, download: `${id}-attempt-${f.attempt}-${f.name}` }, f.name),
        ` step ${f.step}, attempt ${f.attempt}, ${sizeText(f.size_bytes)}${f.final ? " (final weights)" : ""}`))));
  }

  // The job's exports (a PEFT adapter, a merged model) as tar download links, read with the checkpoints.
  let shownExports = "";
  async function refreshExports() {
    let found = [];
    try {
      found = await getExports(id);
    } catch (error) {
      return;
    }
    if (stopped) return;
    const shown = JSON.stringify(found.map((e) => [e.kind, e.attempt, e.size_bytes]));
    if (shown === shownExports) return;
    shownExports = shown;
    exportsBox.hidden = found.length === 0;
    exportsBox.replaceChildren(el("strong", {}, "Exports"), el("ul", {}, ...found.map((e) =>
      el("li", { dataset: { testid: "export" } },
        el("a", { href: e.url, download: `${id}-${e.kind}.tar` }, `${e.kind}.tar`),
        ` attempt ${e.attempt}, ${e.files.length} files, ${sizeText(e.size_bytes)}`))));
  }

  let renderTimer = null;
  function renderSoon() {
    if (renderTimer === null) renderTimer = setTimeout(() => { renderTimer = null; if (!stopped) render(); }, 200);
  }

  (async () => {
    try {
      job = await getJob(id);
      for (const record of await allMetrics(id)) addRecord(record);
      for (const record of await getEvals(id)) addEval(record);
    } catch (error) {
      view.replaceChildren(el("h1", {}, "Job"), el("p", { class: "error-box" }, error.status === 404 ? `No job ${id}.` : error.message));
      return;
    }
    if (stopped) return;
    render();
    charts = new JobCharts(chartsBox, data, { lossScale: scalesLoss(job) });
    charts.update();
    refreshCheckpoints();
    if (!TERMINAL.has(job.status)) {
      follow();
      checkpointTimer = setInterval(() => { if (TERMINAL.has(job.status)) clearInterval(checkpointTimer); else refreshCheckpoints(); },
        CHECKPOINT_REFRESH_MS);
    }
  })();

  return () => {
    stopped = true;
    clearInterval(checkpointTimer);
    if (source) source.close();
    if (charts) charts.destroy();
    clearTimeout(renderTimer);
  };
}

/** A job's attempts as a table: number, how it ended, its reason, worker, start and end, where a retry resumed. */
export function attemptsTable(attempts) {
  const heads = ["Attempt", "Outcome", "Reason", "Worker", "Started", "Ended", "Resumed from"];
  return el("table", { class: "jobs" },
    el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...attempts.map((a) => el("tr", { dataset: { testid: "attempt", attempt: String(a.attempt) } },
      el("td", {}, String(a.attempt)),
      el("td", {}, outcomeBadge(a.status)),
      el("td", {}, a.reason ?? "-"),
      el("td", { class: "id" }, a.worker_id),
      el("td", {}, timeText(a.started_at)),
      el("td", {}, timeText(a.ended_at)),
      el("td", {}, resumedText(a.resumed_from_step))))));
}

/** How an attempt ended, as a badge: its status (`requeued`: a graceful worker shutdown handed the job back), or "in progress". */
function outcomeBadge(status) {
  const text = status ?? "in progress";
  return el("span", { class: `badge status-${status ?? "running"}` }, text);
}

/** Where an attempt resumed: "-" for a first attempt, "the start" when no checkpoint was left, else the step. */
export function resumedText(step) {
  if (step === null || step === undefined) return "-";
  return step === 0 ? "the start" : `step ${step}`;
}

function timeText(iso) {
  return iso ? new Date(iso).toLocaleString() : "-";
}
