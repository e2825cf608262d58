// Browser tests of the web UI (chat page, dashboard, HTML bench report) in headless Debian
// chromium through playwright-core. Run by tests/e2e/webui_browser_test.cc with
//   DH_BASE_URL  the server (started with --api-key DH_API_KEY)
//   DH_API_KEY   its key (the page must ask for it)
//   DH_REPORT    an HTML report written by `deepharness bench serve --report`
//   DH_OUT       folder for the screenshots (one per test)
//   DH_CHROMIUM  the browser (default /usr/bin/chromium)
// Prints one line per test; exits 1 when any failed.
import { chromium } from 'playwright-core';
import path from 'node:path';
import fs from 'node:fs';
import os from 'node:os';
import assert from 'node:assert/strict';

const BASE = process.env.DH_BASE_URL;
const KEY = process.env.DH_API_KEY;
const REPORT = process.env.DH_REPORT;
const OUT = process.env.DH_OUT;
const EXE = process.env.DH_CHROMIUM || '/usr/bin/chromium';
fs.mkdirSync(OUT, { recursive: true });

// ---- server helpers (Node's fetch, outside the browser) --------------------------------------
async function metrics() {
  const res = await fetch(BASE + '/metrics', { headers: { Authorization: 'Bearer ' + KEY } });
  assert.equal(res.status, 200);
  const out = {};
  for (const line of (await res.text()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([^\s{]+)(\{[^}]*\})?\s+(\S+)$/.exec(line);
    if (!m) continue;
    const reason = m[2] && m[2].match(/finished_reason="[^"]*"/);
    const name = m[1].replace(/^[A-Za-z0-9_]*:/, '') + (reason ? '{' + reason[0] + '}' : '');
    out[name] = (out[name] || 0) + parseFloat(m[3]);
  }
  return out;
}

async function waitPoolAtRest(ms) {
  const end = Date.now() + ms;
  let m;
  while (Date.now() < end) {
    m = await metrics();
    if (m.num_requests_running === 0 && m.num_requests_waiting === 0 && m.kv_cache_blocks_free === m.kv_cache_blocks_total) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('KV pool not at rest: ' + JSON.stringify(m));
}

function sse(events) {
  return events.map((e) => 'data: ' + (typeof e === 'string' ? e : JSON.stringify(e)) + '\n\n').join('');
}

function chunk(delta, finish = null) {
  return { id: 'chatcmpl-test', object: 'chat.completion.chunk', created: 0, model: 'm', choices: [{ index: 0, delta, finish_reason: finish }] };
}

// ---- the runner --------------------------------------------------------------------------
// A fresh profile folder each run (Playwright passes it as --user-data-dir).
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'dh-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: EXE,
  headless: true,
  viewport: { width: 1280, height: 800 },
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const page = context.pages()[0] || await context.newPage();
const pageErrors = [];
page.on('pageerror', (e) => pageErrors.push(String(e)));
page.on('console', (m) => { if (m.type() === 'error') pageErrors.push('console: ' + m.text()); });

let failed = 0;
async function test(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    await page.screenshot({ path: path.join(OUT, name + '.png'), fullPage: name === 'report' });
    console.log(`PASS ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name} (${Date.now() - t0} ms): ${e.stack || e}`);
    await page.screenshot({ path: path.join(OUT, name + '-failure.png') }).catch(() => {});
  }
}

const lastAssistant = '#messages .msg.assistant >> nth=-1';
// Sends `text` and waits until the reply is complete (a new assistant message, Send back).
async function sendAndWait(text) {
  const n = await page.locator('#messages .msg.assistant').count();
  await page.fill('#input', text);
  await page.press('#input', 'Enter');
  await page.waitForFunction((k) => document.querySelectorAll('#messages .msg.assistant').length > k, n);
  await page.waitForSelector('#send', { state: 'visible', timeout: 30000 });
}

await test('chat', async () => {
  // The server has a key: the page must ask for it, then find the model.
  await page.goto(BASE + '/');
  await page.waitForSelector('#key-dialog[open]');
  await page.fill('#key-dialog input', KEY);
  await page.click('#key-dialog button[type=submit]');
  await page.waitForFunction(() => document.getElementById('model-name').textContent !== '…');
  await page.click('#settings-toggle');
  await page.fill('#max-tokens', '64');
  await page.fill('#temperature', '0.8');
  await page.dispatchEvent('#max-tokens', 'change');
  // Record how the reply grows while it streams.
  await page.evaluate(() => {
    window.__lengths = [];
    new MutationObserver(() => {
      const all = document.querySelectorAll('#messages .msg.assistant .content');
      const last = all[all.length - 1];
      if (last) window.__lengths.push(last.textContent.length);
    }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
  });
  await sendAndWait('ROMEO:');
  // How often the reply was redrawn while it streamed (information only: on a loaded machine
  // the browser may read every chunk at once; the stop test checks a partial reply mid-stream).
  const lengths = await page.evaluate(() => [...new Set(window.__lengths)].filter((n) => n > 0));
  console.log(`  chat: the reply was drawn at ${lengths.length} different lengths while streaming`);
  const reply = await page.textContent(lastAssistant + ' >> .content');
  assert.ok(reply.trim().length > 0, 'empty reply');
  const meta = await page.textContent(lastAssistant + ' >> .meta');
  assert.match(meta, /TTFT \d+ ms/);
  assert.match(meta, /\d+ tokens/);
  assert.match(meta, /[\d.]+ tokens\/s/);
  await page.click('#settings-toggle');
});

await test('stop', async () => {
  // A long reply (no EOS, up to the context) so that Stop lands mid-stream.
  await page.route('**/v1/chat/completions', async (route) => {
    const body = JSON.parse(route.request().postData());
    body.ignore_eos = true;
    body.max_tokens = 220;
    await route.continue({ postData: JSON.stringify(body) });
  });
  const before = await metrics();
  // Other clients keep the engine busy meanwhile (batched steps), so the reply takes a while
  // even on a fast machine; they finish normally ("length").
  const model = (await (await fetch(BASE + '/v1/models', { headers: { Authorization: 'Bearer ' + KEY } })).json()).data[0].id;
  const background = Array.from({ length: 6 }, () => fetch(BASE + '/v1/completions', {
    method: 'POST', headers: { Authorization: 'Bearer ' + KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model, prompt: 'KING HENRY:', max_tokens: 200, ignore_eos: true }),
  }).then((r) => r.text()));
  await page.click('#new-chat');
  await page.fill('#input', 'JULIET:');
  await page.press('#input', 'Enter');
  await page.waitForFunction((sel) => {
    const all = document.querySelectorAll(sel);
    return all.length && all[all.length - 1].textContent.length > 0;
  }, '#messages .msg.assistant .content');
  // Tokens have streamed in and the reply is still running: a partial reply is on the page.
  assert.ok(await page.isVisible('#stop'), 'still generating when the first text shows');
  await page.click('#stop');
  await page.waitForSelector(lastAssistant + ' >> .note');
  assert.equal(await page.textContent(lastAssistant + ' >> .note'), 'Stopped.');
  // The server notices the closed connection and frees the sequence: it ends as "abort".
  const key = 'request_success_total{finished_reason="abort"}';
  const end = Date.now() + 10000;
  let aborted = 0;
  while (Date.now() < end && aborted < 1) {
    aborted = ((await metrics())[key] || 0) - (before[key] || 0);
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(aborted, 1, 'the stopped request was cancelled by the server within 10 s');
  await Promise.all(background);
  await waitPoolAtRest(5000);
  await page.unroute('**/v1/chat/completions');
});

await test('regenerate-edit', async () => {
  const count = await page.locator('#messages .msg').count();
  await page.click(lastAssistant + ' >> .regenerate');
  await page.waitForSelector('#send', { state: 'visible', timeout: 30000 });
  assert.equal(await page.locator('#messages .msg').count(), count, 'regenerate replaces the last reply');
  assert.equal(await page.locator(lastAssistant + ' >> .note').count(), 0, 'the stopped reply is gone');
  // Edit the first user message: everything after it is replaced by a new reply.
  await page.click('#messages .msg.user >> nth=0 >> .edit');
  await page.fill('#messages .edit-box', 'KING RICHARD:');
  await page.click('text=Save & send');
  await page.waitForFunction(() => document.querySelectorAll('#messages .msg').length === 2 &&
    document.querySelector('#messages .msg.assistant .meta').textContent !== '');
  assert.equal(await page.locator('#messages .msg').count(), 2);
  assert.equal(await page.textContent('#messages .msg.user >> .content'), 'KING RICHARD:');
});

await test('reload', async () => {
  await page.reload();
  await page.waitForSelector('#messages .msg.user');
  assert.equal(await page.textContent('#messages .msg.user >> .content'), 'KING RICHARD:');
  const list = await page.textContent('#conversations');
  assert.ok(list.includes('ROMEO:') && list.includes('JULIET:'), 'the conversations keep their titles: ' + list);
  assert.ok((await page.textContent(lastAssistant + ' >> .content')).length > 0);
});

await test('hostile-output', async () => {
  const reasoning = '<img src=x onerror="window.__pwned=\'reasoning\'"> thinking *hard*';
  const content = ['<script>window.__pwned="script"</script>\n\n', '<img src=x onerror="window.__pwned=\'img\'"> ',
    '**bold** and _italic_ and `<b>code</b>`\n\n', '- item <i>one</i>\n- item two\n\n', '```html\n<script>alert(1)</script>\n```\n'];
  const body = sse([chunk({ role: 'assistant', content: '' }), chunk({ reasoning_content: reasoning }),
    ...content.map((c) => chunk({ content: c })), chunk({}, 'stop'),
    { id: 'x', object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 3, completion_tokens: 42, total_tokens: 45 } }, '[DONE]']);
  await page.route('**/v1/chat/completions', (route) => route.fulfill({ status: 200, contentType: 'text/event-stream', body }));
  await page.click('#new-chat');
  await sendAndWait('say something hostile');
  await page.unroute('**/v1/chat/completions');
  await page.click(lastAssistant + ' >> details.reasoning summary');
  assert.equal(await page.evaluate(() => window.__pwned), undefined, 'no script ran');
  assert.equal(await page.locator('#messages img, #messages script, #messages b, #messages i:not(.x)').count(), 0, 'no element from model text');
  const text = await page.textContent(lastAssistant + ' >> .content');
  assert.ok(text.includes('<script>window.__pwned="script"</script>'), text);
  assert.ok(text.includes('<img src=x onerror='), text);
  assert.equal(await page.textContent(lastAssistant + ' >> .content strong'), 'bold');
  assert.equal(await page.textContent(lastAssistant + ' >> .content em'), 'italic');
  assert.equal(await page.textContent(lastAssistant + ' >> .content p code'), '<b>code</b>');
  assert.equal(await page.locator(lastAssistant + ' >> .content ul li').count(), 2);
  assert.equal(await page.textContent(lastAssistant + ' >> .content pre code'), '<script>alert(1)</script>');
  assert.ok((await page.textContent(lastAssistant + ' >> details.reasoning')).includes('<img src=x onerror='));
  assert.match(await page.textContent(lastAssistant + ' >> .meta'), /42 tokens/);
});

await test('server-errors', async () => {
  const cases = [
    [503, 'server_shutting_down', /shutting down/],
    [503, 'server_overloaded', /queue is full/],
    [429, 'rate_limit_exceeded', /queue is full/],
  ];
  for (const [status, code, expected] of cases) {
    await page.route('**/v1/chat/completions', (route) => route.fulfill({
      status, contentType: 'application/json', headers: { 'Retry-After': '1' },
      body: JSON.stringify({ error: { message: 'm', type: 'server_error', param: null, code } }),
    }));
    await sendAndWait('hello again');
    await page.unroute('**/v1/chat/completions');
    assert.match(await page.textContent('#banner'), expected);
    assert.match(await page.textContent(lastAssistant + ' >> .error'), expected);
  }
});

await test('dashboard', async () => {
  await page.goto(BASE + '/dashboard?interval=250');
  // Traffic while it watches: a few completions.
  const model = (await (await fetch(BASE + '/v1/models', { headers: { Authorization: 'Bearer ' + KEY } })).json()).data[0].id;
  const load = (async () => {
    for (let i = 0; i < 4; i++) {
      await fetch(BASE + '/v1/completions', {
        method: 'POST', headers: { Authorization: 'Bearer ' + KEY, 'Content-Type': 'application/json' },
        body: JSON.stringify({ model, prompt: 'KING HENRY:', max_tokens: 48, ignore_eos: true }),
      });
    }
  })();
  await page.waitForFunction(() => Number(document.body.dataset.polls || 0) >= 4);
  const polls1 = Number(await page.getAttribute('body', 'data-polls'));
  const points1 = Number(await page.getAttribute('#chart-requests svg', 'data-points'));
  const svg1 = await page.innerHTML('#chart-requests svg');
  await load;
  await page.waitForFunction((p) => Number(document.body.dataset.polls || 0) >= p + 4, polls1);
  const points2 = Number(await page.getAttribute('#chart-requests svg', 'data-points'));
  const svg2 = await page.innerHTML('#chart-requests svg');
  assert.ok(svg2 !== svg1 && points2 >= points1, `the charts update (${points1} -> ${points2} points)`);
  for (const id of ['requests', 'kv', 'tokens', 'ttft', 'itl', 'memory']) {
    const n = Number(await page.getAttribute(`#chart-${id} svg`, 'data-points'));
    assert.ok(n > 0, `chart ${id} has points`);
    assert.ok(await page.locator(`#chart-${id} svg polyline, #chart-${id} svg circle`).count() > 0, `chart ${id} draws a line`);
  }
  const info = await page.textContent('#info');
  assert.match(info, /Model/);
  assert.match(info, /KV blocks/);
  assert.match(await page.textContent('#chart-tokens .legend'), /generated/);
});

await test('report', async () => {
  await page.goto('file://' + REPORT);
  assert.equal(await page.locator('script').count(), 0, 'the report has no scripts');
  const charts = await page.locator('figure.chart svg').count();
  assert.ok(charts >= 7, 'charts: ' + charts);
  assert.ok(await page.locator('svg rect').count() > 4, 'bars drawn');
  assert.ok(await page.locator('svg polyline.cdf').count() >= 2, 'CDFs drawn');
  assert.match(await page.textContent('table'), /concurrency/);
});

await context.close();
fs.rmSync(profile, { recursive: true, force: true });
const unexpected = pageErrors.filter((e) => !/Failed to load resource/.test(e));
if (unexpected.length) {
  console.log('FAIL page errors: ' + unexpected.join('\n'));
  failed++;
}
console.log(failed ? `${failed} browser test(s) failed` : 'all browser tests passed');
process.exit(failed ? 1 : 0);
