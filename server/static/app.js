// The dashboard's router: #/ (jobs), #/jobs/<id> (one job), #/submit (the form).

import { jobList, jobPage } from "./jobs.js";
import { submitPage } from "./submit.js";

const view = document.getElementById("view");
let cleanup = () => {};

function route() {
  cleanup();
  const hash = location.hash || "#/";
  const job = /^#\/jobs\/([^/]+)$/.exec(hash);
  if (job) cleanup = jobPage(view, decodeURIComponent(job[1]));
  else if (hash === "#/submit") cleanup = submitPage(view);
  else cleanup = jobList(view);
  for (const link of document.querySelectorAll("header nav a")) {
    link.classList.toggle("active", link.getAttribute("href") === (job ? "#/" : hash));
  }
}

window.addEventListener("hashchange", route);
route();
