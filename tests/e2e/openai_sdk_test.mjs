// The official OpenAI Node SDK against `deepharness serve`: chat (plain and streamed),
// completions (plain and streamed), models, and error mapping to the SDK's exception classes.
// Run by tests/e2e/openai_sdk_test.cc with DH_BASE_URL, DH_MODEL and DH_API_KEY set.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({
  baseURL: process.env.DH_BASE_URL,
  apiKey: process.env.DH_API_KEY || 'unused',
  maxRetries: 0,
  timeout: 120000,
});
const model = process.env.DH_MODEL;

async function testModels() {
  const list = await client.models.list();
  assert.ok(list.data.some((m) => m.id === model), 'served model listed');
}

async function testChat() {
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: 'system', content: 'You are a poet.' }, { role: 'user', content: 'Speak of love' }],
    max_tokens: 8,
    temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  return r.choices[0].message.content;
}

async function testChatStream(expected) {
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: 'system', content: 'You are a poet.' }, { role: 'user', content: 'Speak of love' }],
    max_tokens: 8,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  let first = true;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    if (first) {
      assert.equal(chunk.choices[0].delta.role, 'assistant');
      first = false;
    }
    text += chunk.choices[0].delta.content ?? '';
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(text, expected, 'streamed text equals the full response (greedy)');
  assert.ok(['stop', 'length'].includes(finish));
  assert.ok(usage && usage.completion_tokens > 0, 'usage chunk received');
}

async function testCompletions() {
  const r = await client.completions.create({ model, prompt: 'ROMEO:', max_tokens: 6, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  const stream = await client.completions.create({
    model, prompt: 'ROMEO:', max_tokens: 6, temperature: 0, stream: true,
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text, 'streamed completion equals the full one');
  const echo = await client.completions.create({
    model, prompt: 'ROMEO:', max_tokens: 1, temperature: 0, echo: true, logprobs: 1,
  });
  assert.ok(echo.choices[0].text.startsWith('ROMEO:'));
  assert.equal(echo.choices[0].logprobs.token_logprobs[0], null);
}

async function testErrors() {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
  const bad = new OpenAI({ baseURL: process.env.DH_BASE_URL, apiKey: 'wrong-key', maxRetries: 0 });
  if (process.env.DH_API_KEY) {
    await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  }
}

const tests = [testModels, async () => testChatStream(await testChat()), testCompletions, testErrors];
let failed = 0;
for (const t of tests) {
  try {
    await t();
    console.log(`ok ${t.name || 'chat'}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${t.name || 'chat'}: ${e.stack || e}`);
  }
}
process.exit(failed ? 1 : 0);
