// Talking to the server: JSON calls and server-sent-event streams, with every failure turned into one readable
// sentence (ApiError.message). Requests carry the console's session cookie (same origin), never the key.

export class ApiError extends Error {
  constructor(message, { status = 0, param = null, signIn = false } = {}) {
    super(message);
    this.status = status;
    this.param = param;
    this.signIn = signIn;
  }
}

const UNREACHABLE =
  "Cannot reach the server: it may be stopped or restarting. Check that `diffuserve serve` is running, then try again.";

async function problemOf(response) {
  if (response.status === 401) {
    return new ApiError("The session has ended (the server's API key changed?): reload the page to sign in again.", {
      status: 401,
      signIn: true,
    });
  }
  let message = `The server answered ${response.status} ${response.statusText}.`;
  let param = null;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) {
      message = body.error.message;
      param = body.error.param || null;
    }
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(message, { status: response.status, param });
}

async function send(path, init) {
  let response;
  try {
    response = await fetch(path, { credentials: "same-origin", ...init });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(UNREACHABLE);
  }
  if (!response.ok) throw await problemOf(response);
  return response;
}

export async function getJSON(path) {
  return (await send(path, { headers: { Accept: "application/json" } })).json();
}

export async function getText(path) {
  return (await send(path, {})).text();
}

export async function postJSON(path, body) {
  const response = await send(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(body),
  });
  return response.json();
}

// Posts `body` and calls onEvent(json) for every `data:` frame until `[DONE]`. An error frame, or a stream that
// ends (or breaks) before `[DONE]`, is thrown as an ApiError.
export async function streamSSE(path, body, onEvent, signal) {
  const response = await send(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify(body),
    signal,
  });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new ApiError(
        "The connection to the server broke before the answer finished (the server may have restarted). " +
          "The partial answer is kept; send the message again to retry.",
      );
    }
    if (chunk.done) break;
    buffer += decoder.decode(chunk.value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (dispatch(frame, onEvent)) return;
    }
  }
  throw new ApiError(
    "The server closed the stream before the answer finished (it may have restarted). " +
      "The partial answer is kept; send the message again to retry.",
  );
}

// Handles one SSE frame; true once it was `[DONE]`.
function dispatch(frame, onEvent) {
  for (const line of frame.split("\n")) {
    if (!line.startsWith("data: ")) continue;
    const data = line.slice(6);
    if (data === "[DONE]") return true;
    const event = JSON.parse(data);
    if (event.error) throw new ApiError(event.error.message, { param: event.error.param || null });
    onEvent(event);
  }
  return false;
}
