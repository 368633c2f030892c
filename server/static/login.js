// The login view: paste an API token (`halfcast tokens create --owner NAME`, or the one `halfcast up` printed).

import { ApiError, el, login } from "./api.js";

/** Render the login form into `view`; `onDone({owner, admin})` runs once a token is accepted. */
export function loginPage(view, onDone) {
  const input = el("input", { type: "password", autocomplete: "off", placeholder: "hc_…", dataset: { testid: "login-token" }, size: 52 });
  const error = el("p", { class: "error-box", hidden: true, dataset: { testid: "login-error" } });
  const form = el(
    "form",
    { class: "login-form", dataset: { testid: "login-form" } },
    el("h1", {}, "Sign in"),
    el("p", {}, "Paste an API token. ", el("code", {}, "halfcast up"), " printed one on its first start and saved it to ",
      el("code", {}, ".halfcast/token"), "; an operator makes more with ", el("code", {}, "halfcast tokens create --owner NAME"), "."),
    el("label", {}, "Token ", input),
    el("button", { type: "submit", dataset: { testid: "login-submit" } }, "Sign in"),
    error,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    try {
      onDone(await login(input.value.trim()));
    } catch (failure) {
      error.textContent = failure instanceof ApiError && failure.status === 401 ? "That token is unknown or revoked." : String(failure.message || failure);
      error.hidden = false;
    }
  });
  view.replaceChildren(form);
  input.focus();
  return () => {};
}
