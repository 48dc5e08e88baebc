// Small DOM and number-formatting helpers shared by the views (no framework).

export function $(id) {
  const node = document.getElementById(id);
  if (!node) throw new Error(`the page has no #${id}`);
  return node;
}

// el("div", {class: "x", title: "y"}, child, "text", ...): an element with attributes and children.
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  setAttributes(node, attributes);
  node.append(...children.filter((child) => child !== null && child !== undefined));
  return node;
}

const SVG = "http://www.w3.org/2000/svg";

export function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  setAttributes(node, attributes);
  node.append(...children.filter((child) => child !== null && child !== undefined));
  return node;
}

function setAttributes(node, attributes) {
  for (const [name, value] of Object.entries(attributes)) {
    if (value === false || value === null || value === undefined) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
}

export function showProblem(node, message) {
  node.textContent = message || "";
  node.hidden = !message;
}

export function formatCount(value) {
  return Math.round(value).toLocaleString("en-US");
}

export function formatNumber(value, digits = 1) {
  return Number(value).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

export function formatBytes(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${formatNumber(value, value >= 100 || unit === 0 ? 0 : 1)} ${units[unit]}`;
}

export function formatMoney(value) {
  return `$${formatNumber(value, value < 10 ? 2 : 1)}`;
}

// A token's text as a cell shows it: whitespace made visible, long special tokens shortened.
export function tokenGlyph(text) {
  if (text === null || text === undefined) return "?";
  if (text === "") return "∅";
  const visible = text.replaceAll(" ", "␣").replaceAll("\n", "↵").replaceAll("\t", "⇥");
  return visible.length > 8 ? `${visible.slice(0, 7)}…` : visible;
}

export function isSpecial(text) {
  return typeof text === "string" && text.startsWith("<") && text.endsWith(">") && text.length > 2;
}
