// The submit form: a JSON or YAML spec in a textarea; 422 field errors are shown next to the line of the field
// (the server's `field` path: no union tags) and listed in full below it.

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

// Where each key and item of a spec is written: js-yaml (4.1.0, vendored) calls `listener` when it
// opens and closes every node, nested as the document is, so the closed nodes form a tree with the
// line each node starts on. A mapping's children are its keys and values in turn, a sequence's its
// items; JSON text is YAML too and gets the same tree.

/** The node tree of `text` ({line, kind, result, children}), or null when js-yaml cannot read it. */
export function nodeTree(text) {
  const stack = [{ children: [] }];
  const listener = (event, state) => {
    if (event === "open") {
      stack.push({ line: state.line, children: [] });
      return;
    }
    const node = stack.pop();
    node.kind = state.kind;
    node.result = state.result;
    stack[stack.length - 1].children.push(node);
  };
  try {
    jsyaml.load(text, { listener });
  } catch {
    return null;
  }
  return stack[0].children.length ? stack[0].children[stack[0].children.length - 1] : null;
}

// A node read twice (js-yaml tries a value as a mapping key first) holds itself once more as its only child.
function unwrap(node) {
  while (node.children.length === 1 && node.children[0].result === node.result) node = node.children[0];
  return node;
}

/** `{line, node}` of `part` (a key, or an index) in the mapping or sequence `node`; null when it has none. */
function childOf(node, part) {
  if (node.kind === "sequence") {
    const item = Number.isInteger(part) ? node.children[part] : undefined;
    return item ? { line: item.line, node: item } : null;
  }
  if (node.kind !== "mapping" || node.children.length % 2 !== 0) return null;
  for (let i = 0; i < node.children.length; i += 2) {
    const key = node.children[i];
    if (String(key.result) === String(part)) return { line: key.line, node: node.children[i + 1] };
  }
  return null;
}

/** The 0-based line of the deepest key (or item) of `path` (["model", "config", "hidden_sizes", 0]) written in `text`; -1 for none. */
export function lineOf(text, path) {
  let node = nodeTree(text);
  let line = -1;
  for (const part of path) {
    const found = node && childOf(unwrap(node), part);
    if (!found) break;
    ({ line, node } = found);
  }
  return line;
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
