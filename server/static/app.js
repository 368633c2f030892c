// The dashboard's router: #/ (jobs), #/jobs/<id> (one job), #/submit (the form), #/datasets and #/models (the registry);
// a login view first when the API wants a token.

import { getToken, login, logout, whoami } from "./api.js";
import { jobList, jobPage } from "./jobs.js";
import { loginPage } from "./login.js";
import { datasetsPage, modelsPage } from "./registry.js";
import { submitPage } from "./submit.js";

const view = document.getElementById("view");
const who = document.getElementById("who");
const signOut = document.getElementById("logout");
let cleanup = () => {};

function route() {
  cleanup();
  const hash = location.hash || "#/";
  const job = /^#\/jobs\/([^/]+)$/.exec(hash);
  if (job) cleanup = jobPage(view, decodeURIComponent(job[1]));
  else if (hash === "#/submit") cleanup = submitPage(view);
  else if (hash === "#/datasets") cleanup = datasetsPage(view);
  else if (hash === "#/models") cleanup = modelsPage(view);
  else cleanup = jobList(view);
  for (const link of document.querySelectorAll("header nav a")) {
    link.classList.toggle("active", link.getAttribute("href") === (job ? "#/" : hash));
  }
}

function signedIn(principal) {
  who.textContent = `${principal.owner}${principal.admin ? " (admin)" : ""}`;
  signOut.hidden = false;
  route();
}

function showLogin() {
  cleanup();
  who.textContent = "";
  signOut.hidden = true;
  cleanup = loginPage(view, signedIn);
}

async function start() {
  // A token kept by this tab is posted again, so the stream cookie is there even if the browser dropped it.
  const token = getToken();
  const principal = token ? await login(token).catch(() => null) : await whoami();
  if (principal) signedIn(principal);
  else showLogin();
}

window.addEventListener("hashchange", () => (signOut.hidden ? null : route()));
window.addEventListener("halfcast:unauthorized", showLogin);
signOut.addEventListener("click", async (event) => {
  event.preventDefault();
  await logout();
  showLogin();
});
start();
