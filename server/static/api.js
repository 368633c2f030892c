// Calls to the Halfcast HTTP API (same origin) and small DOM helpers shared by the views.

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

/** An error answer: `status` and the decoded body (`detail` is a string, or a list of field errors for 422). */
export class ApiError extends Error {
  constructor(status, body) {
    const detail = body && body.detail;
    super(typeof detail === "string" ? detail : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

/** fetch `path` and decode its JSON; throws ApiError on an error status. */
export async function api(path, options = {}) {
  const response = await fetch(path, { headers: { accept: "application/json" }, ...options });
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = { detail: response.statusText };
  }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

export const listJobs = (limit = 100) => api(`/jobs?limit=${limit}`);
export const getJob = (id) => api(`/jobs/${encodeURIComponent(id)}`);
export const cancelJob = (id) => api(`/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
export const submitJob = (spec) =>
  api("/jobs", { method: "POST", headers: { "content-type": "application/json", accept: "application/json" }, body: JSON.stringify(spec) });

/** Every step record of a job with step > afterStep, fetched in pages. */
export async function allMetrics(id, afterStep = 0) {
  const points = [];
  for (;;) {
    const page = await api(`/jobs/${encodeURIComponent(id)}/metrics?after_step=${afterStep}&limit=10000`);
    points.push(...page.points);
    if (page.points.length < 10000) return points;
    afterStep = page.points[page.points.length - 1].step;
  }
}

/** Build an element: el("a", {href: "#/", class: "x", dataset: {testid: "y"}}, "text", child...). Text is never parsed as HTML. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** A compact number: 0.1234, 1.2e-5, 65536; "-" for none. */
export function fmt(value, digits = 4) {
  if (value === null || value === undefined) return "-";
  if (Number.isInteger(value) && Math.abs(value) < 1e15) return String(value);
  return Number(value).toPrecision(digits).replace(/\.?0+(e|$)/, "$1");
}

/** A loss scale with its power of two: "65536 (2^16)". */
export function fmtScale(scale) {
  if (!scale || scale <= 0) return fmt(scale);
  const exponent = Math.log2(scale);
  return Number.isInteger(exponent) ? `${fmt(scale)} (2^${exponent})` : fmt(scale);
}

export function statusBadge(status) {
  return el("span", { class: `badge status-${status}`, dataset: { testid: "status" } }, status);
}
