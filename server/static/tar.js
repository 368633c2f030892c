// An uncompressed tar of browser files, for uploading a model directory (POST /models takes a tar; a browser
// cannot make one). POSIX ustar: a 512-byte header per file (octal fields, a checksum), the file's bytes padded to
// 512, two zero blocks at the end. A name that does not fit ustar's name and prefix fields, or is not ASCII, and a
// file of 8 GiB or more get a pax header ("path=", "size=") first, as Python's tarfile and GNU tar write them.
// The archive is a Blob of the headers and the File objects themselves, so nothing is read into memory.

const BLOCK = 512;
/** Largest value of an 11-digit octal field (8 GiB - 1). */
const MAX_OCTAL = 8 ** 11 - 1;
const encoder = new TextEncoder();

/** `value` as `width - 1` octal digits and a NUL. */
function octal(value, width) {
  return `${value.toString(8).padStart(width - 1, "0")}\0`;
}

/** A 512-byte header for `name` (bytes: UTF-8), `size`, `mtime` (seconds) and `type` ("0" a file, "x" pax records). */
function header(name, size, mtime, type, prefix = new Uint8Array(0)) {
  const block = new Uint8Array(BLOCK);
  const put = (offset, value) => block.set(typeof value === "string" ? encoder.encode(value) : value, offset);
  put(0, name);
  put(100, octal(0o644, 8));
  put(108, octal(0, 8));
  put(116, octal(0, 8));
  put(124, octal(size, 12));
  put(136, octal(mtime, 12));
  put(148, "        "); // the checksum counts its own field as spaces
  put(156, type);
  put(257, "ustar\u000000");
  put(345, prefix);
  const sum = block.reduce((total, byte) => total + byte, 0);
  put(148, `${sum.toString(8).padStart(6, "0")}\0 `);
  return block;
}

/** One pax record, "<length> <key>=<value>\n", its length counting its own digits. */
function paxRecord(key, value) {
  const rest = encoder.encode(` ${key}=${value}\n`).length;
  let length = rest;
  while (length !== rest + String(length).length) length = rest + String(length).length;
  return `${length} ${key}=${value}\n`;
}

/** `[prefix, name]` (bytes) of an ASCII `path` that fits ustar's fields (155 + 100 bytes, split at a "/"); null if none does. */
function ustarName(path) {
  if (!/^[\x20-\x7e]*$/.test(path)) return null;
  if (path.length <= 100) return [new Uint8Array(0), encoder.encode(path)];
  for (let cut = path.indexOf("/"); cut !== -1; cut = path.indexOf("/", cut + 1)) {
    if (cut <= 155 && path.length - cut - 1 <= 100 && cut < path.length - 1) {
      return [encoder.encode(path.slice(0, cut)), encoder.encode(path.slice(cut + 1))];
    }
  }
  return null;
}

const padding = (size) => new Uint8Array((BLOCK - (size % BLOCK)) % BLOCK);

/** The header blocks of one file entry: a pax header first when the name or size needs one. */
export function entryHeaders(path, size, mtime = 0) {
  const seconds = Math.min(Math.max(0, Math.floor(mtime)), MAX_OCTAL);
  const fits = ustarName(path);
  const records = (fits ? "" : paxRecord("path", path)) + (size > MAX_OCTAL ? paxRecord("size", String(size)) : "");
  const [prefix, name] = fits || [new Uint8Array(0), encoder.encode(path.replace(/[^\x20-\x7e]/g, "_").slice(-100))];
  const entry = header(name, size > MAX_OCTAL ? 0 : size, seconds, "0", prefix);
  if (!records) return [entry];
  const pax = encoder.encode(records);
  return [header("././@PaxHeader", pax.length, seconds, "x"), pax, padding(pax.length), entry];
}

/**
 * A tar (Blob) of `entries`: `[{name, file}]`, `name` the path in the archive ("model/config.json"), `file` a File
 * or Blob (a File's lastModified is its time). Names are used as given: no directories of their own are written.
 */
export function tarBlob(entries) {
  const parts = [];
  for (const { name, file } of entries) {
    parts.push(...entryHeaders(name, file.size, (file.lastModified ?? 0) / 1000), file, padding(file.size));
  }
  parts.push(new Uint8Array(2 * BLOCK));
  return new Blob(parts, { type: "application/x-tar" });
}

/** The entries of a directory chosen with `<input type=file webkitdirectory>`: each file at its path under the directory. */
export function directoryEntries(files) {
  return Array.from(files, (file) => ({ name: file.webkitRelativePath || file.name, file }))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}
