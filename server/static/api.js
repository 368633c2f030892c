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

// The API token lives in this tab's sessionStorage and goes out as a bearer header on every
// fetch. EventSource cannot send headers: its streams use the HttpOnly session cookie that
// POST /session sets (the server accepts the cookie on GET only, so it cannot be used for CSRF).
const TOKEN_KEY = "halfcast-token";

export const getToken = () => sessionStorage.getItem(TOKEN_KEY);

/** Headers of `options` plus the bearer token, if there is one. */
function withAuth(headers = {}) {
  const token = getToken();
  return token ? { ...headers, authorization: `Bearer ${token}` } : headers;
}

/** fetch `path` and decode its JSON; throws ApiError on an error status (a 401 also asks for a login). */
export async function api(path, options = {}) {
  const headers = withAuth(options.headers || { accept: "application/json" });
  const response = await fetch(path, { ...options, headers });
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = { detail: response.statusText };
  }
  if (response.status === 401) window.dispatchEvent(new CustomEvent("halfcast:unauthorized"));
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

/** Check `token` (POST /session, which also sets the stream cookie) and keep it for this tab; the owner's `{owner, admin}`. */
export async function login(token) {
  const response = await fetch("/session", { method: "POST", headers: { accept: "application/json", authorization: `Bearer ${token}` } });
  const body = await response.json().catch(() => ({ detail: response.statusText }));
  if (!response.ok) throw new ApiError(response.status, body);
  sessionStorage.setItem(TOKEN_KEY, token);
  return body;
}

/** Forget the token and clear the stream cookie. */
export async function logout() {
  const headers = withAuth();
  sessionStorage.removeItem(TOKEN_KEY);
  await fetch("/session", { method: "DELETE", headers }).catch(() => {});
}

/** Who the page is signed in as (`{owner, admin}`), or null when it must log in first. */
export async function whoami() {
  const response = await fetch("/session", { headers: withAuth({ accept: "application/json" }) });
  return response.ok ? response.json() : null;
}

export const listJobs = (limit = 100) => api(`/jobs?limit=${limit}`);
export const getJob = (id) => api(`/jobs/${encodeURIComponent(id)}`);
export const getEvals = (id) => api(`/jobs/${encodeURIComponent(id)}/evals`).then((page) => page.evals);
export const getCheckpoints = (id) => api(`/jobs/${encodeURIComponent(id)}/checkpoints`).then((page) => page.checkpoints);
export const getExports = (id) => api(`/jobs/${encodeURIComponent(id)}/exports`).then((page) => page.exports);
export const cancelJob = (id) => api(`/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
export const submitJob = (spec) =>
  api("/jobs", { method: "POST", headers: { "content-type": "application/json", accept: "application/json" }, body: JSON.stringify(spec) });

// The registry: datasets and models (docs/registry.md). Lists are newest first; one page of `limit`.
export const listDatasets = (limit = 1000) => api(`/datasets?limit=${limit}`);
export const listModels = (limit = 1000) => api(`/models?limit=${limit}`);
export const deleteDataset = (id) => api(`/datasets/${encodeURIComponent(id)}`, { method: "DELETE" });
export const deleteModel = (id) => api(`/models/${encodeURIComponent(id)}`, { method: "DELETE" });

/**
 * POST `body` (a File or Blob) to `path` as `contentType` with XMLHttpRequest, since fetch reports no upload progress.
 * `onProgress(sent, total)` is called as the bytes go out (and once more when all are sent); `signal` aborts it.
 * Resolves to the decoded answer; rejects with ApiError: the server's status and body, or status 0 when no answer came
 * (the connection failed, or the upload was cancelled).
 */
export function upload(path, body, contentType, { onProgress = () => {}, signal } = {}) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", path);
    for (const [name, value] of Object.entries(withAuth({ accept: "application/json", "content-type": contentType }))) {
      xhr.setRequestHeader(name, value);
    }
    xhr.upload.addEventListener("progress", (event) => onProgress(event.loaded, event.lengthComputable ? event.total : body.size));
    xhr.upload.addEventListener("load", () => onProgress(body.size, body.size));
    xhr.addEventListener("load", () => {
      let answer;
      try {
        answer = JSON.parse(xhr.responseText);
      } catch {
        answer = { detail: xhr.statusText || `HTTP ${xhr.status}` };
      }
      if (xhr.status === 401) window.dispatchEvent(new CustomEvent("halfcast:unauthorized"));
      if (xhr.status >= 200 && xhr.status < 300) resolve(answer);
      else reject(new ApiError(xhr.status, answer));
    });
    xhr.addEventListener("error", () =>
      reject(new ApiError(0, { detail: "the connection failed before the server answered (is the API up? a proxy's size limit?)" })));
    xhr.addEventListener("abort", () => reject(new ApiError(0, { detail: "the upload was cancelled; nothing was stored" })));
    if (signal) signal.addEventListener("abort", () => xhr.abort(), { once: true });
    xhr.send(body);
  });
}

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

/** A size in bytes: "812 B", "1.5 KiB", "3.02 GiB". */
export function sizeText(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let size = bytes;
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) { size /= 1024; unit += 1; }
  return unit === 0 ? `${bytes} B` : `${size.toPrecision(3).replace(/\.?0+$/, "")} ${units[unit]}`;
}

/** A loss scale with its power of two: "65536 (2^16)". */
export function fmtScale(scale) {
  if (!scale || scale <= 0) return fmt(scale);
  const exponent = Math.log2(scale);
  return Number.isInteger(exponent) ? `${fmt(scale)} (2^${exponent})` : fmt(scale);
}

/** Whether the job's precision scales its loss (the resource's `loss_scaling`: fp32, bf16 and fp8 do not). */
export const scalesLoss = (job) => job.loss_scaling !== "none";

/** A job's loss scale at `record`: "none" for a job that scales nothing (its scale is always 1), else fmtScale. */
export const scaleText = (job, record) => (scalesLoss(job) ? fmtScale(record.loss_scale) : "none");

export function statusBadge(status) {
  return el("span", { class: `badge status-${status}`, dataset: { testid: "status" } }, status);
}
