// The web console's entry point: reads what the server serves (/console/config), sets up the three views (chat,
// denoising, planner) behind keyboard-usable tabs, and starts the live metrics.

import { getJSON } from "./api.js";
import { Chat } from "./chat.js";
import { DenoisingView } from "./denoise.js";
import { $, showProblem } from "./dom.js";
import { LiveMetrics } from "./metrics.js";
import { PlannerView } from "./planner.js";

const VIEWS = ["chat", "denoising", "planner"];

function selectView(name, focus = false) {
  for (const view of VIEWS) {
    const tab = $(`tab-${view}`);
    const selected = view === name;
    tab.setAttribute("aria-selected", String(selected));
    tab.tabIndex = selected ? 0 : -1;
    $(`view-${view}`).hidden = !selected;
    if (selected && focus) tab.focus();
  }
  history.replaceState(null, "", `#${name}`);
}

function setUpTabs() {
  VIEWS.forEach((view, i) => {
    const tab = $(`tab-${view}`);
    tab.addEventListener("click", () => selectView(view));
    tab.addEventListener("keydown", (event) => {
      const moves = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: VIEWS.length - 1 };
      if (!(event.key in moves)) return;
      event.preventDefault();
      selectView(VIEWS[(moves[event.key] + VIEWS.length) % VIEWS.length], true);
    });
  });
  const wanted = location.hash.slice(1);
  selectView(VIEWS.includes(wanted) ? wanted : "chat");
}

async function main() {
  setUpTabs();
  new LiveMetrics().start();
  const planner = new PlannerView();
  planner.init();
  let config;
  try {
    config = await getJSON("/console/config");
  } catch (error) {
    showProblem($("page-problem"), `The console could not start: ${error.message}`);
    return;
  }
  $("model-name").textContent = config.model;
  document.title = `diffuserve: ${config.model}`;
  const denoising = new DenoisingView();
  new Chat(config, denoising, () => selectView("denoising"));
  document.body.dataset.ready = "true"; // for tests and screenshots: the page is set up
}

main();
