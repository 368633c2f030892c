// The submit form: a JSON or YAML spec in a textarea; 422 field errors are shown next to the line of the field
// (the server's `field` path: no union tags) and listed in full below it. Registered datasets and models are
// offered by name: choosing one sets the spec's `dataset` or `model` to it by id (spec_edit.js).

import { ApiError, el, listDatasets, listModels, sizeText, submitJob } from "./api.js";
import { datasetWith, modelWith, setField } from "./spec_edit.js";
import { lineOf } from "./spec_tree.js";

export { lineOf, nodeTree } from "./spec_tree.js";

const EXAMPLE = `# A short fp16 run on seeded synthetic data; YAML or JSON.
name: synthetic-fp16
model:
  name: mlp
  config:
    hidden_sizes: [64, 64]
dataset:
  name: synthetic
  config:
    task: regression
    num_samples: 2048
precision: fp16
loss_scale:
  mode: dynamic
  init_scale: 1048576
  growth_interval: 20
micro_batch_size: 32
max_steps: 60
optimizer:
  name: adamw
  lr: 0.001
`;

/** Whether `text` is read as JSON: `format` says so, or it is "auto" and the text starts with "{". */
export const isJson = (text, format = "auto") => format === "json" || (format === "auto" && text.trimStart().startsWith("{"));

/** Parse `text` as JSON when it looks like JSON (or `format` says so), else as YAML. Throws with a `line` (0-based) if known. */
export function parseSpec(text, format = "auto") {
  if (isJson(text, format)) {
    try {
      return JSON.parse(text);
    } catch (error) {
      const at = /position (\d+)/.exec(error.message);
      error.line = at ? text.slice(0, Number(at[1])).split("\n").length - 1 : 0;
      throw error;
    }
  }
  try {
    return jsyaml.load(text);
  } catch (error) {
    error.line = error.mark ? error.mark.line : 0;
    error.message = error.reason || error.message;
    throw error;
  }
}

/** The field path of a 422 item: the server's `field` (no source, no union tags), else its `loc` without "body". */
export function fieldOf(item) {
  if (Array.isArray(item.field)) return item.field;
  const loc = Array.isArray(item.loc) ? item.loc : [];
  return loc[0] === "body" ? loc.slice(1) : loc;
}

/** A path as text: model.config.hidden_sizes[0]; "(spec)" for the whole spec. */
export function pathText(path) {
  return path.reduce((text, part) => (typeof part === "number" ? `${text}[${part}]` : text ? `${text}.${part}` : String(part)), "") || "(spec)";
}

/** The marks of a 422's `detail` on the spec `text`: `{line, path, text}` each (`line` -1 when no key of the path is written). */
export function errorMarks(text, detail) {
  return detail.map((item) => {
    const path = fieldOf(item);
    return { line: lineOf(text, path), path: pathText(path), text: String(item.msg ?? "") };
  });
}

/** Render the submit form into `view`; returns a cleanup function. */
export function submitPage(view) {
  const editor = el("textarea", { id: "spec", spellcheck: "false", wrap: "off", rows: 28, dataset: { testid: "spec" }, "aria-label": "job spec" });
  editor.value = sessionStorage.getItem("halfcast-spec") || EXAMPLE;
  const gutter = el("pre", { class: "gutter", "aria-hidden": "true", dataset: { testid: "gutter" } });
  const format = el("select", { dataset: { testid: "format" } }, ["auto", "yaml", "json"].map((f) => el("option", { value: f }, f)));
  const errors = el("ul", { class: "field-errors", dataset: { testid: "errors" } });
  const status = el("p", { class: "muted", dataset: { testid: "submit-status" } });
  const button = el("button", { type: "submit", class: "primary", dataset: { testid: "submit" } }, "Submit");
  const registered = registeredPickers(useRegistered);
  const form = el("form", { class: "submit-form", onsubmit: onSubmit },
    el("h1", {}, "Submit a job"),
    el("p", { class: "muted" }, "Write the job spec in YAML or JSON. Fields the server rejects are marked next to their line."),
    el("label", {}, "Format ", format),
    registered,
    el("div", { class: "editor" }, editor, gutter),
    errors,
    el("div", { class: "actions" }, button, status),
  );
  view.replaceChildren(form);
  editor.addEventListener("scroll", () => { gutter.scrollTop = editor.scrollTop; });
  editor.addEventListener("input", () => sessionStorage.setItem("halfcast-spec", editor.value));

  function show(marks) {
    const lineCount = editor.value.split("\n").length;
    const byLine = new Map();
    for (const { line, path, text } of marks) {
      const at = line >= 0 && line < lineCount ? line : 0;
      byLine.set(at, [...(byLine.get(at) || []), `${path}: ${text}`]);
    }
    // A gutter row is one editor line high; a mark's note wraps over the rows below it (a later mark's
    // note covers it from its own line on), and the list below the editor holds every message in full.
    gutter.replaceChildren(...Array.from({ length: lineCount }, (_, i) => {
      const text = byLine.has(i) ? byLine.get(i).join("; ") : null;
      if (text === null) return el("div", {}, "\u00a0");
      return el("div", { class: "mark", title: text, dataset: { line: String(i + 1) } }, el("span", { class: "note" }, `◀ ${text}`));
    }));
    errors.replaceChildren(...marks.map(({ line, path, text }) =>
      el("li", { dataset: { path } }, el("code", {}, path), line >= 0 ? ` (line ${line + 1})` : "", ": ",
        el("span", { class: "message", dataset: { testid: "error-message" } }, text))));
    gutter.scrollTop = editor.scrollTop;
  }

  // Set the spec's `field` ("dataset" or "model") to the registered one `id`; a spec that does not parse is marked instead.
  function useRegistered(field, id) {
    show([]);
    let spec;
    try {
      spec = parseSpec(editor.value, format.value);
    } catch (error) {
      show([{ line: error.line ?? 0, path: "(syntax)", text: `${error.message} (fix the spec first)` }]);
      return;
    }
    if (spec === null || spec === undefined) spec = {};
    if (typeof spec !== "object" || Array.isArray(spec)) {
      show([{ line: 0, path: "(spec)", text: "the spec must be a mapping of fields" }]);
      return;
    }
    const value = field === "dataset" ? datasetWith(spec.dataset, id) : modelWith(spec.model, id);
    editor.value = setField(editor.value, spec, field, value, isJson(editor.value, format.value));
    sessionStorage.setItem("halfcast-spec", editor.value);
    editor.focus();
  }

  async function onSubmit(event) {
    event.preventDefault();
    show([]);
    status.textContent = "";
    let spec;
    try {
      spec = parseSpec(editor.value, format.value);
    } catch (error) {
      show([{ line: error.line ?? 0, path: "(syntax)", text: error.message }]);
      return;
    }
    if (spec === null || typeof spec !== "object" || Array.isArray(spec)) {
      show([{ line: 0, path: "(spec)", text: "the spec must be a mapping of fields" }]);
      return;
    }
    button.disabled = true;
    status.textContent = "Submitting…";
    try {
      const job = await submitJob(spec);
      sessionStorage.removeItem("halfcast-spec");
      location.hash = `#/jobs/${job.id}`;
    } catch (error) {
      if (error instanceof ApiError && error.status === 422 && Array.isArray(error.body.detail)) {
        show(errorMarks(editor.value, error.body.detail));
        status.textContent = "The server rejected the spec; nothing was stored.";
      } else {
        status.textContent = `Submit failed: ${error.message}`;
      }
    } finally {
      button.disabled = false;
    }
  }

  return () => {};
}

// The registered datasets and models, each a select (by name) and a button that puts the chosen one in the spec.
// An older API without the registry, or a failed list, leaves the pickers out.
function registeredPickers(onUse) {
  const box = el("div", { class: "registered", hidden: true, dataset: { testid: "registered" } });
  const kinds = [
    { field: "dataset", label: "Dataset", list: listDatasets, key: "datasets", page: "#/datasets",
      describe: (d) => `${d.name} (${d.format}, ${d.rows} rows, ${sizeText(d.bytes)}) · ${d.id.slice(0, 8)}` },
    { field: "model", label: "Model", list: listModels, key: "models", page: "#/models",
      describe: (m) => `${m.name} (${m.model_type}, ${sizeText(m.bytes)}) · ${m.id.slice(0, 8)}` },
  ];
  Promise.all(kinds.map(async (kind) => {
    try {
      return [kind, (await kind.list())[kind.key]];
    } catch {
      return [kind, null];
    }
  })).then((found) => {
    box.replaceChildren(...found.filter(([, items]) => items !== null).map(([kind, items]) => picker(kind, items, onUse)));
    box.hidden = box.children.length === 0;
  });
  return box;
}

function picker(kind, items, onUse) {
  const select = el("select", { dataset: { testid: `pick-${kind.field}` }, disabled: items.length === 0 },
    items.length ? el("option", { value: "" }, `choose a registered ${kind.field}…`) : el("option", { value: "" }, `none registered`),
    ...items.map((item) => el("option", { value: item.id }, kind.describe(item))));
  const use = el("button", { type: "button", disabled: true, dataset: { testid: `use-${kind.field}` },
    onclick: () => { if (select.value) onUse(kind.field, select.value); } }, `Use in spec`);
  select.addEventListener("change", () => { use.disabled = !select.value; });
  return el("div", { class: "picker" },
    el("label", {}, `${kind.label} `, select), " ", use, " ",
    el("a", { href: kind.page, class: "muted" }, items.length ? `all ${kind.field}s` : `upload one`));
}
