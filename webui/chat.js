// The chat page: conversations in localStorage, streamed replies (SSE over fetch), reasoning
// in a collapsible block, stop / regenerate / edit, sampling settings, TTFT and tokens/s.
import { renderMarkdown } from '/webui/markdown.js';
import { apiFetch, askForKey, describeError } from '/webui/api.js';

const STORE = 'deepharness.conversations';
const SETTINGS = 'deepharness.settings';
const $ = (id) => document.getElementById(id);

const state = {
  conversations: [],
  current: null,     // id
  model: null,
  controller: null,  // AbortController of the reply being streamed
};

// ---- storage -----------------------------------------------------------------------------
function load() {
  try {
    const list = JSON.parse(localStorage.getItem(STORE) || '[]');
    state.conversations = Array.isArray(list) ? list.filter((c) => c && Array.isArray(c.messages)) : [];
  } catch (_) {
    state.conversations = [];
  }
  state.current = state.conversations.length ? state.conversations[0].id : null;
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(state.conversations, (k, v) => (k === 'el' ? undefined : v)));
  } catch (e) {
    showBanner('Could not save the conversation in this browser: ' + e.message);
  }
}

function conversation() {
  return state.conversations.find((c) => c.id === state.current) || null;
}

function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: 'New chat', created: Date.now(), messages: [] };
  state.conversations.unshift(c);
  state.current = c.id;
  save();
  return c;
}

const settingFields = [['system-prompt', 'system'], ['temperature', 'temperature'], ['top-p', 'top_p'],
  ['top-k', 'top_k'], ['max-tokens', 'max_tokens'], ['seed', 'seed']];

function loadSettings() {
  let s = {};
  try { s = JSON.parse(localStorage.getItem(SETTINGS) || '{}') || {}; } catch (_) { s = {}; }
  for (const [id, key] of settingFields) if (s[key] !== undefined) $(id).value = s[key];
}

function saveSettings() {
  const s = {};
  for (const [id, key] of settingFields) s[key] = $(id).value;
  localStorage.setItem(SETTINGS, JSON.stringify(s));
}

function requestBody(conv) {
  const messages = [];
  const system = $('system-prompt').value.trim();
  if (system) messages.push({ role: 'system', content: system });
  for (const m of conv.messages) {
    if (m.role === 'assistant' && (m.error || !m.content)) continue;
    messages.push({ role: m.role, content: m.content });
  }
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  if (state.model) body.model = state.model;
  const num = (id, key, int) => {
    const v = $(id).value.trim();
    if (v === '') return;
    const n = int ? parseInt(v, 10) : parseFloat(v);
    if (Number.isFinite(n)) body[key] = n;
  };
  num('temperature', 'temperature');
  num('top-p', 'top_p');
  num('top-k', 'top_k', true);
  num('max-tokens', 'max_tokens', true);
  num('seed', 'seed', true);
  return body;
}

// ---- rendering ---------------------------------------------------------------------------
function showBanner(text) {
  const b = $('banner');
  b.textContent = text;
  b.hidden = !text;
}

function renderList() {
  const ul = $('conversations');
  ul.replaceChildren();
  for (const c of state.conversations) {
    const li = document.createElement('li');
    li.className = c.id === state.current ? 'active' : '';
    const open = document.createElement('button');
    open.type = 'button';
    open.className = 'open';
    open.textContent = c.title || 'Untitled';
    open.onclick = () => { if (!state.controller) { state.current = c.id; renderAll(); } };
    const del = document.createElement('button');
    del.type = 'button';
    del.className = 'delete';
    del.title = 'Delete';
    del.textContent = '×';
    del.onclick = () => {
      if (state.controller) return;
      state.conversations = state.conversations.filter((x) => x.id !== c.id);
      if (state.current === c.id) state.current = state.conversations.length ? state.conversations[0].id : null;
      save();
      renderAll();
    };
    li.append(open, del);
    ul.appendChild(li);
  }
}

function statsText(m) {
  const s = m.stats;
  if (!s) return '';
  const parts = [];
  if (s.ttft_ms != null) parts.push(`TTFT ${Math.round(s.ttft_ms)} ms`);
  if (s.tokens != null) parts.push(`${s.tokens} tokens${s.estimated ? ' (counted from the stream)' : ''}`);
  if (s.tokens_per_s != null) parts.push(`${s.tokens_per_s.toFixed(1)} tokens/s`);
  if (m.finish_reason) parts.push(`finish: ${m.finish_reason}`);
  return parts.join(' · ');
}

function fillMessage(el, m) {
  el.replaceChildren();
  const role = document.createElement('div');
  role.className = 'role';
  role.textContent = m.role === 'user' ? 'You' : 'Assistant';
  el.appendChild(role);
  if (m.reasoning) {
    const details = document.createElement('details');
    details.className = 'reasoning';
    details.open = !!m.reasoningOpen;
    details.ontoggle = () => { m.reasoningOpen = details.open; };
    const summary = document.createElement('summary');
    summary.textContent = m.content || m.stopped || m.error ? 'Reasoning' : 'Reasoning…';
    const body = document.createElement('div');
    body.className = 'body';
    body.appendChild(renderMarkdown(m.reasoning));
    details.append(summary, body);
    el.appendChild(details);
  }
  const content = document.createElement('div');
  content.className = 'content';
  if (m.role === 'user') {
    content.textContent = m.content;  // the user's text, verbatim
  } else {
    content.appendChild(renderMarkdown(m.content));
  }
  el.appendChild(content);
  if (m.stopped) {
    const note = document.createElement('div');
    note.className = 'note';
    note.textContent = 'Stopped.';
    el.appendChild(note);
  }
  if (m.error) {
    const err = document.createElement('div');
    err.className = 'error';
    err.textContent = m.error;
    el.appendChild(err);
  }
  const meta = document.createElement('div');
  meta.className = 'meta';
  meta.textContent = statsText(m);
  el.appendChild(meta);
}

function renderMessages() {
  const box = $('messages');
  box.replaceChildren();
  const conv = conversation();
  if (!conv || conv.messages.length === 0) {
    const empty = document.createElement('div');
    empty.className = 'empty';
    empty.textContent = state.model ? `Chat with ${state.model}.` : 'Start a conversation.';
    box.appendChild(empty);
    return;
  }
  conv.messages.forEach((m, index) => {
    const el = document.createElement('div');
    el.className = 'msg ' + m.role;
    fillMessage(el, m);
    m.el = el;
    const actions = document.createElement('div');
    actions.className = 'actions';
    if (m.role === 'user') {
      const edit = document.createElement('button');
      edit.type = 'button';
      edit.className = 'edit';
      edit.textContent = 'Edit';
      edit.onclick = () => startEdit(conv, index, el);
      actions.appendChild(edit);
    } else if (index === conv.messages.length - 1) {
      const regen = document.createElement('button');
      regen.type = 'button';
      regen.className = 'regenerate';
      regen.textContent = 'Regenerate';
      regen.onclick = () => regenerate(conv);
      actions.appendChild(regen);
    }
    el.appendChild(actions);
    box.appendChild(el);
  });
  box.scrollTop = box.scrollHeight;
}

function renderAll() {
  renderList();
  renderMessages();
}

function setBusy(busy) {
  $('send').hidden = busy;
  $('stop').hidden = !busy;
  document.body.classList.toggle('busy', busy);
}

// ---- actions -----------------------------------------------------------------------------
function startEdit(conv, index, el) {
  if (state.controller) return;
  const m = conv.messages[index];
  const area = document.createElement('textarea');
  area.className = 'edit-box';
  area.value = m.content;
  area.rows = 3;
  const saveBtn = document.createElement('button');
  saveBtn.type = 'button';
  saveBtn.textContent = 'Save & send';
  const cancel = document.createElement('button');
  cancel.type = 'button';
  cancel.textContent = 'Cancel';
  cancel.onclick = renderMessages;
  saveBtn.onclick = () => {
    const text = area.value.trim();
    if (!text) return;
    m.content = text;
    conv.messages.length = index + 1;  // the edit replaces everything after it
    save();
    renderAll();
    generate(conv);
  };
  el.replaceChildren(area, saveBtn, cancel);
  area.focus();
}

function regenerate(conv) {
  if (state.controller) return;
  const last = conv.messages[conv.messages.length - 1];
  if (last && last.role === 'assistant') conv.messages.pop();
  save();
  renderAll();
  generate(conv);
}

function send(text) {
  let conv = conversation() || newConversation();
  if (conv.messages.length === 0) conv.title = text.slice(0, 48);
  conv.messages.push({ role: 'user', content: text });
  save();
  renderAll();
  generate(conv);
}

// Reads an SSE response body and calls onEvent(json) for each `data:` payload but [DONE].
async function readEvents(res, onEvent) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = event.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
      if (!data) continue;
      if (data === '[DONE]') return;
      onEvent(JSON.parse(data));
    }
  }
}

async function generate(conv) {
  const m = { role: 'assistant', content: '', reasoning: '' };
  conv.messages.push(m);
  renderAll();
  showBanner('');
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  const t0 = performance.now();
  let first = null;
  let last = null;
  let chunks = 0;
  let usage = null;
  let pending = false;
  const repaint = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      if (m.el) {
        const actions = m.el.querySelector('.actions');
        fillMessage(m.el, m);
        if (actions) m.el.appendChild(actions);
        const box = $('messages');
        box.scrollTop = box.scrollHeight;
      }
    });
  };
  try {
    let res = await apiFetch('/v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(requestBody(conv)),
      signal: controller.signal,
    });
    if (res.status === 401 && await askForKey('This server needs an API key.')) {
      res = await apiFetch('/v1/chat/completions', {
        method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify(requestBody(conv)), signal: controller.signal,
      });
    }
    if (!res.ok) throw new Error(await describeError(res));
    await readEvents(res, (j) => {
      if (j.error) throw new Error('The server failed while generating: ' + (j.error.message || 'error'));
      if (j.usage) usage = j.usage;
      const choice = j.choices && j.choices[0];
      if (!choice) return;
      const d = choice.delta || {};
      let text = false;
      if (typeof d.reasoning_content === 'string' && d.reasoning_content) { m.reasoning += d.reasoning_content; text = true; }
      if (typeof d.content === 'string' && d.content) { m.content += d.content; text = true; }
      if (choice.finish_reason) m.finish_reason = choice.finish_reason;
      if (text) {
        const now = performance.now();
        if (first === null) first = now;
        last = now;
        chunks++;
        repaint();
      }
    });
  } catch (e) {
    if (e.name === 'AbortError') m.stopped = true;
    else m.error = e.message || String(e);
  } finally {
    state.controller = null;
    setBusy(false);
  }
  const tokens = usage ? usage.completion_tokens : chunks;
  m.stats = {
    ttft_ms: first === null ? null : first - t0,
    tokens,
    estimated: !usage,
    // Decode speed: tokens after the first over the time after the first.
    tokens_per_s: first !== null && last > first && tokens > 1 ? (tokens - 1) / ((last - first) / 1000) : null,
  };
  delete m.el;
  save();
  renderAll();
  if (m.error) showBanner(m.error);
}

// ---- start -------------------------------------------------------------------------------
async function checkServer() {
  try {
    let res = await apiFetch('/v1/models');
    if (res.status === 401) {
      $('server-state').textContent = 'needs an API key';
      if (await askForKey('This server needs an API key.')) res = await apiFetch('/v1/models');
    }
    if (!res.ok) {
      $('server-state').textContent = await describeError(res);
      return;
    }
    const models = await res.json();
    const first = models.data && models.data[0];
    if (first) {
      state.model = first.id;
      $('model-name').textContent = first.id;
      $('server-state').textContent = first.max_model_len ? `context ${first.max_model_len} tokens` : '';
    }
  } catch (e) {
    $('server-state').textContent = 'server unreachable';
  }
  renderMessages();
}

function init() {
  load();
  loadSettings();
  for (const [id] of settingFields) $(id).addEventListener('change', saveSettings);
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const text = $('input').value.trim();
    if (!text || state.controller) return;
    $('input').value = '';
    send(text);
  });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('stop').onclick = () => { if (state.controller) state.controller.abort(); };
  $('new-chat').onclick = () => { if (!state.controller) { newConversation(); renderAll(); $('input').focus(); } };
  $('settings-toggle').onclick = () => {
    const s = $('settings');
    s.hidden = !s.hidden;
    $('settings-toggle').setAttribute('aria-expanded', String(!s.hidden));
  };
  $('key-button').onclick = async () => { await askForKey('Key sent as "Authorization: Bearer …" (kept in this browser).'); checkServer(); };
  renderAll();
  checkServer();
}

init();
