// Live metrics: the server's own Prometheus series (GET /metrics, public), read every REFRESH_MS: requests
// running and waiting, generated tokens/s, TPF of the completions that finished lately, K/V pages and (hybrid
// models) state slots in use. Works with either series prefix (`diffuserve:` or, with --metrics-vllm-names,
// `vllm:`).

import { getText } from "./api.js";
import { $, formatCount, formatNumber } from "./dom.js";

const REFRESH_MS = 1500;
const TPF_WINDOW_MS = 30000;

// {series name without prefix: value summed over its label sets; name{labels}: that label set's value}
export function parseMetrics(text) {
  const values = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^(?:diffuserve:|vllm:)([A-Za-z_][\w]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const [, name, labels, value] = match;
    values[name] = (values[name] || 0) + Number(value);
    if (labels) values[name + labels] = (values[name + labels] || 0) + Number(value);
  }
  return values;
}

export class LiveMetrics {
  constructor() {
    this.samples = []; // {time, values}, oldest first, the last TPF_WINDOW_MS
    this.status = $("m-status");
  }

  start() {
    const tick = async () => {
      await this.poll();
      setTimeout(tick, REFRESH_MS);
    };
    tick();
  }

  async poll() {
    let values;
    try {
      values = parseMetrics(await getText("/metrics"));
    } catch (error) {
      this.status.textContent = `metrics unavailable (${error.message.split(":")[0]}); retrying`;
      return;
    }
    const now = performance.now();
    this.samples.push({ time: now, values });
    while (this.samples.length > 2 && now - this.samples[0].time > TPF_WINDOW_MS) this.samples.shift();
    this.render(values);
    this.status.textContent = `every ${REFRESH_MS / 1000} s`;
  }

  render(values) {
    $("m-running").textContent = formatCount(values.num_requests_running || 0);
    $("m-waiting").textContent = formatCount(values.num_requests_waiting || 0);
    $("m-tokens").textContent = this.tokensPerSecond();
    $("m-tpf").textContent = this.tokensPerForward(values);
    const total = values.kv_cache_pages_total || 0;
    $("m-pages").textContent = total
      ? `${formatCount(values.kv_cache_pages_used || 0)} / ${formatCount(total)}`
      : `${formatNumber(100 * (values.kv_cache_usage_perc || 0), 0)} %`;
    const slots = values.state_slots_total || 0;
    $("m-slots-item").hidden = !slots;
    if (slots) $("m-slots").textContent = `${formatCount(values.state_slots_used || 0)} / ${formatCount(slots)}`;
    this.renderAuto();
  }

  // decoder=auto: which mode its steps took between the last two readings (drafting, or one token each).
  renderAuto() {
    const n = this.samples.length;
    const steps = (s, mode) => (s.values[`auto_decoding_steps_total{mode="${mode}"}`] || 0);
    const [a, b] = [this.samples[Math.max(0, n - 2)], this.samples[n - 1]];
    const drafting = steps(b, "verified") - (n > 1 ? steps(a, "verified") : 0);
    const single = steps(b, "autoregressive") - (n > 1 ? steps(a, "autoregressive") : 0);
    const seen = steps(b, "verified") + steps(b, "autoregressive") > 0;
    $("m-auto-item").hidden = !seen;
    if (!seen) return;
    if (drafting + single === 0) $("m-auto").textContent = "idle";
    else $("m-auto").textContent = `${formatCount(drafting)} drafting / ${formatCount(single)} autoregressive steps`;
  }

  // Generated tokens per second between the last two readings.
  tokensPerSecond() {
    const n = this.samples.length;
    if (n < 2) return "–";
    const [a, b] = [this.samples[n - 2], this.samples[n - 1]];
    const tokens = (b.values.generation_tokens_total || 0) - (a.values.generation_tokens_total || 0);
    return formatNumber(Math.max(0, tokens) / ((b.time - a.time) / 1000), 1);
  }

  // TPF of the completions that finished in the window; since the start when none did.
  tokensPerForward(values) {
    const first = this.samples[0].values;
    const count = (values.tokens_per_forward_count || 0) - (first.tokens_per_forward_count || 0);
    const sum = (values.tokens_per_forward_sum || 0) - (first.tokens_per_forward_sum || 0);
    if (count > 0) return formatNumber(sum / count, 2);
    const all = values.tokens_per_forward_count || 0;
    return all ? formatNumber(values.tokens_per_forward_sum / all, 2) : "–";
  }
}
