// The Datasets and Models pages (docs/registry.md): the caller's registered datasets or models (an admin's:
// everyone's) in a table, each with a delete button, and a form that uploads one with a progress bar. A dataset is
// the file itself (its Content-Type from its extension); a model is a tar, chosen as one or packed here from a
// chosen directory (tar.js).

import { ApiError, deleteDataset, deleteModel, el, listDatasets, listModels, sizeText, upload } from "./api.js";
import { directoryEntries, tarBlob } from "./tar.js";

export const DATASET_FORMATS = ["text", "instruction", "chat", "classification"];
const CONTENT_TYPES = { jsonl: "application/jsonl", csv: "text/csv" };
const EXTENSIONS = { ".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv" };

/** The Content-Type of dataset file `fileName`: that of `fileType` ("jsonl", "csv"), or for "auto" the one its extension names; null for none. */
export function datasetContentType(fileName, fileType = "auto") {
  if (fileType !== "auto") return CONTENT_TYPES[fileType] ?? null;
  const dot = fileName.lastIndexOf(".");
  const kind = dot === -1 ? undefined : EXTENSIONS[fileName.slice(dot).toLowerCase()];
  return kind ? CONTENT_TYPES[kind] : null;
}

/** The messages of a refusal, whole: each 422 item's (a dataset's names its line and field; a query parameter's is prefixed with it), else the detail. */
export function errorLines(error) {
  const detail = error.body && error.body.detail;
  if (!Array.isArray(detail)) return [String(error.message || error)];
  return detail.map((item) => {
    const loc = Array.isArray(item.loc) ? item.loc : [];
    return loc.length && loc[0] !== "body" ? `${loc.join(".")}: ${item.msg}` : String(item.msg);
  });
}

const shortHash = (sha256) => el("span", { class: "id", title: sha256 }, sha256.slice(0, 12));
const created = (item) => new Date(item.created_at).toLocaleString();
const nameCell = (item) => [el("strong", {}, item.name), el("div", { class: "muted id" }, item.id)];

const DATASETS = {
  kind: "dataset",
  title: "Datasets",
  list: listDatasets,
  items: (page) => page.datasets,
  remove: deleteDataset,
  heads: ["Dataset", "Format", "Rows", "Size", "SHA-256", "Owner", "Created"],
  cells: (d) => ({ name: nameCell(d), format: `${d.format} (${d.file_format})`, rows: String(d.rows), bytes: sizeText(d.bytes),
    sha256: shortHash(d.sha256), owner: d.owner, created: created(d) }),
  summary: (d) => `${d.rows} rows of ${d.format}, ${sizeText(d.bytes)}`,
  form: datasetForm,
};

const MODELS = {
  kind: "model",
  title: "Models",
  list: listModels,
  items: (page) => page.models,
  remove: deleteModel,
  heads: ["Model", "Model type", "Files", "Size", "SHA-256", "Source", "Owner", "Created"],
  cells: (m) => ({ name: nameCell(m), model_type: m.model_type, files: String(m.files), bytes: sizeText(m.bytes),
    sha256: shortHash(m.sha256),
    source: m.source_job_id ? el("a", { href: `#/jobs/${m.source_job_id}` }, `job ${m.source_job_id.slice(0, 8)}`) : "upload",
    owner: m.owner, created: created(m) }),
  summary: (m) => `${m.model_type}, ${m.files} files, ${sizeText(m.bytes)}`,
  form: modelForm,
};

/** Render the Datasets page into `view`; returns a cleanup function. */
export const datasetsPage = (view) => registryPage(view, DATASETS);

/** Render the Models page into `view`; returns a cleanup function. */
export const modelsPage = (view) => registryPage(view, MODELS);

function registryPage(view, page) {
  const note = el("p", { class: "muted", dataset: { testid: "registry-note" } }, "Loading…");
  const problem = el("div", { class: "error-box", hidden: true, dataset: { testid: "registry-error" } });
  const body = el("tbody");
  let stopped = false;
  view.replaceChildren(
    el("h1", {}, page.title),
    page.form(uploader(page, refresh)),
    el("h2", {}, `Registered ${page.kind}s`),
    problem,
    note,
    el("table", { class: "jobs", dataset: { testid: `${page.kind}-list` } },
      el("thead", {}, el("tr", {}, [...page.heads, ""].map((h) => el("th", {}, h)))),
      body),
  );

  async function refresh() {
    let answer;
    try {
      answer = await page.list();
    } catch (error) {
      if (!stopped) note.textContent = `Cannot load the ${page.kind}s: ${error.message}`;
      return;
    }
    if (stopped) return;
    const items = page.items(answer);
    note.textContent = items.length ? (answer.next_cursor ? `The newest ${items.length} are shown.` : "") : `No ${page.kind}s yet. Upload one.`;
    body.replaceChildren(...items.map(row));
  }

  function row(item) {
    const cells = Object.entries(page.cells(item)).map(([column, value]) => el("td", { dataset: { column } }, value));
    const button = el("button", { type: "button", class: "danger", "aria-label": `Delete ${page.kind} ${item.name}`, dataset: { testid: "delete" } },
      "Delete");
    button.addEventListener("click", () => remove(item, button));
    return el("tr", { dataset: { testid: `${page.kind}-row`, id: item.id } }, ...cells, el("td", {}, button));
  }

  async function remove(item, button) {
    if (!confirm(`Delete ${page.kind} "${item.name}" (${item.id})? Jobs that name it can no longer start.`)) return;
    button.disabled = true;
    problem.hidden = true;
    try {
      await page.remove(item.id);
    } catch (error) {
      if (stopped) return;
      button.disabled = false;
      problem.replaceChildren(el("strong", {}, `Not deleted (HTTP ${error.status}): `), error.message, ...jobLinks(error));
      problem.hidden = false;
      if (!(error instanceof ApiError && error.status === 404)) return;
    }
    refresh();
  }

  refresh();
  return () => { stopped = true; };
}

// The jobs a 409 names ("... used by jobs that have not ended: <id>, <id>") as links to their pages.
function jobLinks(error) {
  const named = error.status === 409 ? /jobs that have not ended: (.+)$/.exec(error.message) : null;
  if (!named) return [];
  const ids = named[1].split(",").map((id) => id.trim()).filter(Boolean);
  return [el("div", {}, "Jobs: ", ...ids.flatMap((id, i) => [i ? ", " : "", el("a", { href: `#/jobs/${id}`, dataset: { testid: "using-job" } }, id)]))];
}

// The upload's progress bar, cancel button and outcome; `start(request)` sends one ({path, body, contentType, name}).
function uploader(page, onDone) {
  const bar = el("progress", { max: 100, value: 0, dataset: { testid: "upload-bar" } });
  const text = el("span", { dataset: { testid: "upload-progress" } });
  const cancel = el("button", { type: "button", dataset: { testid: "upload-cancel" } }, "Cancel upload");
  const status = el("div", { class: "upload-status", hidden: true }, el("label", {}, "Upload ", bar), " ", text, " ", cancel);
  const outcome = el("div", { hidden: true, dataset: { testid: "upload-result" }, "aria-live": "polite" });
  let controller = null;
  cancel.addEventListener("click", () => controller && controller.abort());

  let sentText = "";
  function progress(sent, total) {
    const percent = total > 0 ? Math.floor((100 * sent) / total) : 100;
    bar.value = percent;
    sentText = `${percent}% · ${sizeText(sent)} of ${sizeText(total)}${sent >= total ? " sent" : ""}`;
    text.textContent = sent >= total ? `${sentText}; the server is checking it…` : sentText;
  }

  function fail(lines, heading) {
    outcome.className = "error-box";
    outcome.replaceChildren(el("strong", {}, heading),
      el("ul", { class: "field-errors" }, ...lines.map((line) => el("li", { class: "message", dataset: { testid: "upload-error" } }, line))));
    outcome.hidden = false;
  }

  async function start(request, button) {
    outcome.hidden = true;
    controller = new AbortController();
    status.hidden = false;
    cancel.hidden = false;
    button.disabled = true;
    progress(0, request.body.size);
    try {
      const item = await upload(`${request.path}?${new URLSearchParams(request.query)}`, request.body, request.contentType,
        { onProgress: progress, signal: controller.signal });
      text.textContent = `${sentText}; stored.`;
      outcome.className = "ok-box";
      outcome.replaceChildren(`Uploaded ${page.kind} "${item.name}": ${page.summary(item)}. Its id is `, el("code", {}, item.id), ".");
      outcome.hidden = false;
      onDone();
    } catch (error) {
      text.textContent = sentText;
      const heading = error.status ? `The server refused it (HTTP ${error.status}); nothing was stored:` : "The upload failed:";
      fail(errorLines(error), heading);
    } finally {
      controller = null;
      cancel.hidden = true;
      button.disabled = false;
    }
  }

  return { status, outcome, start, fail };
}

function datasetForm(up) {
  const file = el("input", { type: "file", required: true, accept: ".jsonl,.json,.csv", dataset: { testid: "dataset-file" } });
  const format = el("select", { required: true, dataset: { testid: "dataset-format" } },
    el("option", { value: "" }, "choose…"), ...DATASET_FORMATS.map((f) => el("option", { value: f }, f)));
  const fileType = el("select", { dataset: { testid: "dataset-file-type" } },
    el("option", { value: "auto" }, "from its extension (.jsonl, .json, .csv)"), el("option", { value: "jsonl" }, "JSON lines"),
    el("option", { value: "csv" }, "CSV"));
  const name = el("input", { type: "text", maxlength: 200, placeholder: "default: the file's name", dataset: { testid: "upload-name" } });
  const button = el("button", { type: "submit", class: "primary", dataset: { testid: "upload" } }, "Upload");
  const form = el("form", { class: "upload-form", dataset: { testid: "dataset-upload" } },
    el("h2", {}, "Upload a dataset"),
    el("p", { class: "muted" }, "A JSON-lines file (one JSON object per line) or a CSV file with a header row. Every row is checked ",
      "against the format; the first bad one is named by its line and field, and nothing is stored. From a shell: ",
      el("code", {}, "halfcast datasets upload FILE --format FORMAT"), "."),
    el("label", {}, "File ", file),
    el("label", {}, "Format ", format),
    el("label", {}, "File type ", fileType),
    el("label", {}, "Name ", name),
    el("div", { class: "actions" }, button),
    up.status, up.outcome);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const chosen = file.files[0];
    const contentType = datasetContentType(chosen.name, fileType.value);
    if (!contentType) {
      up.fail([`cannot tell the file format of ${chosen.name}: name it .jsonl, .json or .csv, or choose its file type`], "Not uploaded:");
      return;
    }
    up.start({ path: "/datasets", query: { format: format.value, name: name.value.trim() || chosen.name }, body: chosen, contentType },
      button);
  });
  return form;
}

function modelForm(up) {
  const archive = el("input", { type: "file", accept: ".tar,application/x-tar", dataset: { testid: "model-file" } });
  const directory = el("input", { type: "file", webkitdirectory: true, dataset: { testid: "model-dir" } });
  const chosen = el("span", { class: "muted", dataset: { testid: "model-chosen" } });
  const name = el("input", { type: "text", maxlength: 200, placeholder: "default: the directory's or archive's name", dataset: { testid: "upload-name" } });
  const button = el("button", { type: "submit", class: "primary", dataset: { testid: "upload" } }, "Upload");
  // One source at a time: choosing a file clears the other input.
  archive.addEventListener("change", () => { directory.value = ""; describe(); });
  directory.addEventListener("change", () => { archive.value = ""; describe(); });

  function selection() {
    if (archive.files.length) {
      const file = archive.files[0];
      return { body: file, name: file.name.replace(/\.tar$/i, ""), text: `${file.name}, ${sizeText(file.size)}` };
    }
    if (!directory.files.length) return null;
    const entries = directoryEntries(directory.files);
    const top = entries[0].name.split("/")[0];
    const bytes = entries.reduce((total, entry) => total + entry.file.size, 0);
    return { body: tarBlob(entries), name: top, text: `${top}/: ${entries.length} files, ${sizeText(bytes)} (sent as a tar)` };
  }

  function describe() {
    const picked = selection();
    chosen.textContent = picked ? picked.text : "";
  }

  const form = el("form", { class: "upload-form", dataset: { testid: "model-upload" } },
    el("h2", {}, "Upload a model"),
    el("p", { class: "muted" }, "A Hugging Face model directory: ", el("code", {}, "config.json"), ", ", el("code", {}, "*.safetensors"),
      " weights and tokenizer files (pickle weights such as ", el("code", {}, "*.bin"), " are refused). Choose the directory: this page ",
      "packs it into an uncompressed tar as it sends it. Or choose a tar of it, made with ", el("code", {}, "tar -cf model.tar -C DIR ."),
      ", or upload from a shell with ", el("code", {}, "halfcast models upload DIR"), "."),
    el("label", {}, "Directory ", directory),
    el("label", {}, "or a tar archive ", archive),
    el("p", {}, chosen),
    el("label", {}, "Name ", name),
    el("div", { class: "actions" }, button),
    up.status, up.outcome);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const picked = selection();
    if (!picked) {
      up.fail(["choose a model directory or a tar archive of one"], "Not uploaded:");
      return;
    }
    up.start({ path: "/models", query: { name: name.value.trim() || picked.name }, body: picked.body, contentType: "application/x-tar" },
      button);
  });
  return form;
}
