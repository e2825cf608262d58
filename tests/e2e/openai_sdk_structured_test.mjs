// The OpenAI Node SDK's structured-output helper (parse with a zod schema) and its tool-calling
// flow (named and required tool_choice, non-streamed and streamed, then the tool result sent
// back with an assistant turn whose content is null) against `deepharness serve`.
// Run by tests/e2e/openai_sdk_test.cc with DH_BASE_URL, DH_MODEL and DH_API_KEY set.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';

const client = new OpenAI({
  baseURL: process.env.DH_BASE_URL,
  apiKey: process.env.DH_API_KEY || 'unused',
  maxRetries: 0,
  timeout: 120000,
});
const model = process.env.DH_MODEL;
const parseApi = client.chat.completions.parse ? client.chat.completions : client.beta.chat.completions;

const Person = z.object({
  name: z.string().max(12),
  age: z.number().int().min(0).max(120),
  mood: z.enum(['merry', 'sad']),
  friends: z.array(z.string().max(8)).max(2),
});

async function testParse() {
  const r = await parseApi.parse({
    model,
    messages: [{ role: 'user', content: 'Describe a person.' }],
    response_format: zodResponseFormat(Person, 'person'),
    temperature: 0,
    max_tokens: 200,
  });
  const msg = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(msg.parsed, 'parsed is set');
  Person.parse(msg.parsed);  // throws when invalid
  return msg.parsed;
}

const GetWeather = z.object({ city: z.string().max(10), days: z.number().int().min(1).max(7) });
const tools = [
  zodFunction({ name: 'get_weather', parameters: GetWeather, description: 'Weather forecast' }),
  { type: 'function', function: { name: 'get_time', strict: true, parameters: { type: 'object', properties: { tz: { enum: ['UTC', 'CET'] } }, required: ['tz'], additionalProperties: false } } },
];

async function testNamedToolCall() {
  const messages = [{ role: 'user', content: 'What is the weather in Verona?' }];
  const r = await parseApi.parse({
    model, messages, tools, temperature: 0, max_tokens: 200,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.match(call.id, /^call_/);
  GetWeather.parse(call.function.parsed_arguments);
  // Send the result back, with the assistant turn as the SDK builds it (content null).
  messages.push({ role: 'assistant', content: null, tool_calls: [{ id: call.id, type: 'function', function: { name: call.function.name, arguments: call.function.arguments } }] });
  messages.push({ role: 'tool', tool_call_id: call.id, content: '{"forecast": "rain"}' });
  const after = await client.chat.completions.create({ model, messages, tools, tool_choice: 'none', temperature: 0, max_tokens: 8 });
  assert.equal(typeof after.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(after.choices[0].finish_reason));
}

async function testRequiredToolCall() {
  const r = await client.chat.completions.create({
    model, tools, temperature: 0, max_tokens: 200, tool_choice: 'required', parallel_tool_calls: false,
    messages: [{ role: 'user', content: 'Call a tool.' }],
  });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.ok(['get_weather', 'get_time'].includes(call.function.name));
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === 'get_weather') GetWeather.parse(args);
  else assert.ok(['UTC', 'CET'].includes(args.tz));
}

async function testStreamedToolCall(named) {
  const stream = await client.chat.completions.create({
    model, tools, temperature: 0, max_tokens: 200, stream: true,
    tool_choice: named ? { type: 'function', function: { name: 'get_weather' } } : 'required', parallel_tool_calls: false,
    messages: [{ role: 'user', content: 'Weather?' }],
  });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    for (const d of c.delta.tool_calls || []) {
      if (!calls[d.index]) {
        assert.ok(d.id, 'the first fragment of a call has its id');
        assert.ok(d.function.name, 'and its name');
        calls[d.index] = { id: d.id, name: d.function.name, arguments: '' };
      }
      calls[d.index].arguments += d.function.arguments || '';
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.ok(calls.length >= 1);
  if (named) {
    assert.equal(calls[0].name, 'get_weather');
    GetWeather.parse(JSON.parse(calls[0].arguments));
  } else {
    for (const call of calls) JSON.parse(call.arguments);
  }
}

async function testRunToolsHelper() {
  // The SDK's own loop: it calls our tool with the parsed arguments, sends the result back and
  // asks again; tool_choice forces the first call, the second request has tool_choice none.
  let called = 0;
  const runner = client.beta.chat.completions.runTools({
    model, temperature: 0, max_tokens: 100,
    messages: [{ role: 'user', content: 'Weather in Mantua?' }],
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
    tools: [{
      type: 'function',
      function: {
        name: 'get_weather', parse: JSON.parse, parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'], additionalProperties: false },
        function: (args) => { called++; assert.equal(typeof args.city, 'string'); return { forecast: 'sun' }; },
      },
    }],
  });
  await runner.finalChatCompletion();
  assert.equal(called, 1);
}

await testParse();
await testNamedToolCall();
await testRequiredToolCall();
await testStreamedToolCall(true);
await testStreamedToolCall(false);
await testRunToolsHelper();
console.log('structured output + tool calls through the SDK: ok');
