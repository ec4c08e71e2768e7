// End-to-end test of `qinfer serve` with the official `openai` npm client:
// non-streaming and streaming chat, tool definitions and tool-call history,
// concurrent requests, completions and error statuses, against a server
// started here on loopback with a reference model.
//
//   node e2e.mjs QINFER_BINARY REFERENCE_DIR
//
// Exit 0 = pass, 1 = fail, 77 = skipped (openai package or model missing;
// run `npm ci` in this folder, scripts/setup.sh does).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';

const here = dirname(fileURLToPath(import.meta.url));
const [binary, refDir] = process.argv.slice(2);
const model = join(refDir || '', 'tiny-qwen35.q4_k_m.gguf');
if (!existsSync(join(here, 'node_modules', 'openai'))) {
  console.log('SKIP: the openai package is not installed (run npm ci in tests/server_e2e)');
  process.exit(77);
}
if (!binary || !existsSync(binary) || !existsSync(model)) {
  console.log(`SKIP: qinfer binary or reference model missing (${binary}, ${model})`);
  process.exit(77);
}
const { default: OpenAI } = await import('openai');

const KEY = 'e2e-test-key';
const server = spawn(binary, ['serve', '-m', model, '--port', '0', '-np', '4', '-c', '1024', '-t', '1',
                              '--api-key', KEY, '--shutdown-grace', '2'],
                     { stdio: ['ignore', 'inherit', 'pipe'] });
const watchdog = setTimeout(() => { console.error('FAIL: timed out'); server.kill('SIGKILL'); process.exit(1); }, 240_000);

const port = await new Promise((resolve, reject) => {
  let err = '';
  server.stderr.on('data', (d) => {
    err += d.toString();
    process.stderr.write(d);
    const m = err.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) resolve(Number(m[1]));
  });
  server.on('exit', (code) => reject(new Error(`server exited with ${code}: ${err}`)));
});
const base = `http://127.0.0.1:${port}`;
for (let i = 0; ; i++) {
  const r = await fetch(`${base}/health`).catch(() => null);
  if (r && r.status === 200) break;
  if (i > 600) throw new Error('server never became ready');
  await new Promise((r) => setTimeout(r, 50));
}

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0, timeout: 60_000 });
let failures = 0;
async function check(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

const greedy = { model: 'tiny', temperature: 0, max_tokens: 12 };
const messages = [{ role: 'system', content: 'You are helpful.' }, { role: 'user', content: 'Say something.' }];

await check('models.list', async () => {
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(typeof models.data[0].id, 'string');
});

let whole;
await check('chat, non-streaming', async () => {
  whole = await client.chat.completions.create({ ...greedy, messages });
  assert.equal(whole.object, 'chat.completion');
  const c = whole.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.ok(whole.usage.prompt_tokens > 5);
  assert.ok(whole.usage.completion_tokens >= 1 && whole.usage.completion_tokens <= 12);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
});

await check('chat, streaming equals non-streaming', async () => {
  const stream = await client.chat.completions.create({ ...greedy, messages, stream: true,
                                                        stream_options: { include_usage: true } });
  let content = '', reasoning = '', finish = null, usage = null, n = 0;
  for await (const chunk of stream) {
    n++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      content += c.delta.content ?? '';
      reasoning += c.delta.reasoning_content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(n >= 2);
  assert.equal(content, whole.choices[0].message.content ?? '');
  assert.equal(reasoning, whole.choices[0].message.reasoning_content ?? '');
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.deepEqual(usage.completion_tokens, whole.usage.completion_tokens);
});

await check('chat with tools and tool-call history', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const history = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null,
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
  ];
  const plain = await client.chat.completions.create({ ...greedy, max_tokens: 4, messages: history });
  const r = await client.chat.completions.create({ ...greedy, max_tokens: 4, messages: history, tools });
  // The tool definitions are rendered into the prompt.
  assert.ok(r.usage.prompt_tokens > plain.usage.prompt_tokens + 20, `${r.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);
  const c = r.choices[0];
  assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason));
  if (c.message.tool_calls) {
    for (const tc of c.message.tool_calls) {
      assert.equal(tc.type, 'function');
      JSON.parse(tc.function.arguments);
    }
  }
  // A malformed tool call in the history is the client's error.
  await assert.rejects(client.chat.completions.create({ ...greedy, messages: [history[0],
    { role: 'assistant', content: null, tool_calls: [{ id: 'x', type: 'function', function: { name: 'f', arguments: '{oops' } }] },
    history[2]], tools }), (e) => e.status === 400);
});

await check('thinking off via chat_template_kwargs', async () => {
  const r = await client.chat.completions.create({ ...greedy, messages, chat_template_kwargs: { enable_thinking: false } });
  assert.ok(r.usage.prompt_tokens > whole.usage.prompt_tokens, 'the empty think block is part of the prompt');
});

await check('concurrent requests equal sequential ones', async () => {
  const bodies = Array.from({ length: 8 }, (_, i) => ({ ...greedy, max_tokens: 6 + i,
    messages: [{ role: 'user', content: `Question ${i * 13}` }] }));
  const seq = [];
  for (const b of bodies) seq.push(await client.chat.completions.create(b));
  const par = await Promise.all(bodies.map((b, i) => (i % 2
    ? client.chat.completions.create(b)
    : (async () => {
        const s = await client.chat.completions.create({ ...b, stream: true });
        let content = '', reasoning = '';
        for await (const ch of s) for (const c of ch.choices) { content += c.delta.content ?? ''; reasoning += c.delta.reasoning_content ?? ''; }
        return { choices: [{ message: { content, reasoning_content: reasoning } }] };
      })())));
  for (let i = 0; i < bodies.length; i++) {
    assert.equal(par[i].choices[0].message.content ?? '', seq[i].choices[0].message.content ?? '', `request ${i}`);
    assert.equal(par[i].choices[0].message.reasoning_content ?? '', seq[i].choices[0].message.reasoning_content ?? '', `request ${i}`);
  }
});

await check('completions', async () => {
  const r = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(r.usage.completion_tokens <= 5);
});

await check('errors: bad parameters, context, API key', async () => {
  await assert.rejects(client.chat.completions.create({ ...greedy, messages, temperature: -1 }),
    (e) => e.status === 400 && /temperature/.test(e.message));
  await assert.rejects(client.chat.completions.create({ ...greedy, messages, max_tokens: 100000 }),
    (e) => e.status === 400 && /context/.test(e.message));
  const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401);
  const h = await fetch(`${base}/health`);
  assert.equal(h.status, 200);
});

server.kill('SIGTERM');
const code = await new Promise((r) => server.on('exit', (c) => r(c)));
clearTimeout(watchdog);
if (code !== 0) { console.log(`FAIL server exit code ${code} after SIGTERM`); failures++; }
console.log(failures ? `${failures} failed` : 'all passed');
process.exit(failures ? 1 : 0);
