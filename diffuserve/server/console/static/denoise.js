// The denoising view: each block of an answer as a row of cells, one per position, showing the mask until a
// step decides it, coloured by the step (of its block) that did; per block its forwards and tokens per forward;
// and a replay of a finished answer step by step. Fed by the server's denoising stream extension
// (stream_options.include_denoising): one entry per forward, with the positions it decided and their tokens.
// Under decoder=verified a block's tokens are drafts until the causal check of the forward that commits the block
// (an entry of its own, with `check`): kept drafts are marked verified, rejected ones stay struck through in red
// until the block is redrafted over them, and the causal token written at the first rejection is marked as such.

import { $, el, formatNumber, isSpecial, tokenGlyph } from "./dom.js";

const PALETTE = 8; // colours s1..s8; later steps share the last
const REPLAY_MS = 350;

// One answer's steps, as the stream delivered them.
export class Trace {
  constructor(prompt) {
    this.prompt = prompt;
    this.steps = [];
    this.answerLength = null; // known once finished: positions past it were decided after a stop
    this.usage = null;
  }

  add(steps) {
    this.steps.push(...steps.filter((step) => step.index === 0));
  }

  finish(usage) {
    this.usage = usage;
    this.answerLength = usage ? usage.completion_tokens : null;
  }
}

// Blocks as of the first `count` steps: {block, start, end, forwards, kept, rejected, cells: Map(position -> cell)}.
// `forwards` counts the block's denoising (drafting) steps; `kept` and `rejected` its checked drafts.
function blocksAt(trace, count) {
  const blocks = new Map();
  trace.steps.slice(0, count).forEach((step, i) => {
    let block = blocks.get(step.block);
    if (!block) {
      block = { block: step.block, start: step.block_start, end: step.block_end, forwards: 0, kept: 0, rejected: 0 };
      block.cells = new Map();
      blocks.set(step.block, block);
    }
    if (step.check) {
      applyCheck(block, step, i + 1);
      return;
    }
    block.forwards += 1;
    step.positions.forEach((position, j) => {
      const previous = block.cells.get(position);
      const token = step.token_ids[j];
      block.cells.set(position, {
        token,
        text: step.tokens ? step.tokens[j] : String(token),
        step: step.step,
        forward: i + 1,
        edited: previous !== undefined && previous.check !== "rejected" && previous.token !== token,
        rejectedBefore: previous ? previous.rejectedBefore : [],
      });
    });
  });
  return [...blocks.values()].sort((a, b) => a.block - b.block);
}

// A causal check of the block's draft: kept drafts become verified, rejected ones are marked (their drafted
// token kept for display until a redraft overwrites it), the causal token replaces the first rejected one.
function applyCheck(block, step, forward) {
  const check = step.check;
  block.kept += check.accepted_positions.length;
  block.rejected += check.rejected_positions.length;
  for (const position of check.accepted_positions) {
    const cell = block.cells.get(position);
    if (cell) block.cells.set(position, { ...cell, check: "kept" });
  }
  check.rejected_positions.forEach((position, j) => {
    const previous = block.cells.get(position);
    const text = check.rejected_tokens ? check.rejected_tokens[j] : String(check.rejected_token_ids[j]);
    block.cells.set(position, {
      token: check.rejected_token_ids[j],
      text,
      step: step.step,
      forward,
      check: "rejected",
      rejectedBefore: [...(previous ? previous.rejectedBefore : []), text],
    });
  });
  if (check.causal_position !== null) {
    const j = step.positions.indexOf(check.causal_position);
    const rejected = block.cells.get(check.causal_position);
    block.cells.set(check.causal_position, {
      token: step.token_ids[j],
      text: step.tokens ? step.tokens[j] : String(step.token_ids[j]),
      step: step.step,
      forward,
      check: "causal",
      rejectedBefore: rejected.rejectedBefore,
    });
  }
}

export class DenoisingView {
  constructor() {
    this.trace = null;
    this.shown = 0;
    this.timer = null;
    this.live = false;
    this.blocksNode = $("denoise-blocks");
    this.summary = $("denoise-summary");
    this.slider = $("replay-step");
    this.label = $("replay-label");
    this.play = $("replay-play");
    this.first = $("replay-first");
    this.last = $("replay-last");
    this.play.addEventListener("click", () => this.togglePlay());
    this.first.addEventListener("click", () => this.show(0));
    this.last.addEventListener("click", () => this.show(this.total));
    this.slider.addEventListener("input", () => this.show(Number(this.slider.value)));
    this.renderLegend(4);
  }

  get total() {
    return this.trace ? this.trace.steps.length : 0;
  }

  // A new answer begins streaming into the view.
  begin(trace) {
    this.stopPlaying();
    this.trace = trace;
    this.live = true;
    this.shown = 0;
    this.render();
  }

  // New steps arrived for the live answer.
  update() {
    if (!this.live) return;
    this.shown = this.total;
    this.render();
  }

  end() {
    this.live = false;
    this.shown = this.total;
    this.render();
  }

  // Shows a finished answer (from the transcript) at its last step.
  load(trace) {
    this.stopPlaying();
    this.trace = trace;
    this.live = false;
    this.shown = this.total;
    this.render();
  }

  show(count) {
    this.stopPlaying();
    this.shown = Math.max(0, Math.min(count, this.total));
    this.render();
  }

  togglePlay() {
    if (this.timer !== null) {
      this.stopPlaying();
      this.render();
      return;
    }
    if (this.shown >= this.total) this.shown = 0;
    this.timer = setInterval(() => {
      this.shown += 1;
      if (this.shown >= this.total) this.stopPlaying();
      this.render();
    }, REPLAY_MS);
    this.render();
  }

  stopPlaying() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  render() {
    const trace = this.trace;
    const idle = !trace || this.live;
    for (const control of [this.play, this.first, this.last, this.slider]) control.disabled = idle || !this.total;
    this.play.textContent = this.timer !== null ? "Pause" : "Replay";
    this.slider.max = String(this.total);
    this.slider.value = String(this.shown);
    this.label.textContent = `step ${this.shown} of ${this.total}`;
    if (!trace) return;
    const blocks = blocksAt(trace, this.shown);
    this.summary.textContent = this.describe(blocks);
    const verified = trace.steps.some((step) => step.check);
    this.renderLegend(Math.max(1, ...blocks.map((b) => b.forwards)), verified);
    this.blocksNode.replaceChildren(...blocks.map((block) => this.renderBlock(block)));
  }

  describe(blocks) {
    const trace = this.trace;
    const quoted = trace.prompt.length > 60 ? `${trace.prompt.slice(0, 57)}…` : trace.prompt;
    if (!this.total) return `“${quoted}”: waiting for the first step…`;
    const usage = trace.usage;
    const where = this.live ? "streaming" : `step ${this.shown} of ${this.total}`;
    const tokens = usage
      ? `${usage.completion_tokens} tokens in ${usage.num_forwards} forwards (TPF ${formatNumber(usage.tokens_per_forward, 2)})`
      : `${this.total} forwards so far`;
    const kept = blocks.reduce((sum, b) => sum + b.kept, 0);
    const checked = kept + blocks.reduce((sum, b) => sum + b.rejected, 0);
    const drafts = checked ? `, ${kept} of ${checked} checked drafts kept` : "";
    return `“${quoted}”: ${tokens}, ${blocks.length} block${blocks.length === 1 ? "" : "s"}${drafts}; ${where}.`;
  }

  renderBlock(block) {
    const limit = this.trace.answerLength;
    const cells = [];
    let decided = 0;
    for (let position = block.start; position < block.end; position += 1) {
      const cell = block.cells.get(position);
      const past = limit !== null && position >= limit;
      if (cell && !past && cell.check !== "rejected") decided += 1;
      cells.push(this.renderCell(position, cell, past));
    }
    const tpf = block.forwards ? decided / block.forwards : 0;
    const checked = block.kept + block.rejected;
    const meta = el(
      "div",
      { class: "block-meta" },
      `block ${block.block} · ${block.forwards} forward${block.forwards === 1 ? "" : "s"} · ` +
        `${decided} token${decided === 1 ? "" : "s"} · TPF ${formatNumber(tpf, 2)}` +
        (checked ? ` · drafts kept ${block.kept} of ${checked}` : ""),
    );
    return el("div", { class: "block", "data-block": block.block }, meta, el("div", { class: "cells" }, ...cells));
  }

  renderCell(position, cell, past) {
    if (!cell) {
      return el("span", { class: `cell mask${past ? " past" : ""}`, title: `position ${position}: still masked` }, "·");
    }
    const classes = ["cell", `s${Math.min(cell.step, PALETTE)}`];
    if (past) classes.push("past");
    if (cell.edited) classes.push("edited");
    if (cell.check) classes.push(cell.check);
    if (!cell.check && cell.rejectedBefore.length) classes.push("redrafted");
    if (isSpecial(cell.text)) classes.push("special");
    const attributes = { class: classes.join(" "), title: cellTitle(position, cell, past), "data-position": position };
    attributes["data-step"] = cell.step;
    if (cell.check) attributes["data-check"] = cell.check;
    return el("span", attributes, tokenGlyph(cell.text));
  }

  renderLegend(steps, verified = false) {
    const shown = Math.min(steps, PALETTE);
    const swatches = [];
    for (let step = 1; step <= shown; step += 1) {
      const label = step === PALETTE && steps > PALETTE ? `${step}+` : String(step);
      swatches.push(el("span", { class: `cell s${step}`, title: `decided at step ${label} of its block` }, label));
    }
    const checks = verified
      ? [
          el("span", { class: "cell s1 kept", title: "a draft the causal check kept" }, "a"),
          "kept draft",
          el("span", { class: "cell s1 rejected", title: "a draft the causal check rejected" }, "a"),
          "rejected draft",
          el("span", { class: "cell s1 causal", title: "the causal token written at the first rejection" }, "a"),
          "causal token",
        ]
      : [];
    $("denoise-legend").replaceChildren(
      "step of its block:",
      ...swatches,
      el("span", { class: "cell mask", title: "not decided yet" }, "·"),
      "masked",
      ...checks,
    );
  }
}

const CHECKED = {
  kept: "a draft the causal check kept",
  rejected: "a draft the causal check rejected (the block is drafted again from here)",
  causal: "written by the causal check in place of the rejected draft",
};

function cellTitle(position, cell, past) {
  let title = `position ${position}: ${JSON.stringify(cell.text)} (token ${cell.token}), `;
  title += `${cell.check === "kept" ? "drafted" : "decided"} at step ${cell.step} of its block (forward ${cell.forward})`;
  if (cell.check) title += `: ${CHECKED[cell.check]}`;
  const earlier = cell.check === "rejected" ? cell.rejectedBefore.slice(0, -1) : cell.rejectedBefore;
  if (earlier.length) title += `; rejected drafts here before: ${earlier.map((t) => JSON.stringify(t)).join(", ")}`;
  return title + (past ? ", after the answer ended" : "");
}
