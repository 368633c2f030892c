// The submit form: a JSON or YAML spec in a textarea; 422 field errors are shown next to the line of the field.

import { ApiError, el, submitJob } from "./api.js";

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

/** Parse `text` as JSON when it looks like JSON (or `format` says so), else as YAML. Throws with a `line` (0-based) if known. */
export function parseSpec(text, format = "auto") {
  const json = format === "json" || (format === "auto" && text.trimStart().startsWith("{"));
  if (json) {
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

/** The 0-based line where the field at `loc` (["body", "loss_scale", "init_scale"]) is written, or -1. */
export function lineOf(text, loc) {
  const lines = text.split("\n");
  const keys = loc.filter((part, i) => !(i === 0 && part === "body") && typeof part === "string");
  let line = 0;
  let found = -1;
  for (const key of keys) {
    const escaped = key.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    const pattern = new RegExp(`(^|[\\s{,\\-])("${escaped}"|'${escaped}'|${escaped})\\s*:`);
    const at = lines.findIndex((l, i) => i >= line && pattern.test(l.replace(/#.*$/, "")));
    if (at < 0) break;
    found = line = at;
  }
  return found;
}

function fieldPath(loc) {
  const parts = loc[0] === "body" ? loc.slice(1) : loc;
  return parts.reduce((path, part) => (typeof part === "number" ? `${path}[${part}]` : path ? `${path}.${part}` : String(part)), "") || "(spec)";
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
  const form = el("form", { class: "submit-form", onsubmit: onSubmit },
    el("h1", {}, "Submit a job"),
    el("p", { class: "muted" }, "Write the job spec in YAML or JSON. Fields the server rejects are marked next to their line."),
    el("label", {}, "Format ", format),
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
    gutter.replaceChildren(...Array.from({ length: lineCount }, (_, i) =>
      el("div", { class: byLine.has(i) ? "mark" : "", dataset: byLine.has(i) ? { line: String(i + 1) } : {} },
        byLine.has(i) ? `◀ ${byLine.get(i).join("; ")}` : "\u00a0")));
    errors.replaceChildren(...marks.map(({ line, path, text }) =>
      el("li", { dataset: { path } }, el("code", {}, path), line >= 0 ? ` (line ${line + 1})` : "", `: ${text}`)));
    gutter.scrollTop = editor.scrollTop;
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
        show(error.body.detail.map((d) => ({ line: lineOf(editor.value, d.loc), path: fieldPath(d.loc), text: d.msg })));
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
