// The submit form's "use a registered dataset / model": the spec's `dataset` or `model` set to one by id, the rest of
// the text left as written. In YAML only that top-level field's block is replaced (comments elsewhere stay); JSON,
// and YAML whose top level is not a block mapping, are written out again whole.

import { nodeTree, unwrap } from "./spec_tree.js";

const isMapping = (value) => value !== null && typeof value === "object" && !Array.isArray(value);

// Fields that name where the data or weights come from: replaced by the id (`format` and `file_format` default to
// the registered dataset's, and a registered dataset takes no `column_map`). The rest of a jsonl or hf config stays.
const DATASET_SOURCE = ["path", "dataset_id", "sha256", "format", "file_format", "column_map"];
const MODEL_SOURCE = ["path", "model_id", "hf_config", "tokenizer_path"];

function withId(current, name, key, id, source) {
  if (!isMapping(current) || current.name !== name || !isMapping(current.config)) return { name, config: { [key]: id } };
  const kept = Object.entries(current.config).filter(([field]) => !source.includes(field));
  return { ...current, config: { [key]: id, ...Object.fromEntries(kept) } };
}

/** The `dataset` field naming registered dataset `id`: `{name: jsonl, config: {dataset_id}}`, a jsonl dataset's other settings kept. */
export const datasetWith = (current, id) => withId(current, "jsonl", "dataset_id", id, DATASET_SOURCE);

/** The `model` field naming registered model `id`: `{name: hf, config: {model_id}}`, an hf model's task and num_labels kept. */
export const modelWith = (current, id) => withId(current, "hf", "model_id", id, MODEL_SOURCE);

/** `text` (a spec already parsed as `spec`; JSON when `json`) with its top-level `field` set to `value`. */
export function setField(text, spec, field, value, json) {
  if (json) return `${JSON.stringify({ ...spec, [field]: value }, null, 2)}\n`;
  const block = jsyaml.dump({ [field]: value }, { lineWidth: -1 }).replace(/\n$/, "").split("\n");
  const lines = text.split("\n");
  const root = nodeTree(text);
  const top = root && unwrap(root);
  const keys = top && top.kind === "mapping" && top.children.length % 2 === 0 ? top.children.filter((_, i) => i % 2 === 0) : null;
  const blockStyle = keys && keys.every((key) => lines[key.line]?.startsWith(`${key.result}:`));
  if (!blockStyle) return jsyaml.dump({ ...spec, [field]: value }, { lineWidth: -1 });
  const at = keys.findIndex((key) => String(key.result) === field);
  if (at === -1) return `${text.replace(/\s*$/, "")}\n${block.join("\n")}\n`;
  const start = keys[at].line;
  let end = at + 1 < keys.length ? keys[at + 1].line : lines.length;
  while (end - 1 > start && /^\s*(#.*)?$/.test(lines[end - 1])) end -= 1; // comments and blank lines before the next key stay
  return [...lines.slice(0, start), ...block, ...lines.slice(end)].join("\n");
}
