// The planner view: a deployment in, the planner's answer out. The server runs `diffuserve plan` (POST /plan) and
// this page only shows its numbers: sequences that fit, tokens/s, $ per 1M tokens, memory per device, and
// sequences that fit against the context length.

import { getJSON, postJSON } from "./api.js";
import { fitCurve, memoryBars } from "./charts.js";
import { $, el, formatCount, formatMoney, formatNumber, showProblem } from "./dom.js";

const FIELDS = {
  num_gpus: "plan-gpus",
  tensor_parallel_size: "plan-tp",
  expert_parallel_size: "plan-ep",
  context_length: "plan-context",
  concurrency: "plan-concurrency",
};

export class PlannerView {
  constructor() {
    this.problem = $("plan-problem");
    this.result = $("plan-result");
    $("plan-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.plan();
    });
  }

  async init() {
    try {
      const presets = await getJSON("/plan/presets");
      const served = presets.served_model;
      const models = presets.models.map((name) => el("option", { value: name }, name));
      if (!presets.models.includes(served)) models.push(el("option", { value: served }, `${served} (served)`));
      $("plan-model").replaceChildren(...models);
      $("plan-model").value = presets.default_model;
      $("plan-hardware").replaceChildren(...presets.hardware.map((name) => el("option", { value: name }, name)));
      $("plan-hardware").value = presets.default_hardware;
      const weights = presets.weight_dtypes.map((name) => el("option", { value: name }, name));
      $("plan-weight-dtype").replaceChildren(el("option", { value: "" }, "default (bf16)"), ...weights);
      $("plan-kv-dtype").replaceChildren(...presets.kv_cache_dtypes.map((name) => el("option", { value: name }, name)));
    } catch (error) {
      showProblem(this.problem, `The planner's presets could not be loaded: ${error.message}`);
    }
  }

  body() {
    const body = { model: $("plan-model").value, hardware: $("plan-hardware").value };
    if ($("plan-weight-dtype").value) body.weight_dtype = $("plan-weight-dtype").value;
    body.kv_cache_dtype = $("plan-kv-dtype").value || "auto";
    for (const [field, id] of Object.entries(FIELDS)) {
      const text = $(id).value.trim();
      if (text === "") continue;
      const number = Number(text);
      if (!Number.isInteger(number) || number < 1) {
        throw new Error(`${$(id).labels[0].textContent}: ${JSON.stringify(text)} is not a whole number of at least 1`);
      }
      body[field] = number;
    }
    return body;
  }

  async plan() {
    let body;
    try {
      body = this.body();
    } catch (error) {
      showProblem(this.problem, error.message);
      return;
    }
    const button = $("plan-submit");
    button.disabled = true;
    try {
      const answer = await postJSON("/plan", body);
      showProblem(this.problem, "");
      this.render(answer);
    } catch (error) {
      this.result.hidden = true;
      showProblem(this.problem, `No plan: ${error.message}`);
    } finally {
      button.disabled = false;
    }
  }

  render(answer) {
    const plan = answer.plan;
    const context = plan.workload.context_length;
    $("plan-fit").textContent = formatCount(answer.sequences_that_fit);
    $("plan-fit-label").textContent = `sequences fit at ${formatCount(context)} tokens`;
    $("plan-tokens").textContent = formatNumber(plan.decode.tokens_per_s_total, 0);
    $("plan-seq-tokens").textContent = formatNumber(plan.decode.tokens_per_s_per_seq, 1);
    $("plan-cloud").textContent = formatMoney(plan.cost.cloud_per_million);
    $("plan-onprem").textContent = formatMoney(plan.cost.onprem_per_million);
    memoryBars($("plan-memory"), answer.device_memory, plan.deployment.num_gpus);
    fitCurve($("plan-curve"), answer.fit_curve, context);
    $("plan-summary").textContent = answer.summary.join("\n");
    this.result.hidden = false;
  }
}
