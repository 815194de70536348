// Podium's only script: reads streamed responses into the page. Model text is only ever set with
// textContent (never innerHTML), so whatever a model writes shows as text.
"use strict";

function csrf() { return document.querySelector('meta[name="csrf-token"]').content; }

function sampling(form) {
  const get = (name) => form.querySelector(`[name="${name}"]`).value;
  return { temperature: Number(get("temperature")), top_p: Number(get("top_p")),
           max_tokens: Number(get("max_tokens")), seed: Number(get("seed")) };
}

async function post(url, body) {
  return fetch(url, { method: "POST", headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf() },
                      body: JSON.stringify(body), credentials: "same-origin" });
}

async function failure(response) {
  try { return (await response.json()).error || response.statusText; } catch (e) { return response.statusText; }
}

// Stream `response`'s body into `node` as text; resolves to the whole text.
async function streamInto(response, node) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = "", chunks = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
    node.textContent = text;
    node.dataset.chunks = String(++chunks);  // how many pieces arrived (a test sees the stream)
  }
  return text;
}

function setupChat(form) {
  const transcript = document.getElementById("transcript");
  const error = document.getElementById("chat-error");
  const messages = [];
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const prompt = document.getElementById("prompt");
    error.textContent = "";
    const turn = (role, text) => {
      const div = document.createElement("div");
      div.className = `turn ${role}`;
      div.textContent = text;
      transcript.appendChild(div);
      return div;
    };
    messages.push({ role: "user", content: prompt.value });
    const body = { export: document.getElementById("export").value, messages: messages,
                   sampling: sampling(form), conversation_id: form.dataset.conversation };
    const response = await post("/api/chat", body);
    if (!response.ok) { messages.pop(); error.textContent = await failure(response); return; }
    turn("user", prompt.value);
    prompt.value = "";
    const out = turn("assistant", "");
    out.dataset.streaming = "1";
    const text = await streamInto(response, out);
    delete out.dataset.streaming;
    out.dataset.done = "1";
    messages.push({ role: "assistant", content: text });
  });
}

function setupBattle(form) {
  const error = document.getElementById("battle-error");
  const votes = document.getElementById("votes");
  let battle = null;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    const response = await post("/api/battle", { prompt: document.getElementById("battle-prompt").value,
                                                 sampling: sampling(form) });
    if (!response.ok) { error.textContent = await failure(response); return; }
    battle = (await response.json()).battle_id;
    form.querySelector("button").disabled = true;
    await Promise.all(["A", "B"].map(async (side) => {
      const node = document.getElementById(`side-${side}`);
      const r = await post(`/api/battle/${battle}/${side}`, {});
      if (!r.ok) { error.textContent = await failure(r); return; }
      await streamInto(r, node);
      node.dataset.done = "1";
    }));
    votes.hidden = false;
  });
  votes.querySelectorAll("button").forEach((button) => button.addEventListener("click", async () => {
    const response = await post(`/api/battle/${battle}/vote`, { vote: button.dataset.vote });
    if (!response.ok) { error.textContent = await failure(response); return; }
    const result = await response.json();
    document.getElementById("name-A").textContent = result.a;
    document.getElementById("name-B").textContent = result.b;
    votes.hidden = true;
    document.getElementById("battle-done").hidden = false;
  }));
}

document.addEventListener("DOMContentLoaded", () => {
  const chat = document.getElementById("chat-form");
  if (chat) setupChat(chat);
  const battle = document.getElementById("battle-form");
  if (battle) setupBattle(battle);
});
