// A Connect peer over h2c for the hostile-peer tests: a real HTTP/2 server
// on loopback standing where the control plane would, whose handlers answer
// what a test needs and hold, break or flood the rest.
import { once } from "node:events";
import http2 from "node:http2";

import { create, toBinary, type DescMessage, type MessageInitShape } from "@bufbuild/protobuf";

export type Handler = (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders) => void;

/** A Connect peer over h2c: each method's handler answers (or does not). */
export class Peer {
  readonly server: http2.Http2Server;
  readonly #sessions = new Set<http2.ServerHttp2Session>();
  url = "";

  constructor(readonly handlers: Record<string, Handler>) {
    this.server = http2.createServer();
    this.server.on("session", (s) => {
      this.#sessions.add(s);
      s.on("close", () => this.#sessions.delete(s));
    });
    this.server.on("stream", (stream, headers) => {
      stream.on("error", () => {});
      stream.resume(); // the request's messages are not read
      const method = String(headers[":path"]).split("/").pop() ?? "";
      const handler = this.handlers[method];
      if (!handler) {
        stream.respond({ ":status": 404, "content-type": "application/json" });
        stream.end(JSON.stringify({ code: "unimplemented", message: `no ${method} here` }));
        return;
      }
      handler(stream, headers);
    });
  }

  async start(): Promise<void> {
    this.server.listen(0, "127.0.0.1");
    await once(this.server, "listening");
    this.url = `http://127.0.0.1:${(this.server.address() as { port: number }).port}`;
  }

  async stop(): Promise<void> {
    for (const s of this.#sessions) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

export function unary<Desc extends DescMessage>(stream: http2.ServerHttp2Stream, schema: Desc, msg: MessageInitShape<Desc>): void {
  stream.respond({ ":status": 200, "content-type": "application/proto" });
  stream.end(Buffer.from(toBinary(schema, create(schema, msg))));
}

export function envelope(flags: number, data: Uint8Array): Buffer {
  const b = Buffer.alloc(5 + data.length);
  b[0] = flags;
  b.writeUInt32BE(data.length, 1);
  b.set(data, 5);
  return b;
}

export function streamMessage<Desc extends DescMessage>(schema: Desc, msg: MessageInitShape<Desc>): Buffer {
  return envelope(0, toBinary(schema, create(schema, msg)));
}

export function streamEnd(error?: { code: string; message: string }): Buffer {
  return envelope(2, Buffer.from(JSON.stringify(error ? { error } : {})));
}

export function respondStream(stream: http2.ServerHttp2Stream): void {
  stream.respond({ ":status": 200, "content-type": "application/connect+proto" });
}

/** Resolves when cond() holds, looking again after each turn of the event loop (no clock). */
export async function until(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((resolve) => setImmediate(resolve));
}
