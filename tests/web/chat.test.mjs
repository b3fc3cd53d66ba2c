// End-to-end test of the web chat page (GET /) in headless Chromium, against the real daemon and
// the project's mock model: what a user sees when sending, while a turn runs (steps, tool calls,
// the model's reasoning folded away, the streamed reply), and across a dropped connection (the
// reply that arrived meanwhile shows up once after the reconnect). Run through tests/web/run
// (ctest web_chat).
// Usage: node chat.test.mjs --baton PATH --bench PATH [--chromium PATH]
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
if (!args.baton || !args.bench) {
  console.error('usage: node chat.test.mjs --baton PATH --bench PATH [--chromium PATH]');
  process.exit(2);
}
const executablePath = args.chromium || '/usr/bin/chromium';
// The mock answers each model call after this long: a reply is produced while the page is away.
const MODEL_DELAY_MS = 1500;
// Generous for an ASan build on a busy 2-core machine; a hung run still ends.
const WAIT_MS = 30000;

const work = mkdtempSync(join(tmpdir(), 'baton-web-'));
const children = [];
let browser = null;

const t0 = Date.now();
function log(...a) { console.log(`web_chat: [${((Date.now() - t0) / 1000).toFixed(1)} s]`, ...a); }

// Starts a process that prints `listening on http://HOST:PORT` and resolves that URL.
function start(name, cmd, argv) {
  const child = spawn(cmd, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  const entry = { name, child, out: '', err: '' };
  children.push(entry);
  child.stderr.on('data', (d) => { entry.err += d; });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name}: no 'listening on' line in 20 s`)), 20000);
    child.stdout.on('data', (d) => {
      entry.out += d;
      const m = /^listening on (https?:\/\/\S+)/m.exec(entry.out);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    child.on('exit', (code, sig) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code ?? sig}) before listening:\n${entry.err.slice(-2000)}`));
    });
  });
}

// Stops everything started here: by pid, TERM then (after 15 s) KILL, so nothing outlives the
// test. Returns the processes that did not exit 0 on TERM (under ASan, a leak or error report).
async function stopAll() {
  if (browser) await browser.close().catch(() => {});
  browser = null;
  const unclean = await Promise.all(children.map((entry) => new Promise((resolve) => {
    const { child } = entry;
    const verdict = () =>
      (child.exitCode === 0 ? null : `${entry.name} (${child.exitCode ?? child.signalCode})`);
    if (child.exitCode !== null || child.signalCode !== null) return resolve(verdict());
    const kill = setTimeout(() => child.kill('SIGKILL'), 15000);
    child.once('exit', () => { clearTimeout(kill); resolve(verdict()); });
    child.kill('SIGTERM');
  })));
  rmSync(work, { recursive: true, force: true });
  return unclean.filter(Boolean);
}

function printStderr() {
  for (const { name, err } of children) {
    if (err) console.error(`--- ${name} stderr (tail)\n${err.slice(-3000)}`);
  }
}

function check(cond, message) {
  if (!cond) throw new Error(message);
}

// Awaits a step, so that a timeout names what the user would have missed.
async function expect(what, promise) {
  try {
    return await promise;
  } catch (e) {
    throw new Error(`${what}: ${e.message.replace(/\x1b\[[0-9;]*m/g, '')}`);
  }
}

async function getJson(url) {
  const r = await fetch(url);
  return { status: r.status, body: await r.json().catch(() => null) };
}

// Polls fn until it returns a truthy value, at most ms.
async function until(what, fn, ms = WAIT_MS) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function run() {
  const mock = await start('mock-model', args.bench,
    ['mock-model', '--listen', '127.0.0.1:0', '--delay-ms', String(MODEL_DELAY_MS), '--reasoning']);
  const config = join(work, 'baton.json');
  // The clock tool makes each turn a tool call and then an answer: steps and tool lines to see;
  // with --reasoning each of the two model calls first streams "thinking about: <text>".
  writeFileSync(config, JSON.stringify({
    agents: { default: {
      model: { provider: 'openai', base_url: `${mock}/v1`, model: 'mock', stream: true, timeout_ms: 20000 },
      tools: ['clock'],
    } },
  }));
  const base = await start('baton', args.baton,
    ['serve', '--config', config, '--listen', '127.0.0.1:0', '--data', join(work, 'data')]);
  log('daemon at', base, 'mock at', mock);

  // Root (CI) cannot run Chromium's sandbox; a user account can.
  const launchArgs = ['--disable-dev-shm-usage'];
  if (process.getuid && process.getuid() === 0) launchArgs.push('--no-sandbox');
  browser = await chromium.launch({ executablePath, headless: true, args: launchArgs, timeout: WAIT_MS });
  const page = await browser.newPage();
  page.setDefaultTimeout(WAIT_MS);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  // Every frame of every socket the page opens, to tell which connection carried a reply.
  const sockets = [];
  page.on('websocket', (ws) => {
    const s = { url: ws.url(), received: [], sent: [] };
    sockets.push(s);
    const parse = (p) => { try { return JSON.parse(p); } catch { return { unparsed: String(p) }; } };
    ws.on('framereceived', (f) => s.received.push(parse(f.payload)));
    ws.on('framesent', (f) => s.sent.push(parse(f.payload)));
  });

  const session = `web-test-${process.pid}`;
  const resp = await page.goto(`${base}/?session=${session}`);
  check(resp.status() === 200, `GET / answered ${resp.status()}`);
  check((resp.headers()['content-type'] || '').startsWith('text/html'), 'GET / is not text/html');
  await expect('the page did not connect to /v1/ws', page.waitForSelector('#status[data-state="connected"]'));
  log('page connected');
  check((await page.textContent('#session')) === session, 'the page did not take the session from the URL');

  // 1. Type and press Enter; markup in the text must stay text (the mock echoes it back).
  const first = 'hello <b>web</b>';
  await page.fill('#input', first);
  await page.press('#input', 'Enter');
  const user = page.locator('.msg.user').first();
  check((await user.textContent()) === first, 'the user message is not shown as typed');
  // A step line while the model is still thinking (the mock waits MODEL_DELAY_MS): live steps.
  const live = await expect('no step line while the model was thinking', page.waitForFunction(() => {
    const a = document.querySelector('.msg.assistant');
    const steps = a ? a.querySelector('.steps').textContent : '';
    return steps.includes('model call') && { final: a.classList.contains('final'), steps };
  }));
  check(!(await live.jsonValue()).final, 'steps appeared only with the final reply, not as they happened');
  const reply1 = `ok: ${first}`;
  await expect('the first reply did not arrive', page.waitForSelector('.msg.assistant.final'));
  const a1 = page.locator('.msg.assistant').first();
  check((await a1.locator('.text').textContent()) === reply1,
        `first reply: expected "${reply1}", got "${await a1.locator('.text').textContent()}"`);
  log('first reply shown');
  const steps1 = await a1.locator('.steps').textContent();
  check(/tool clock\(/.test(steps1), `no tool call line for clock in: ${steps1}`);
  check(/→ ok:/.test(steps1), `no tool result line in: ${steps1}`);
  check((await page.locator('#log b').count()) === 0, 'server text was rendered as HTML');
  // The reasoning of each model call is in the turn's bubble, above the reply, folded: a closed
  // <details> the user can open, and none of it in the reply text.
  const reasoning1 = `thinking about: ${first}`;
  const thoughts = await a1.locator('details.thinking').evaluateAll((els) => els.map((e) => ({
    open: e.open, state: e.dataset.state, summary: e.querySelector('summary')?.textContent,
    body: e.querySelector('.thought')?.textContent,
    aboveReply: !!(e.compareDocumentPosition(e.closest('.msg').querySelector('.text')) &
                   Node.DOCUMENT_POSITION_FOLLOWING),
  })));
  check(thoughts.length === 2, `expected a reasoning block per model call (2), got ${JSON.stringify(thoughts)}`);
  for (const th of thoughts) {
    check(th.body === reasoning1, `reasoning block: expected "${reasoning1}", got ${JSON.stringify(th)}`);
    check(!th.open && th.state === 'done' && th.summary === 'thought' && th.aboveReply,
          `the reasoning is not folded above the reply once done: ${JSON.stringify(th)}`);
  }
  check(!(await a1.locator('.text').textContent()).includes('thinking about'), 'the reasoning is in the reply');
  const thought1 = a1.locator('details.thinking .thought').first();
  check(!(await thought1.isVisible()), 'the reasoning is shown unfolded');
  await a1.locator('details.thinking summary').first().click();
  check(await thought1.isVisible(), 'clicking "thought" does not unfold the reasoning');

  // 2. A second message; the socket dies right after it is accepted, and stays down until the
  // daemon has finished the turn, so its reply can only come from the re-send on subscribe.
  const second = 'second while away';
  await page.fill('#input', second);
  await page.click('#send');
  const turnId = await (await expect('the second message was not accepted', page.waitForFunction(() => {
    for (const p of window.batonChat.state.pending.values()) if (p.text === 'second while away' && p.turn) {
      window.batonChat.dropConnection(600000);
      return p.turn;
    }
    return false;
  }, null, { polling: 10 }))).jsonValue();
  log('second turn', turnId, 'accepted; connection dropped');
  await expect('the page did not show the drop', page.waitForSelector('#status[data-state="disconnected"]'));
  const rec = await until('the second turn to finish while the page is away', async () => {
    const r = await getJson(`${base}/v1/turns/${encodeURIComponent(turnId)}`);
    return r.status === 200 && !['queued', 'running'].includes(r.body.status) && r.body;
  });
  const reply2 = `ok: ${second}`;
  check(rec.status === 'completed' && rec.reply === reply2, `second turn ended ${JSON.stringify(rec)}`);
  check((await page.getAttribute('#status', 'data-state')) === 'disconnected',
        'the page reconnected on its own');
  check(!(await page.locator('.msg.assistant.final').allTextContents()).some((t) => t.includes(reply2)),
        'the second reply was shown before the reconnect');
  // The reply waits in the outbox for a client of the session.
  const pendingOf = async () => {
    const r = await getJson(`${base}/v1/outbox?status=pending`);
    check(r.status === 200, `GET /v1/outbox answered ${r.status}`);
    return r.body.items.filter((i) => i.session_id === session);
  };
  check((await pendingOf()).some((i) => i.turn_id === turnId),
        'the reply finished during the drop is not pending in the outbox');

  await page.evaluate(() => window.batonChat.reconnect());
  await expect('the page did not reconnect', page.waitForSelector('#status[data-state="connected"]'));
  await expect('the reply finished during the drop did not show after the reconnect',
               page.waitForSelector(`.msg.assistant.final[data-turn="${turnId}"]`));
  // Time for a duplicate to arrive, were the page or the server to send it twice.
  await page.waitForTimeout(1000);
  const texts = await page.locator('.msg.assistant .text').allTextContents();
  check(texts.filter((t) => t === reply2).length === 1,
        `the second reply is not shown exactly once: ${JSON.stringify(texts)}`);
  check(texts.length === 2, `expected two assistant messages, got ${JSON.stringify(texts)}`);
  // It came from the daemon's re-send on the new connection, and the page acked it there.
  const repliesOn = (s) => s.received.filter((f) => f.type === 'reply' && f.turn_id === turnId);
  check(sockets.length === 2, `expected two connections before the reload, saw ${sockets.length}`);
  check(sockets[0].url.endsWith('/v1/ws'), `the page connected to ${sockets[0].url}`);
  check(repliesOn(sockets[0]).length === 0, 'the second reply reached the dropped connection');
  const resent = repliesOn(sockets[1]);
  check(resent.length >= 1, 'the daemon did not send the second reply after the reconnect');
  check(sockets[1].sent.some((f) => f.type === 'ack' && f.key === resent[0].key),
        'the page did not ack the re-sent reply');
  // The page's ack reached the daemon: nothing of the session is left to deliver.
  await until('the outbox to have nothing pending for the session',
              async () => (await pendingOf()).length === 0, 10000);
  const order = await page.locator('#log .msg').evaluateAll((els) => els.map((e) => e.textContent));
  check(order.length === 4 && order[2] === second && order[3].endsWith(reply2),
        `the conversation is out of order: ${JSON.stringify(order)}`);

  // 3. Reload: every reply was acked (or is remembered), so none comes back as new.
  await page.reload();
  await expect('the page did not connect after a reload',
               page.waitForSelector('#status[data-state="connected"]'));
  await page.waitForTimeout(1000);
  const after = await page.locator('.msg.assistant').count();
  check(after === 0, `after a reload ${after} old replies were shown again`);
  check(pageErrors.length === 0, `errors in the page: ${pageErrors.join('; ')}`);
  await withTokens();
  await withoutWebSocket();
}

// 5. A daemon whose WebSocket channel is off: the page says so once and does not retry (it said
// "disconnected, retrying" forever).
async function withoutWebSocket() {
  const config = join(work, 'no-ws.json');
  writeFileSync(config, JSON.stringify({ channels: { ws: { enabled: false } } }));
  const base = await start('baton (no ws)', args.baton,
    ['serve', '--config', config, '--listen', '127.0.0.1:0', '--data', join(work, 'data-no-ws')]);
  const page = await browser.newPage();
  page.setDefaultTimeout(WAIT_MS);
  const sockets = [];
  page.on('websocket', (ws) => sockets.push(ws.url()));
  await page.goto(`${base}/?session=no-ws-${process.pid}`);
  await expect('the page did not say the WebSocket channel is off', page.waitForFunction(
    () => /channel is off/.test(document.querySelector('#status').textContent)));
  await page.waitForTimeout(1500); // longer than the first retry's 0.5 s
  check(/channel is off/.test(await page.textContent('#status')), 'the page went on retrying');
  check(sockets.length === 0, `the page opened ${sockets.length} WebSockets to a daemon without them`);
  await page.close();
  log('the page against a daemon without WebSocket passed');
}

// 4. A daemon with bearer tokens behind TLS (a self-signed certificate, which this browser
// context is told to accept): the page is served over https://, talks over wss://, asks for a
// token, refuses a wrong one, chats with the right one (sent as the "bearer.<token>"
// subprotocol) and keeps it across a reload.
async function withTokens() {
  const made = execFileSync(args.baton, ['token', 'new', '--tenant', 'web'], { encoding: 'utf8' }).split('\n');
  const token = made[0];
  const cert = join(work, 'cert.pem');
  const key = join(work, 'key.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-days', '2', '-subj', '/CN=localhost', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost',
    '-keyout', key, '-out', cert], { stdio: 'ignore' });
  const config = join(work, 'tokens.json');
  writeFileSync(config, JSON.stringify({ server: {
    tokens: [JSON.parse(made[1])], tls: { cert_file: cert, key_file: key } } }));
  const base = await start('baton (tokens, TLS)', args.baton,
    ['serve', '--config', config, '--listen', '127.0.0.1:0', '--data', join(work, 'data-tokens')]);
  check(base.startsWith('https://'), `the TLS daemon said ${base}`);
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT_MS);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  const protocols = [];
  page.on('websocket', (ws) => protocols.push(ws.url()));
  const wssOnly = () => protocols.every((u) => u.startsWith('wss://'));
  await page.goto(`${base}/?session=tokens-${process.pid}`);
  await expect('the page did not ask for a token', page.waitForSelector('#login:not([hidden])'));
  check(/needs a token/.test(await page.textContent('#status')), 'the status does not say a token is needed');
  check(protocols.length === 0, 'the page opened a WebSocket without a token');
  await page.fill('#token', token + 'x');
  await page.click('#login-button');
  await expect('a wrong token was not refused', page.waitForFunction(
    () => /not accepted/.test(document.querySelector('#status').textContent) &&
          !document.querySelector('#login').hidden));
  await page.fill('#token', token);
  await page.click('#login-button');
  await expect('the page did not connect with its token', page.waitForSelector('#status[data-state="connected"]'));
  check(await page.locator('#login').isHidden(), 'the token form is still shown once connected');
  await page.fill('#input', 'with a token');
  await page.press('#input', 'Enter');
  await expect('no reply with a token', page.waitForFunction(
    () => [...document.querySelectorAll('.msg.assistant.final .text')].some((e) => e.textContent === 'echo: with a token')));
  await page.reload();
  await expect('the page did not reconnect with its kept token',
               page.waitForSelector('#status[data-state="connected"]'));
  check(await page.locator('#login').isHidden(), 'the kept token was asked for again');
  check(protocols.length > 0 && wssOnly(), `not every WebSocket was wss://: ${protocols.join(', ')}`);
  check(pageErrors.length === 0, `errors in the token page: ${pageErrors.join('; ')}`);
  await context.close();
  log('the token page over https passed');
}

const deadline = setTimeout(() => {
  console.error('web_chat: FAILED: the whole test took over 180 s');
  stopAll().finally(() => process.exit(1));
}, 180000);

try {
  await run();
  clearTimeout(deadline);
  // A clean exit on SIGTERM is part of the run: the sanitizer build reports leaks there.
  const unclean = await stopAll();
  if (unclean.length) {
    console.error(`web_chat: FAILED: not a clean exit on SIGTERM: ${unclean.join(', ')}`);
    printStderr();
    process.exit(1);
  }
  log('PASSED');
} catch (e) {
  clearTimeout(deadline);
  console.error(`web_chat: FAILED: ${e.message}`);
  printStderr();
  await stopAll();
  process.exit(1);
}
