// The graph the LangGraph peer serves (registered as "agent" by server.mjs): MessagesAnnotation
// state and one node, "model", that sends the thread's whole message history to an
// OpenAI-compatible chat-completions endpoint (streaming), concatenates the deltas and appends
// the answer as an AI message. The endpoint is ${MODEL_URL}/chat/completions, MODEL_URL being
// e.g. http://127.0.0.1:PORT/v1 (read at call time, so server.mjs may set it after import).
//
// Plain fetch of the SSE stream, no LangChain chat model: the only dependencies are
// @langchain/langgraph and @langchain/core, which the server needs anyway.
import { AIMessage } from '@langchain/core/messages';
import { END, MessagesAnnotation, START, StateGraph } from '@langchain/langgraph';

const ROLES = { human: 'user', ai: 'assistant', system: 'system', tool: 'tool' };

function text(content) {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content.map((part) => (typeof part === 'string' ? part : (part?.text ?? ''))).join('');
  }
  return String(content ?? '');
}

function wire(message) {
  const type = message.getType();
  const out = { role: ROLES[type] ?? type, content: text(message.content) };
  if (type === 'tool' && message.tool_call_id) out.tool_call_id = message.tool_call_id;
  return out;
}

// Reads an SSE body and returns the concatenated choices[0].delta.content.
async function readStream(body) {
  const decoder = new TextDecoder();
  let buffer = '';
  let answer = '';
  const line = (raw) => {
    const l = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
    if (!l.startsWith('data:')) return false;
    const data = l.slice(5).trim();
    if (data === '[DONE]') return true;
    if (data === '') return false;
    const chunk = JSON.parse(data);
    const delta = chunk.choices?.[0]?.delta?.content;
    if (typeof delta === 'string') answer += delta;
    return false;
  };
  for await (const bytes of body) {
    buffer += decoder.decode(bytes, { stream: true });
    let nl;
    while ((nl = buffer.indexOf('\n')) >= 0) {
      const raw = buffer.slice(0, nl);
      buffer = buffer.slice(nl + 1);
      if (line(raw)) return answer;
    }
  }
  buffer += decoder.decode();
  if (buffer) line(buffer);
  return answer;
}

async function model(state, config) {
  const base = process.env.MODEL_URL;
  if (!base) throw new Error('MODEL_URL is not set (e.g. http://127.0.0.1:PORT/v1)');
  const response = await fetch(`${base.replace(/\/+$/, '')}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify({ model: 'mock', messages: state.messages.map(wire), stream: true }),
    signal: config?.signal,
  });
  if (!response.ok || !response.body) {
    throw new Error(`model: HTTP ${response.status} ${await response.text().catch(() => '')}`);
  }
  return { messages: [new AIMessage(await readStream(response.body))] };
}

export const graph = new StateGraph(MessagesAnnotation)
  .addNode('model', model)
  .addEdge(START, 'model')
  .addEdge('model', END)
  .compile();
