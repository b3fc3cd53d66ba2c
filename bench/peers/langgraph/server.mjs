// LangGraph's Agent Server for JavaScript (@langchain/langgraph-api, the in-memory server that
// `langgraph dev` runs) serving graph.mjs under the id "agent", for the peer comparison.
//
// usage: node server.mjs [--port P] [--host H] [--model-url URL] [--workers N]
//                        [--state-dir DIR] [--log-level L] [--persist 1|0]
//
//   --port       0 (default) picks a free port
//   --host       127.0.0.1 (default)
//   --model-url  sets MODEL_URL for graph.mjs (else MODEL_URL from the environment), e.g.
//                http://127.0.0.1:PORT/v1
//   --workers    background run workers, i.e. runs executed at once; 10 = `langgraph dev`'s
//                default (--n-jobs-per-worker)
//   --state-dir  where the server keeps its files (.langgraph_api/*.json); default: a fresh
//                directory under the system temp dir (or $LANGGRAPH_STATE_DIR), removed on
//                SIGTERM/SIGINT. A given directory is kept, and flushed to on exit.
//   --log-level  the server's winston level (error, warn, info, debug); default warn. All of its
//                log goes to stderr.
//   --persist    1 (default, as `langgraph dev`): the in-memory state is also written, whole, to
//                --state-dir/.langgraph_api/*.json once the server has been idle for 3 s (every
//                change re-arms a 3 s timer); 0: never written (nothing but the empty directory)
//
// When ready it prints exactly one line to stdout: `listening on http://HOST:PORT`.
//
// This does what `langgraph dev` (@langchain/langgraph-cli) does, minus the CLI: the CLI spawns
// @langchain/langgraph-api's dist/cli/entrypoint.mjs under tsx with a file watcher, which calls
// startServer() from `@langchain/langgraph-api/server`; here it is called directly, in this
// process, with the same options (nWorkers = --n-jobs-per-worker, 10 by default). The CLI's
// analytics, browser opening and LangSmith look-ups are not part of it; LangSmith tracing is
// switched off through the environment, and any outbound connection to a non-loopback address is
// refused (and reported on stderr) so a benchmark run cannot leave the machine.
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

function parseArgs(argv) {
  const opts = {
    port: 0,
    host: '127.0.0.1',
    modelUrl: process.env.MODEL_URL ?? '',
    workers: 10,
    stateDir: '',
    logLevel: 'warn',
    persist: true,
  };
  for (let i = 0; i < argv.length; i += 2) {
    const [name, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${name} needs a value`);
    if (name === '--port') opts.port = Number.parseInt(value, 10);
    else if (name === '--host') opts.host = value;
    else if (name === '--model-url') opts.modelUrl = value;
    else if (name === '--workers') opts.workers = Number.parseInt(value, 10);
    else if (name === '--state-dir') opts.stateDir = value;
    else if (name === '--log-level') opts.logLevel = value;
    else if (name === '--persist') opts.persist = value !== '0';
    else throw new Error(`unknown option ${name}`);
  }
  if (!Number.isInteger(opts.port) || opts.port < 0) throw new Error('--port must be >= 0');
  if (!Number.isInteger(opts.workers) || opts.workers < 1) throw new Error('--workers must be >= 1');
  return opts;
}

const opts = parseArgs(process.argv.slice(2));

// --- no outbound network: environment first (read when the modules load) ---
for (const name of ['LANGSMITH_TRACING', 'LANGSMITH_TRACING_V2', 'LANGCHAIN_TRACING', 'LANGCHAIN_TRACING_V2']) {
  process.env[name] = 'false';
}
for (const name of ['LANGSMITH_API_KEY', 'LANGCHAIN_API_KEY', 'LANGSMITH_ENDPOINT', 'LANGCHAIN_ENDPOINT']) {
  delete process.env[name];
}
process.env.LOG_LEVEL = opts.logLevel;
process.env.NODE_ENV ??= 'development'; // as `langgraph dev` sets it for the server
if (opts.modelUrl) process.env.MODEL_URL = opts.modelUrl;

// --- and a guard: refuse connections to anything but loopback or a local socket ---
const isLoopback = (host) =>
  host === 'localhost' ||
  host === '::1' ||
  host === '[::1]' ||
  (net.isIPv4(host) && host.startsWith('127.')) ||
  /^::ffff:127\./i.test(host);
const originalConnect = net.Socket.prototype.connect;
net.Socket.prototype.connect = function connect(...args) {
  let options = args[0];
  if (Array.isArray(options)) options = options[0]; // internal normalized form
  let host;
  let isPipe = false;
  if (options !== null && typeof options === 'object') {
    if (options.path != null) isPipe = true;
    host = options.host ?? 'localhost';
  } else if (typeof options === 'string' && !/^\d+$/.test(options)) {
    isPipe = true;
  } else {
    host = typeof args[1] === 'string' ? args[1] : 'localhost';
  }
  if (!isPipe && !isLoopback(String(host))) {
    const error = new Error(`server.mjs: refused outbound connection to ${host} (loopback only)`);
    process.stderr.write(`${error.message}\n`);
    throw error;
  }
  return originalConnect.apply(this, args);
};

// --- state directory: never the repository ---
let stateDir = opts.stateDir;
const ownStateDir = !stateDir;
if (ownStateDir) {
  const parent = process.env.LANGGRAPH_STATE_DIR || os.tmpdir();
  fs.mkdirSync(parent, { recursive: true });
  stateDir = fs.mkdtempSync(path.join(parent, 'langgraph-peer-'));
} else {
  stateDir = path.resolve(stateDir);
  fs.mkdirSync(stateDir, { recursive: true });
}

// --- stop on SIGTERM/SIGINT (from here on: the state dir exists) ---
let cleanup = null;
let stopping = false;
const stop = async () => {
  if (stopping) return;
  stopping = true;
  if (ownStateDir) {
    fs.rmSync(stateDir, { recursive: true, force: true });
  } else if (cleanup) {
    await cleanup().catch((error) => process.stderr.write(`cleanup: ${error}\n`));
  }
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);

// --- the server's logger writes to stdout by default: send every level to stderr ---
const apiPackage = import.meta.resolve('@langchain/langgraph-api/package.json');
const { logger } = await import(new URL('./dist/logging.mjs', apiPackage).href);
for (const transport of logger.transports) {
  transport.stderrLevels = Object.fromEntries(
    ['error', 'warn', 'info', 'http', 'verbose', 'debug', 'silly'].map((level) => [level, true]),
  );
}

if (!opts.persist) {
  const persistModule = new URL('./dist/storage/persist.mjs', apiPackage).href;
  const { FileSystemPersistence } = await import(persistModule);
  FileSystemPersistence.prototype.schedulePersist = function schedulePersist() {};
  FileSystemPersistence.prototype.persist = async function persist() {};
}

const { startServer } = await import('@langchain/langgraph-api/server');
const graphFile = fileURLToPath(new URL('./graph.mjs', import.meta.url));

let started;
try {
  started = await startServer({
    port: opts.port,
    host: opts.host,
    nWorkers: opts.workers,
    cwd: stateDir, // graph paths are resolved against it too: the graph's is absolute
    graphs: { agent: `${graphFile}:graph` },
  });
} catch (error) {
  // The package's logger turns uncaught errors into log lines and keeps the process alive (its
  // worker loops never end), so a failed start (e.g. EADDRINUSE) has to exit here.
  process.stderr.write(`server.mjs: failed to start: ${error?.stack ?? error}\n`);
  if (ownStateDir) fs.rmSync(stateDir, { recursive: true, force: true });
  process.exit(1);
}
const { host } = started;
cleanup = started.cleanup;

const port = Number.parseInt(host.slice(host.lastIndexOf(':') + 1), 10);
const shownHost = opts.host.includes(':') ? `[${opts.host}]` : opts.host;
process.stdout.write(`listening on http://${shownHost}:${port}\n`);

