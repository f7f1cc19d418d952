// The household web UI's entry point: sign-in (a member token in localStorage, or none
// when the daemon runs without auth), the chat and box views, the phone drawer, and the
// keys that work everywhere (Esc stops an answer, or the speech playing). Plain ES modules, no build step.

import { call, health, token } from "./api.js";
import { BoxView } from "./box.js";
import { Chat } from "./chat.js";
import { player } from "./player.js";

const $ = (id) => document.getElementById(id);
const HEALTH_RETRY_MS = 3000;

let authRequired = false;
let noticeTimer = null;

function notify(message, { sticky = false } = {}) {
  const notice = $("notice");
  notice.textContent = message || "";
  clearTimeout(noticeTimer);
  if (message && !sticky) noticeTimer = setTimeout(() => (notice.textContent = ""), 6000);
}

function openDrawer(open) {
  document.body.classList.toggle("drawer-open", open);
  $("menu-button").setAttribute("aria-expanded", String(open));
  $("scrim").hidden = !open;
  if (open) $("new-chat").focus();
}

const chat = new Chat({ notify, closeDrawer: () => openDrawer(false) });
const box = new BoxView($("box-view"));

function showView(name) {
  const isBox = name === "box";
  $("chat-view").hidden = isBox;
  $("box-view").hidden = !isBox;
  $("view-chat").setAttribute("aria-pressed", String(!isBox));
  $("view-box").setAttribute("aria-pressed", String(isBox));
  document.body.classList.toggle("box-shown", isBox);
  if (isBox) box.show();
  else box.hide();
}

function showSignin(message = "") {
  $("app").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = message;
  $("token-input").value = "";
  $("token-input").focus();
}

async function enterApp() {
  await chat.loadList(); // a 401 here means the token is wrong or required
  $("signin").hidden = true;
  $("app").hidden = false;
  $("signout").hidden = !token.get();
  await route();
}

async function route() {
  const match = location.hash.match(/^#c\/(\d+)$/);
  if (location.hash === "#box") showView("box");
  else showView("chat");
  if (match) await chat.open(Number(match[1]), { fromHash: true });
  else if (location.hash !== "#box") chat.newChat();
}

async function watchHealth() {
  const status = await health();
  if (status.status === "ok") {
    authRequired = Boolean(status.auth_required); // only a loaded server says
    if ($("notice").dataset.loading) notify("");
    delete $("notice").dataset.loading;
    return;
  }
  $("notice").dataset.loading = "1";
  notify(status.status === "loading" ? "The model is loading… you can read past conversations meanwhile."
    : `The server is not ready: ${status.error || status.status}`, { sticky: true });
  setTimeout(watchHealth, HEALTH_RETRY_MS);
}

async function boot() {
  await watchHealth();
  if (authRequired && !token.get()) return showSignin();
  try {
    await enterApp();
  } catch (e) {
    if (e.status === 401) showSignin(token.get() ? "That token is no longer accepted." : "");
    else notify(e.message, { sticky: true });
  }
}

$("signin-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const value = $("token-input").value.trim();
  if (!value) return;
  token.set(value);
  try {
    await enterApp();
  } catch (err) {
    token.clear();
    showSignin(err.status === 401 ? "That token was not accepted." : err.message);
  }
});

$("signout").addEventListener("click", () => {
  token.clear();
  if (authRequired) showSignin();
  else location.reload();
});

window.addEventListener("homeai:unauthorized", () => {
  if (!authRequired && !token.get()) return;
  token.clear();
  showSignin("Please sign in again.");
});

$("view-chat").addEventListener("click", () => {
  history.replaceState(null, "", chat.current ? `#c/${chat.current.id}` : location.pathname);
  showView("chat");
  $("message-input").focus();
});
$("view-box").addEventListener("click", () => {
  history.replaceState(null, "", "#box");
  showView("box");
});
$("menu-button").addEventListener("click", () => openDrawer(!document.body.classList.contains("drawer-open")));
$("scrim").addEventListener("click", () => openDrawer(false));
window.addEventListener("hashchange", () => route().catch((e) => notify(e.message)));

document.addEventListener("keydown", (e) => {
  if (e.key !== "Escape") return;
  if (chat.busy) {
    e.preventDefault();
    chat.stop();
  } else if (player.playing) {
    chat.silence();
  } else if (document.body.classList.contains("drawer-open")) {
    openDrawer(false);
    $("menu-button").focus();
  }
});

boot();
