// eagle-serve playground: chat with the served model over /v1/chat/completions (streamed), each
// token coloured by where it came from. The stream is asked for the `token_sources` extension
// (docs/api.md, "Token sources"): per token, its source and the end of its text in the answer,
// counted in Unicode code points. No build step and nothing loaded from elsewhere.
"use strict";

const KEY_STORAGE = "eagle-serve-api-key";
const $ = (id) => document.getElementById(id);

const state = {
  messages: [], // the conversation sent with each request: {role, content}
  controller: null, // AbortController of the running request
};

function apiKey() {
  return $("api-key").value.trim();
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey()) h["Authorization"] = `Bearer ${apiKey()}`;
  return h;
}

async function errorMessage(resp) {
  try {
    const body = await resp.json();
    if (body.error && body.error.message) return `${resp.status}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return `${resp.status} ${resp.statusText}`;
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

async function refreshServer() {
  try {
    const health = await fetch("/health");
    $("health").textContent = health.ok ? "ready" : "warming up";
    $("health").className = "pill " + (health.ok ? "ok" : "bad");
  } catch (_) {
    $("health").textContent = "unreachable";
    $("health").className = "pill bad";
  }
  const models = await fetch("/v1/models", { headers: headers() });
  if (models.ok) {
    const body = await models.json();
    $("model").textContent = body.data.length ? body.data[0].id : "no model";
  } else {
    $("model").textContent = models.status === 401 ? "API key needed" : "?";
  }
}

// ---- rendering

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.innerHTML = '<div class="role"></div><div class="body"></div><div class="meta"></div>';
  div.querySelector(".role").textContent = role;
  div.querySelector(".body").textContent = text || "";
  $("transcript").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// The answer's text as spans, one per token, classed by source. `sources[k].text_end` is where
// token k's text ends (code points); text past the last known end is shown unclassed.
function renderAnswer(body, text, sources) {
  const chars = Array.from(text);
  const frag = document.createDocumentFragment();
  let start = 0;
  for (const { source, text_end: end } of sources) {
    const stop = Math.min(end, chars.length);
    if (stop > start) {
      const span = document.createElement("span");
      span.className = `tok src-${source}`;
      span.dataset.source = source;
      span.textContent = chars.slice(start, stop).join("");
      frag.appendChild(span);
      start = stop;
    }
  }
  if (start < chars.length) frag.appendChild(document.createTextNode(chars.slice(start).join("")));
  body.replaceChildren(frag);
}

function setStats({ rate, tokens, tau, ttft }) {
  $("stat-rate").textContent = rate === undefined ? "–" : rate.toFixed(1);
  $("stat-tokens").textContent = tokens === undefined ? "–" : String(tokens);
  $("stat-tau").textContent = tau === undefined ? "–" : tau.toFixed(2);
  $("stat-ttft").textContent = ttft === undefined ? "–" : `${(ttft * 1000).toFixed(0)} ms`;
}

// ---- the request

function requestBody() {
  const body = {
    messages: [],
    stream: true,
    stream_options: { include_usage: true },
    token_sources: true,
    temperature: Number($("temperature").value),
    top_p: Number($("top_p").value),
    max_tokens: Number($("max_tokens").value),
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  const system = $("system").value.trim();
  if (system) body.messages.push({ role: "system", content: system });
  body.messages.push(...state.messages);
  return body;
}

// Server-sent events from a fetch body: yields each `data:` payload.
async function* sseData(resp) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ")) yield line.slice(6);
      }
    }
  }
}

async function send(prompt) {
  showError("");
  state.messages.push({ role: "user", content: prompt });
  addMessage("user", prompt);
  const answer = addMessage("assistant", "");
  answer.dataset.state = "streaming";
  const body = answer.querySelector(".body");
  const meta = answer.querySelector(".meta");
  let text = "";
  const sources = [];
  let steps = 0; // chunks with tokens: one per engine step of this answer
  const started = performance.now();
  let firstAt = null;
  let lastAt = null;
  let finalTau;

  state.controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody()), signal: state.controller.signal,
    });
    if (!resp.ok) throw new Error(await errorMessage(resp));
    for await (const data of sseData(resp)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) continue;
      if (choice.delta && choice.delta.content) {
        text += choice.delta.content;
        answer.dataset.chunks = String(Number(answer.dataset.chunks || 0) + 1); // streamed pieces so far
      }
      if (choice.token_sources && choice.token_sources.length) {
        sources.push(...choice.token_sources);
        steps += 1;
        lastAt = performance.now();
        if (firstAt === null) firstAt = lastAt;
      }
      if (choice.spec_decode && choice.spec_decode.num_steps) finalTau = choice.spec_decode.mean_acceptance_length;
      renderAnswer(body, text, sources);
      // After the first token (the prompt's forward), tokens per decode step and their rate.
      const decoded = sources.length - 1;
      const seconds = firstAt !== null ? (lastAt - firstAt) / 1000 : 0;
      setStats({
        tokens: sources.length,
        rate: seconds > 0 ? decoded / seconds : undefined,
        tau: finalTau !== undefined ? finalTau : steps > 1 ? decoded / (steps - 1) : undefined,
        ttft: firstAt !== null ? (firstAt - started) / 1000 : undefined,
      });
      answer.scrollIntoView({ block: "end" });
    }
    answer.dataset.state = "done";
    const drafted = sources.filter((s) => s.source !== "target").length;
    meta.textContent = `${sources.length} tokens, ${drafted} of them accepted drafts`;
  } catch (err) {
    answer.dataset.state = err.name === "AbortError" ? "stopped" : "error";
    if (err.name !== "AbortError") showError(err.message);
    meta.textContent = err.name === "AbortError" ? "stopped" : "failed";
  } finally {
    if (text) state.messages.push({ role: "assistant", content: text });
    else state.messages.pop(); // nothing came back: the question is not part of the conversation
    state.controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

// ---- wiring

function init() {
  $("api-key").value = localStorage.getItem(KEY_STORAGE) || "";
  $("api-key").addEventListener("change", () => {
    localStorage.setItem(KEY_STORAGE, apiKey());
    refreshServer();
  });
  const colour = () => $("transcript").classList.toggle("colour", $("colour").checked);
  $("colour").addEventListener("change", colour);
  colour();
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const prompt = $("prompt").value.trim();
    if (!prompt || state.controller) return;
    $("prompt").value = "";
    send(prompt);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("clear").addEventListener("click", () => {
    state.messages = [];
    $("transcript").replaceChildren();
    setStats({});
    showError("");
  });
  refreshServer();
}

init();
