// The chat view: a conversation with the served model through /v1/chat/completions (streamed; the server applies
// the model's chat template), with the system prompt, temperature, max tokens, decoder, threshold, stop strings
// and a JSON-schema answer mode. Reasoning (`reasoning_content`) is folded away under its own summary. Every
// answer streams its denoising steps too (stream_options.include_denoising) into the denoising view.

import { ApiError, streamSSE } from "./api.js";
import { $, el, formatNumber, showProblem } from "./dom.js";
import { Trace } from "./denoise.js";

export class Chat {
  constructor(config, denoising, openDenoising) {
    this.config = config;
    this.denoising = denoising;
    this.openDenoising = openDenoising;
    this.history = []; // {role, content} of finished exchanges
    this.abort = null;
    this.input = $("chat-input");
    this.transcript = $("transcript");
    this.problem = $("chat-problem");
    this.fillSettings(config);
    $("chat-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.send();
      }
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && this.abort) this.abort.abort();
    });
    $("chat-stop").addEventListener("click", () => this.abort && this.abort.abort());
    $("chat-clear").addEventListener("click", () => this.clear());
    $("set-json").addEventListener("change", () => {
      $("set-schema").hidden = !$("set-json").checked;
    });
  }

  fillSettings(config) {
    const decoder = $("set-decoder");
    decoder.replaceChildren(...config.decoders.map((name) => el("option", { value: name }, name)));
    decoder.value = config.defaults.decoder;
    $("set-temperature").value = String(config.defaults.temperature);
    $("set-threshold").value = String(config.defaults.threshold);
    $("set-max-tokens").max = String(config.max_model_len);
  }

  clear() {
    if (this.abort) this.abort.abort();
    this.history = [];
    this.transcript.replaceChildren();
    showProblem(this.problem, "");
    this.input.focus();
  }

  // The request body for `text` after the history, from the settings; throws an ApiError for a setting that
  // cannot be sent.
  body(text) {
    const system = $("set-system").value.trim();
    const messages = [...(system ? [{ role: "system", content: system }] : []), ...this.history];
    messages.push({ role: "user", content: text });
    const body = {
      model: this.config.model,
      messages,
      stream: true,
      stream_options: { include_usage: true, include_denoising: true },
      decoder: $("set-decoder").value,
    };
    setNumber(body, "temperature", $("set-temperature").value);
    setNumber(body, "threshold", $("set-threshold").value);
    setNumber(body, "max_completion_tokens", $("set-max-tokens").value);
    const stops = $("set-stop").value.split("\n").filter((line) => line !== "");
    if (stops.length) body.stop = stops;
    if ($("set-json").checked) body.response_format = jsonSchemaFormat($("set-schema").value);
    return body;
  }

  async send() {
    if (this.abort) return; // one answer at a time
    const text = this.input.value.trim();
    if (!text) {
      showProblem(this.problem, "Type a message first: there is nothing to send.");
      this.input.focus();
      return;
    }
    let body;
    try {
      body = this.body(text);
    } catch (error) {
      showProblem(this.problem, error.message);
      return;
    }
    showProblem(this.problem, "");
    document.getElementById("chat-hint")?.remove(); // the first message replaces the hint
    this.input.value = "";
    this.transcript.append(el("div", { class: "message user" }, el("div", { class: "content" }, text)));
    const reply = new Reply(text);
    this.transcript.append(reply.node);
    reply.node.querySelector(".show-denoising").addEventListener("click", () => {
      this.denoising.load(reply.trace);
      this.openDenoising();
    });
    this.denoising.begin(reply.trace);
    await this.stream(body, text, reply);
  }

  async stream(body, text, reply) {
    this.abort = new AbortController();
    this.setBusy(true);
    const started = performance.now();
    try {
      await streamSSE("/v1/chat/completions", body, (event) => this.onEvent(event, reply), this.abort.signal);
      reply.finish(performance.now() - started);
      this.history.push({ role: "user", content: text }, { role: "assistant", content: reply.content });
    } catch (error) {
      const stopped = error.name === "AbortError";
      reply.interrupt(stopped ? "stopped" : "not finished");
      if (!stopped) showProblem(this.problem, describe(error));
      if (!stopped && !reply.content && !this.input.value) this.input.value = text; // ready to retry
    } finally {
      this.denoising.end();
      this.abort = null;
      this.setBusy(false);
      this.transcript.scrollTop = this.transcript.scrollHeight;
    }
  }

  onEvent(event, reply) {
    if (event.denoising) {
      reply.trace.add(event.denoising);
      this.denoising.update();
    }
    if (event.usage) reply.trace.finish(event.usage);
    for (const choice of event.choices || []) {
      if (choice.index !== 0) continue;
      reply.append(choice.delta || {});
      if (choice.finish_reason) reply.finishReason = choice.finish_reason;
    }
    this.transcript.scrollTop = this.transcript.scrollHeight;
  }

  setBusy(busy) {
    $("chat-send").disabled = busy;
    $("chat-stop").hidden = !busy;
    if (!busy) this.input.focus();
  }
}

// One assistant message as it streams: content, folded reasoning, and a line of numbers once finished.
class Reply {
  constructor(prompt) {
    this.trace = new Trace(prompt);
    this.content = "";
    this.reasoning = "";
    this.finishReason = null;
    this.contentNode = el("div", { class: "content" });
    this.reasoningNode = el("div");
    this.reasoningSummary = el("summary", {}, "Reasoning");
    this.details = el("details", { class: "reasoning", hidden: true }, this.reasoningSummary, this.reasoningNode);
    this.meta = el("div", { class: "meta" }, "…");
    const show = el("button", { type: "button", class: "show-denoising" }, "Show denoising");
    this.node = el("div", { class: "message assistant streaming" }, this.details, this.contentNode, this.meta, show);
  }

  append(delta) {
    if (delta.reasoning_content) {
      this.reasoning += delta.reasoning_content;
      this.reasoningNode.textContent = this.reasoning;
      this.reasoningSummary.textContent = `Reasoning (${this.reasoning.length} characters)`;
      this.details.hidden = false;
    }
    if (delta.content) {
      this.content += delta.content;
      this.contentNode.textContent = this.content;
    }
  }

  finish(milliseconds) {
    this.node.classList.remove("streaming");
    const usage = this.trace.usage;
    const numbers = usage
      ? `${usage.completion_tokens} tokens · ${usage.num_forwards} forwards · TPF ` +
        `${formatNumber(usage.tokens_per_forward, 2)} · `
      : "";
    this.meta.textContent = `${numbers}${formatNumber(milliseconds / 1000, 2)} s · ${this.finishReason || "done"}`;
    this.meta.dataset.seconds = String(milliseconds / 1000);
    if (!this.content && !this.reasoning) this.contentNode.textContent = "(empty answer)";
  }

  interrupt(why) {
    this.node.classList.remove("streaming");
    this.meta.textContent = `(${why})`;
  }
}

function setNumber(body, field, value) {
  if (value.trim() === "") return;
  const number = Number(value);
  if (!Number.isFinite(number)) throw new ApiError(`${field}: ${JSON.stringify(value)} is not a number`);
  body[field] = number;
}

function jsonSchemaFormat(text) {
  let schema;
  try {
    schema = JSON.parse(text);
  } catch (error) {
    throw new ApiError(`JSON schema: not valid JSON (${error.message}); fix it or untick the JSON answer mode`);
  }
  return { type: "json_schema", json_schema: { name: "answer", schema } };
}

function describe(error) {
  return error instanceof ApiError ? error.message : `Something went wrong in the page: ${error.message}`;
}
