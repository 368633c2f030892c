// Where each key and item of a YAML or JSON spec is written (the submit form's marks, spec_edit.js's block
// replacement). js-yaml (4.1.0, vendored) calls `listener` when it
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
export function unwrap(node) {
  while (node.children.length === 1 && node.children[0].result === node.result) node = node.children[0];
  return node;
}

/** `{line, node}` of `part` (a key, or an index) in the mapping or sequence `node`; null when it has none. */
export function childOf(node, part) {
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
