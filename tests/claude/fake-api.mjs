#!/usr/bin/env node
// A fake Anthropic Messages API for recording and checking the Claude Code CLI's output
// (see CONTRIBUTING.md, "Claude Code transcripts"). Node only, no dependencies.
//
//   node tests/claude/fake-api.mjs [--log] [PORT_FILE]
//
// Listens on 127.0.0.1, on a port the system picks, and prints `listening PORT` as its first
// line on stdout (and writes PORT to PORT_FILE when given). `--log` (or FAKE_API_LOG=1) logs
// every request to stderr. It stops on SIGTERM or SIGINT.
//
// The scenario is the word `scenario:NAME` in the user's prompt (default `ok`):
//   ok        one text reply
//   tool      a Bash tool_use of `echo tool-ran`, then after the tool_result a text reply
//   maxturns  a tool_use on every turn, so `--max-turns 2` ends the run
//   401 429 529 500
//             the HTTP error with Anthropic's JSON error body
//   slow      a text reply in several deltas with short pauses
//   usage-limit, usage-limit-SECONDS
//             a subscription's usage limit: HTTP 429 with the unified rate-limit headers
//             (`anthropic-ratelimit-unified-status: rejected`, `-reset`, the
//             `-representative-claim` `five_hour`, `retry-after`) until the limit resets,
//             SECONDS (default 3600) after the scenario's first request; then as `ok`. The
//             CLI reads these headers only when it runs on a subscription
//             (`CLAUDE_CODE_OAUTH_TOKEN` instead of `ANTHROPIC_API_KEY`).
//   storm-STATUS-SECONDS
//             a storm: HTTP STATUS (429 or 529) for SECONDS after the scenario's first
//             request, with `retry-after: 1`; then as `ok`
//   hang      the request is taken and never answered (a stuck API)
//   cut       a streamed reply that stops after its first delta: the connection is cut
// Requests that are not the conversation itself (a title or summary asked of a small model,
// token counts, probes, telemetry) get a short harmless answer.

import http from 'node:http';
import fs from 'node:fs';

const args = process.argv.slice(2);
const log = args.includes('--log') || process.env.FAKE_API_LOG === '1';
const portFile = args.find((a) => !a.startsWith('--'));

const ERRORS = {
  401: ['authentication_error', 'invalid x-api-key'],
  429: ['rate_limit_error', 'Number of request tokens has exceeded your per-minute rate limit'],
  500: ['api_error', 'Internal server error'],
  529: ['overloaded_error', 'Overloaded'],
};

// When each usage-limit scenario's limit resets (and each storm ends), in seconds since the
// epoch.
const resets = new Map();

let counter = 0;
const nextId = (prefix) => `${prefix}_fake_${String(++counter).padStart(4, '0')}`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function logLine(text) {
  if (log) process.stderr.write(`fake-api: ${text}\n`);
}

// The text of a message's content, whether a string or a list of blocks.
function textOf(content) {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .map((block) => {
      if (block.type === 'text') return block.text;
      if (block.type === 'tool_result') return textOf(block.content);
      return '';
    })
    .join('\n');
}

// The scenario of a conversation: the last `scenario:NAME` in its user messages.
function scenarioOf(messages) {
  let found = null;
  for (const message of messages) {
    if (message.role !== 'user') continue;
    for (const match of textOf(message.content).matchAll(/scenario:([A-Za-z0-9_-]+)/g)) {
      found = match[1];
    }
  }
  return found;
}

function hasToolResult(messages) {
  const last = messages[messages.length - 1];
  return (
    last !== undefined &&
    Array.isArray(last.content) &&
    last.content.some((block) => block.type === 'tool_result')
  );
}

// The conversation itself offers tools; a side request (a title, a summary) offers none.
function isConversation(body) {
  return Array.isArray(body.tools) && body.tools.length > 0;
}

// What to answer: a list of content blocks and a stop reason, or an HTTP error.
function plan(body) {
  const messages = Array.isArray(body.messages) ? body.messages : [];
  if (!isConversation(body)) {
    return { blocks: [{ type: 'text', text: 'Fake reply' }], stop: 'end_turn' };
  }
  const scenario = scenarioOf(messages) ?? 'ok';
  if (ERRORS[scenario] !== undefined) return { error: Number(scenario) };
  const limit = /^usage-limit(?:-([0-9]+))?$/.exec(scenario);
  if (limit !== null) {
    const now = Math.floor(Date.now() / 1000);
    if (!resets.has(scenario)) resets.set(scenario, now + Number(limit[1] ?? 3600));
    const reset = resets.get(scenario);
    if (now < reset) return { error: 429, reset };
  }
  const storm = /^storm-(429|529)-([0-9]+)$/.exec(scenario);
  if (storm !== null) {
    const now = Date.now() / 1000;
    if (!resets.has(scenario)) {
      resets.set(scenario, now + Number(storm[2]));
      // When it starts and ends, for a benchmark to measure from.
      logLine(`storm ${scenario} from ${now.toFixed(3)} until ${resets.get(scenario).toFixed(3)}`);
    }
    if (now < resets.get(scenario)) return { error: Number(storm[1]), retryAfter: 1 };
  }
  const toolUse = () => ({
    type: 'tool_use',
    id: nextId('toolu'),
    name: 'Bash',
    input: { command: 'echo tool-ran', description: 'Print a marker' },
  });
  switch (scenario) {
    case 'tool':
      if (hasToolResult(messages)) {
        return { blocks: [{ type: 'text', text: 'The tool ran.' }], stop: 'end_turn' };
      }
      return { blocks: [{ type: 'text', text: 'Running a tool.' }, toolUse()], stop: 'tool_use' };
    case 'maxturns':
      return { blocks: [toolUse()], stop: 'tool_use' };
    case 'hang':
      return { hang: true, stop: 'hang' };
    case 'cut':
      return {
        blocks: [{ type: 'text', text: 'A reply that is cut off in the middle.' }],
        stop: 'cut',
        cut: true,
      };
    case 'slow':
      return {
        blocks: [{ type: 'text', text: 'Slow reply in several parts.' }],
        stop: 'end_turn',
        pause: 150,
      };
    default:
      return { blocks: [{ type: 'text', text: 'Hello from the fake API.' }], stop: 'end_turn' };
  }
}

function usage(output) {
  return {
    input_tokens: 12,
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: 0,
    output_tokens: output,
    service_tier: 'standard',
  };
}

function sendJson(res, status, value, headers = {}) {
  const body = JSON.stringify(value);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
    'request-id': nextId('req'),
    ...headers,
  });
  res.end(body);
}

function sendError(res, status, reset, retryAfter = 0) {
  const [type, message] = ERRORS[status];
  let headers = status === 429 || status === 529 ? { 'retry-after': String(retryAfter) } : {};
  if (reset !== undefined) {
    // What a subscription account gets at its usage limit.
    const wait = Math.max(0, reset - Math.floor(Date.now() / 1000));
    headers = {
      'retry-after': String(wait),
      'anthropic-ratelimit-unified-status': 'rejected',
      'anthropic-ratelimit-unified-reset': String(reset),
      'anthropic-ratelimit-unified-representative-claim': 'five_hour',
      'anthropic-ratelimit-unified-5h-status': 'rejected',
      'anthropic-ratelimit-unified-5h-reset': String(reset),
      'anthropic-ratelimit-unified-overage-status': 'rejected',
    };
  }
  sendJson(res, status, { type: 'error', error: { type, message } }, headers);
}

// Splits a text into a few deltas, so that streaming shows more than one.
function pieces(text) {
  const words = text.split(/(?<= )/);
  return words.length > 1 ? words : [text];
}

async function stream(res, body, answer) {
  res.writeHead(200, {
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache',
    'request-id': nextId('req'),
  });
  const send = (event, data) => res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
  send('message_start', {
    type: 'message_start',
    message: {
      id: nextId('msg'),
      type: 'message',
      role: 'assistant',
      model: body.model ?? 'claude-fake',
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: usage(1),
    },
  });
  let index = 0;
  for (const block of answer.blocks) {
    if (block.type === 'text') {
      send('content_block_start', {
        type: 'content_block_start',
        index,
        content_block: { type: 'text', text: '' },
      });
      for (const piece of pieces(block.text)) {
        if (answer.pause) await sleep(answer.pause);
        send('content_block_delta', {
          type: 'content_block_delta',
          index,
          delta: { type: 'text_delta', text: piece },
        });
        if (answer.cut) {
          // The stream stops here, mid-message, as a dropped connection does.
          res.destroy();
          return;
        }
      }
    } else {
      send('content_block_start', {
        type: 'content_block_start',
        index,
        content_block: { type: 'tool_use', id: block.id, name: block.name, input: {} },
      });
      send('content_block_delta', {
        type: 'content_block_delta',
        index,
        delta: { type: 'input_json_delta', partial_json: JSON.stringify(block.input) },
      });
    }
    send('content_block_stop', { type: 'content_block_stop', index });
    index += 1;
  }
  send('message_delta', {
    type: 'message_delta',
    delta: { stop_reason: answer.stop, stop_sequence: null },
    usage: { output_tokens: 8 },
  });
  send('message_stop', { type: 'message_stop' });
  res.end();
}

async function messages(req, res, raw) {
  let body;
  try {
    body = JSON.parse(raw);
  } catch {
    sendJson(res, 400, {
      type: 'error',
      error: { type: 'invalid_request_error', message: 'body is not JSON' },
    });
    return;
  }
  const answer = plan(body);
  logLine(
    `messages model=${body.model} stream=${Boolean(body.stream)} tools=${
      Array.isArray(body.tools) ? body.tools.length : 0
    } messages=${Array.isArray(body.messages) ? body.messages.length : 0} -> ${
      answer.error ?? answer.stop
    }`,
  );
  if (answer.hang) {
    // Never answered; the socket closes when the client gives up or the server stops.
    return;
  }
  if (answer.error !== undefined) {
    sendError(res, answer.error, answer.reset, answer.retryAfter);
  } else if (body.stream) {
    await stream(res, body, answer);
  } else {
    sendJson(res, 200, {
      id: nextId('msg'),
      type: 'message',
      role: 'assistant',
      model: body.model ?? 'claude-fake',
      content: answer.blocks,
      stop_reason: answer.stop,
      stop_sequence: null,
      usage: usage(8),
    });
  }
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    const raw = Buffer.concat(chunks).toString('utf8');
    const path = (req.url ?? '/').split('?')[0];
    logLine(`${req.method} ${req.url} (${raw.length} bytes)`);
    if (req.method === 'POST' && path === '/v1/messages') {
      messages(req, res, raw).catch((error) => {
        logLine(`error: ${error}`);
        res.destroy();
      });
    } else if (req.method === 'POST' && path === '/v1/messages/count_tokens') {
      sendJson(res, 200, { input_tokens: 12 });
    } else if (req.method === 'HEAD') {
      res.writeHead(200);
      res.end();
    } else {
      sendJson(res, 200, {});
    }
  });
});

server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  if (portFile !== undefined) fs.writeFileSync(portFile, `${port}\n`);
  process.stdout.write(`listening ${port}\n`);
});

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => {
    server.close();
    process.exit(0);
  });
}
