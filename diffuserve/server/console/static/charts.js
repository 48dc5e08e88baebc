// The planner's two charts as SVG: a stacked bar of memory per device, and sequences that fit against the context
// length (the hybrid model beside its full-attention equivalent). They draw the numbers the server's planner
// computed (POST /plan); nothing here computes a plan.

import { el, formatBytes, formatCount, svg } from "./dom.js";

const WIDTH = 640;
const PART_LABELS = {
  weights: "weights (attention, dense, embeddings)",
  experts: "routed experts",
  "K/V": "K/V of the planned sequences",
  state: "recurrent state",
  activations: "activations + logits",
  runtime: "runtime",
  free: "free",
};
const MAX_BARS = 8;

function partClass(name) {
  return `part-${name === "K/V" ? "kv" : name}`;
}

// parts: [{name, bytes}] of one device, bottom to top; every one of `devices` devices holds the same.
export function memoryBars(container, parts, devices) {
  const total = parts.reduce((sum, part) => sum + Math.max(0, part.bytes), 0);
  const bars = Math.min(devices, MAX_BARS);
  const rowHeight = 26;
  const left = 70;
  const height = bars * rowHeight + 8;
  const chart = svg("svg", { viewBox: `0 0 ${WIDTH} ${height}`, role: "img", "aria-label": "Memory per device" });
  for (let device = 0; device < bars; device += 1) {
    const y = 4 + device * rowHeight;
    chart.append(svg("text", { x: 0, y: y + 16 }, `GPU ${device}`));
    let x = left;
    for (const part of parts) {
      const width = total > 0 ? (Math.max(0, part.bytes) / total) * (WIDTH - left) : 0;
      if (width <= 0) continue;
      const rect = svg("rect", { x, y, width, height: rowHeight - 6, class: partClass(part.name) });
      rect.append(svg("title", {}, `${PART_LABELS[part.name] || part.name}: ${formatBytes(part.bytes)}`));
      chart.append(rect);
      x += width;
    }
  }
  const note = devices > MAX_BARS ? el("p", { class: "muted" }, `${devices} devices, each the same as these.`) : null;
  const legend = el(
    "div",
    { class: "chart-legend" },
    ...parts.map((part) =>
      el(
        "span",
        { "data-part": part.name },
        el("span", { class: `swatch ${partClass(part.name)}` }),
        `${PART_LABELS[part.name] || part.name} ${formatBytes(part.bytes)}`,
      ),
    ),
  );
  container.replaceChildren(chart, legend, ...(note ? [note] : []));
}

// A log scale that keeps 0: y = log10(1 + v).
function symlog(value) {
  return Math.log10(1 + Math.max(0, value));
}

// points: [{context_length, sequences, full_attention_sequences}]; `planned`: the plan's own context.
export function fitCurve(container, points, planned) {
  const margin = { left: 52, right: 16, top: 14, bottom: 40 };
  const height = 300;
  const plotW = WIDTH - margin.left - margin.right;
  const plotH = height - margin.top - margin.bottom;
  const xs = points.map((p) => Math.log2(p.context_length));
  const [xMin, xMax] = [Math.min(...xs), Math.max(...xs)];
  const top = Math.max(1, ...points.map((p) => Math.max(p.sequences, p.full_attention_sequences || 0)));
  const yMax = Math.ceil(symlog(top));
  const x = (context) => margin.left + (xMax > xMin ? ((Math.log2(context) - xMin) / (xMax - xMin)) * plotW : plotW / 2);
  const y = (value) => margin.top + plotH - (symlog(value) / yMax) * plotH;
  const chart = svg("svg", {
    viewBox: `0 0 ${WIDTH} ${height}`,
    role: "img",
    "aria-label": "Sequences that fit against the context length",
  });
  for (let power = 0; power <= yMax; power += 1) {
    const value = power === 0 ? 0 : 10 ** power;
    chart.append(svg("line", { x1: margin.left, x2: WIDTH - margin.right, y1: y(value), y2: y(value), class: "grid" }));
    chart.append(svg("text", { x: margin.left - 6, y: y(value) + 4, "text-anchor": "end" }, formatCount(value)));
  }
  for (const point of points) {
    const label = point.context_length >= 1024 ? `${Math.round(point.context_length / 1024)}K` : point.context_length;
    chart.append(svg("text", { x: x(point.context_length), y: height - 22, "text-anchor": "middle" }, String(label)));
  }
  chart.append(svg("text", { x: margin.left + plotW / 2, y: height - 4, "text-anchor": "middle", class: "muted" }, "context length (tokens)"));
  chart.append(svg("line", { x1: x(planned), x2: x(planned), y1: margin.top, y2: margin.top + plotH, class: "marker" }));
  const series = [["sequences", "hybrid"]];
  if (points.some((p) => p.full_attention_sequences !== null)) series.push(["full_attention_sequences", "full"]);
  for (const [field, kind] of series) {
    const path = points.map((p, i) => `${i ? "L" : "M"}${x(p.context_length).toFixed(1)},${y(p[field]).toFixed(1)}`);
    chart.append(svg("path", { d: path.join(" "), class: `line-${kind}` }));
    for (const point of points) {
      const dot = svg("circle", { cx: x(point.context_length), cy: y(point[field]), r: 3.5, class: `dot-${kind}` });
      dot.append(svg("title", {}, `${formatCount(point[field])} sequences of ${formatCount(point.context_length)} tokens`));
      chart.append(dot);
    }
  }
  const legend = el(
    "div",
    { class: "chart-legend" },
    el("span", {}, el("span", { class: "swatch line-hybrid" }), "this model"),
    series.length > 1 ? el("span", {}, el("span", { class: "swatch line-full" }), "the same model with full attention in every layer") : null,
    el("span", { class: "muted" }, `dashed line: the planned context (${formatCount(planned)} tokens)`),
  );
  container.replaceChildren(chart, legend);
}
