// The official TypeScript MCP SDK as the agent's client, against the Tether
// MCP gateway: over Streamable HTTP (bearer = the capability token) and
// through `tether mcp wrap` over stdio, with the third-party
// server-filesystem behind it. Run by TestTypeScriptClientThroughTheGateway
// (go test ./agentsdk/mcpgate/), which starts the control plane and the
// gateway and sets the environment read below.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { McpError } from '@modelcontextprotocol/sdk/types.js';

function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this through go test -run TestTypeScriptClientThroughTheGateway ./agentsdk/mcpgate/`);
  return v;
}

const CODE_DENIED = -32063; // mcpgate.CodeDenied
const token = env('TETHER_CAPABILITY_TOKEN');
const fsDir = env('FS_DIR');

async function connectHTTP() {
  const client = new Client({ name: 'ts-agent', version: '1' });
  const transport = new StreamableHTTPClientTransport(new URL(env('TETHER_MCP_URL')), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  return client;
}

function text(result) {
  assert.equal(result.isError ?? false, false, JSON.stringify(result));
  return result.content.map((c) => c.text).join('');
}

function refusedFor(scope) {
  return (err) => {
    assert.ok(err instanceof McpError, `want an McpError, got ${err}`);
    assert.equal(err.code, CODE_DENIED);
    assert.match(err.message, new RegExp(scope.replace('/', '\\/')));
    return true;
  };
}

test('Streamable HTTP: tools/list shows only the granted tools', async () => {
  const client = await connectHTTP();
  try {
    const names = (await client.listTools()).tools.map((t) => t.name).sort();
    assert.ok(names.includes('test_echo'), names.join(' '));
    assert.ok(names.includes('fs_read_text_file'), names.join(' '));
    assert.ok(names.includes('fs_list_directory'), names.join(' '));
    assert.ok(!names.includes('fs_write_file'), 'write_file is not granted');
    assert.ok(!names.includes('test_slow'), 'slow is not granted');
  } finally {
    await client.close();
  }
});

test('Streamable HTTP: calls reach the Go SDK upstream and server-filesystem unchanged', async () => {
  const client = await connectHTTP();
  try {
    assert.equal(text(await client.callTool({ name: 'test_echo', arguments: { text: 'from typescript' } })), 'from typescript');
    const hello = join(fsDir, 'hello.txt');
    assert.equal(text(await client.callTool({ name: 'fs_read_text_file', arguments: { path: hello } })), readFileSync(hello, 'utf8'));
  } finally {
    await client.close();
  }
});

// The SDK's client asks for progress with the request's id, a number, as
// its progress token: the gateway takes it (it refuses only a token that
// is not a string of at most 256 bytes nor an integer of at most 2^53).
test('Streamable HTTP: a call asking for progress with the SDK\'s own token goes through', async () => {
  const client = await connectHTTP();
  try {
    const result = await client.callTool({ name: 'test_echo', arguments: { text: 'with progress' } }, undefined, { onprogress: () => {} });
    assert.equal(text(result), 'with progress');
  } finally {
    await client.close();
  }
});

test('Streamable HTTP: a tool outside the grant is refused with the scope it needs', async () => {
  const client = await connectHTTP();
  try {
    await assert.rejects(
      client.callTool({ name: 'fs_write_file', arguments: { path: join(fsDir, 'evil.txt'), content: 'x' } }),
      refusedFor('mcp:fs/write_file'),
    );
  } finally {
    await client.close();
  }
});

test('Streamable HTTP: no bearer gets 401 pointing at the protected-resource metadata', async () => {
  const url = env('TETHER_MCP_URL');
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} }),
  });
  assert.equal(res.status, 401);
  const challenge = res.headers.get('www-authenticate') ?? '';
  const metadataURL = /resource_metadata="([^"]+)"/.exec(challenge)?.[1];
  assert.ok(metadataURL, challenge);
  const meta = await (await fetch(metadataURL)).json();
  assert.equal(meta.resource, url);
  assert.deepEqual(meta.bearer_methods_supported, ['header']);
});

test('stdio: `tether mcp wrap` launched as a framework would launch server-filesystem', async () => {
  const client = new Client({ name: 'ts-agent-stdio', version: '1' });
  const transport = new StdioClientTransport({
    command: env('TETHER_BIN'),
    args: ['--addr', env('TETHER_ADDR'), 'mcp', 'wrap', '--name', 'fs', '--gate-id', env('TETHER_WRAP_GATE_ID'), '--',
      process.execPath, env('FS_SERVER'), fsDir],
    env: { ...process.env, TETHER_CAPABILITY_TOKEN: token, TETHER_GATE_TOKEN: env('TETHER_GATE_TOKEN') },
    stderr: 'inherit',
  });
  await client.connect(transport);
  try {
    const names = (await client.listTools()).tools.map((t) => t.name);
    assert.ok(names.includes('read_text_file'), names.join(' '));
    assert.ok(!names.includes('write_file'), names.join(' '));
    const hello = join(fsDir, 'hello.txt');
    assert.equal(text(await client.callTool({ name: 'read_text_file', arguments: { path: hello } })), readFileSync(hello, 'utf8'));
    await assert.rejects(
      client.callTool({ name: 'write_file', arguments: { path: join(fsDir, 'evil.txt'), content: 'x' } }),
      refusedFor('mcp:fs/write_file'),
    );
  } finally {
    await client.close();
  }
});
