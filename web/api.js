// Talking to the daemon: the member's token (kept in localStorage), JSON calls, server-sent
// events read over fetch (EventSource cannot POST or send a bearer token), and images as data URLs.

const TOKEN_KEY = "homeai.token";

export const token = {
  get: () => localStorage.getItem(TOKEN_KEY) || "",
  set: (value) => localStorage.setItem(TOKEN_KEY, value),
  clear: () => localStorage.removeItem(TOKEN_KEY),
};

export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || null;
  }
}

function headers(json) {
  const h = {};
  const t = token.get();
  if (t) h.Authorization = `Bearer ${t}`;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

async function fail(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    /* not JSON: keep the status */
  }
  const error = new ApiError(response.status, body);
  if (response.status === 401) window.dispatchEvent(new CustomEvent("homeai:unauthorized"));
  throw error;
}

export async function call(method, path, body, { signal } = {}) {
  const init = { method, headers: headers(body !== undefined), signal };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  if (!response.ok) await fail(response);
  return response.status === 204 ? null : response.json();
}

// POST `body` to `path` and yield each event of the answer as an object.
export async function* events(path, body, { signal } = {}) {
  const response = await fetch(path, {
    method: "POST", headers: headers(true), body: JSON.stringify(body), signal,
  });
  if (!response.ok) await fail(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart());
        if (data.length && data[0] !== "[DONE]") yield JSON.parse(data.join("\n"));
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// POST `body` to `path` and return the response to read as it streams (e.g. audio).
export async function post(path, body, { signal } = {}) {
  const response = await fetch(path, { method: "POST", headers: headers(true), body: JSON.stringify(body), signal });
  if (!response.ok) await fail(response);
  return response;
}

// GET an image at `path` as a data URL: the page's CSP shows data: images, not blob: ones, and an
// <img src> could not send the member's token.
export async function imageUrl(path, { signal } = {}) {
  const response = await fetch(path, { headers: headers(false), signal });
  if (!response.ok) await fail(response);
  return readAsDataUrl(await response.blob());
}

export function readAsDataUrl(blob) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
}

export async function health() {
  try {
    const response = await fetch("/healthz");
    return { ok: response.ok, ...(await response.json()) };
  } catch {
    return { ok: false, status: "unreachable" };
  }
}
