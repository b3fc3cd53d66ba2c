// The JS side of the peer comparison (bench/peers/run): the same turn as `baton-bench embedded`
// (a model call that asks for the `lookup` tool, the tool, a model call that answers) with the
// OpenAI Agents SDK, against the same mock. Reports this process's CPU per turn, turns/s, peak RSS.
//
// usage: node agents_sdk.mjs --model-url URL [--turns T] [--clients C] [--warmup W] [--stream 0|1]
//                            [--history-messages M]
//
// Each of the C runners keeps its own conversation the way a baton session does: the last M user
// and assistant messages (no tool items) go in front of each new message. bench/peers/run sets M
// to what baton sent (`history_messages` of `baton-bench embedded`; 32 when this was written).
//
// Pinned (package.json): @openai/agents 0.14.3, the last release on the `openai` 6 client; later
// ones need openai 7, which needs Node >= 22. Runs on Node 20 and on Debian bookworm's Node 18.
import { resourceUsage } from 'node:process';

import {
  Agent,
  run,
  setDefaultOpenAIClient,
  setOpenAIAPI,
  setTracingDisabled,
  tool,
} from '@openai/agents';
import OpenAI from 'openai';
import { z } from 'zod';

function parseArgs(argv) {
  const opts = { modelUrl: '', turns: 2000, clients: 1, warmup: 100, stream: true, history: 32 };
  for (let i = 0; i < argv.length; i += 2) {
    const [name, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${name} needs a value`);
    if (name === '--model-url') opts.modelUrl = value;
    else if (name === '--turns') opts.turns = Number(value);
    else if (name === '--clients') opts.clients = Number(value);
    else if (name === '--warmup') opts.warmup = Number(value);
    else if (name === '--stream') opts.stream = value !== '0';
    else if (name === '--history-messages') opts.history = Number(value);
    else throw new Error(`unknown option ${name}`);
  }
  const bad =
    !opts.modelUrl ||
    !(opts.turns >= 1) ||
    !(opts.clients >= 1) ||
    !(opts.warmup >= 0) ||
    !(opts.history >= 0);
  if (bad) {
    throw new Error(
      'usage: agents_sdk.mjs --model-url URL [--turns T] [--clients C] [--warmup W] ' +
        '[--stream 0|1] [--history-messages M]',
    );
  }
  return opts;
}

const opts = parseArgs(process.argv.slice(2));

// Only the mock, on loopback, may be called: any other request (api.openai.com for tracing, say)
// fails the run. Counting here also checks that every turn made exactly two model calls.
const loopback = new Set(['127.0.0.1', 'localhost', '[::1]']);
let modelCalls = 0;
const realFetch = globalThis.fetch;
globalThis.fetch = (input, init) => {
  const url = new URL(typeof input === 'string' || input instanceof URL ? input : input.url);
  if (!loopback.has(url.hostname)) throw new Error(`refusing a request to ${url.href}`);
  modelCalls += 1;
  return realFetch(input, init);
};

setTracingDisabled(true);
setOpenAIAPI('chat_completions');
setDefaultOpenAIClient(new OpenAI({ baseURL: opts.modelUrl, apiKey: 'x', maxRetries: 0 }));

let toolCalls = 0;
const lookup = tool({
  name: 'lookup',
  description: 'Looks a word up and returns a short note about it.',
  parameters: z.object({ q: z.string() }),
  execute: async ({ q }) => {
    toolCalls += 1;
    return `note about ${q}`;
  },
});

const agent = new Agent({
  name: 'bench',
  instructions: 'You are a concise assistant. Use the lookup tool, then answer.',
  model: 'mock',
  tools: [lookup],
});

const problems = [];

async function runTurn(input) {
  if (!opts.stream) return run(agent, input);
  const result = await run(agent, input, { stream: true });
  for await (const event of result) void event; // consume the events as an application would
  await result.completed;
  return result;
}

// One runner: turns one after another while the shared counter is below `limit`.
async function runner(r, counter, limit, tally) {
  while (counter.next++ < limit) {
    r.sent += 1;
    const text = `hello from ${r.id}, turn ${r.sent}`;
    const input = [...r.history, { role: 'user', content: text }];
    let result;
    try {
      result = await runTurn(input);
    } catch (e) {
      problems.push(`${r.id} turn ${r.sent}: ${e.message}`);
      continue;
    }
    const output = typeof result.finalOutput === 'string' ? result.finalOutput : '';
    const calls = result.rawResponses.length;
    if (!output.startsWith('ok:') || calls !== 2) {
      problems.push(`${r.id} turn ${r.sent}: ${calls} model calls, output ${JSON.stringify(output)}`);
      continue;
    }
    tally.ok += 1;
    // Keeps the messages only (no tool items), as baton's context window does.
    const messages = result.history.filter((item) => item.role === 'user' || item.role === 'assistant');
    r.history = opts.history > 0 ? messages.slice(-opts.history) : [];
  }
}

async function phase(runners, limit) {
  const counter = { next: 0 };
  const tally = { ok: 0 };
  await Promise.all(runners.map((r) => runner(r, counter, limit, tally)));
  return tally;
}

const runners = Array.from({ length: opts.clients }, (_, i) => ({
  id: `peer-${i}`,
  sent: 0,
  history: [],
}));
let peakRss = process.memoryUsage().rss;
const rssTimer = setInterval(() => {
  peakRss = Math.max(peakRss, process.memoryUsage().rss);
}, 100);

const warm = await phase(runners, opts.warmup);
const cpuBefore = process.cpuUsage();
const start = process.hrtime.bigint();
const measured = await phase(runners, opts.turns);
const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
const cpu = process.cpuUsage(cpuBefore);
clearInterval(rssTimer);
peakRss = Math.max(peakRss, process.memoryUsage().rss, resourceUsage().maxRSS * 1024);

// Every model call went through fetch and every tool call through `lookup`: two and one a turn.
const turnsDone = warm.ok + measured.ok;
if (problems.length === 0 && (modelCalls !== 2 * turnsDone || toolCalls !== turnsDone)) {
  problems.push(`${turnsDone} turns made ${modelCalls} model calls and ${toolCalls} tool calls`);
}

const cpuPerTurn = measured.ok > 0 ? (cpu.user + cpu.system) / measured.ok : 0;
const turnsPerS = elapsed > 0 ? measured.ok / elapsed : 0;
const rssMb = peakRss / (1024 * 1024);
console.log(
  `agents-js: ${measured.ok} turns (+${warm.ok} warm-up) in ${elapsed.toFixed(3)} s, ` +
    `${opts.clients} runners, stream ${opts.stream ? 'on' : 'off'}, node ${process.version}`,
);
console.log(
  `cpu per turn: ${cpuPerTurn.toFixed(1)} us, turns/s: ${turnsPerS.toFixed(1)}, ` +
    `peak rss: ${rssMb.toFixed(1)} MB`,
);
if (problems.length > 0) {
  console.error(`agents_sdk.mjs: ${problems.length} problems; first: ${problems[0]}`);
  process.exitCode = 1;
}
console.log(
  JSON.stringify({
    peer: 'openai-agents-js',
    turns: measured.ok,
    clients: opts.clients,
    stream: opts.stream,
    cpu_us_per_turn: cpuPerTurn,
    turns_per_s: turnsPerS,
    rss_mb: rssMb,
    history_messages: opts.history,
  }),
);
