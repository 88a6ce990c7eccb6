// A rogue path for the tests: a Conn to a real tether server over HTTP/2
// whose every request passes a test's interceptor after the auth one (a
// proxy, a peer or a replica under a rogue's control standing on the
// SDK's own path).
import assert from "node:assert/strict";

import type { Interceptor } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { Conn, MaxMessageBytes, ToolCallCancelled, type ToolGate } from "../src/index.js";
import { CallResolution, type ToolCall } from "../src/gen/tether/v1/tool_pb.js";
import { within } from "./server.js";

// dialThrough dials the control plane at baseUrl with token over HTTP/2,
// each request passing interceptor after the auth one (the rogue path);
// closeSessions aborts the HTTP/2 sessions it opened.
export function dialThrough(baseUrl: string, token: string, interceptor: Interceptor): { conn: Conn; closeSessions: () => void } {
  const managers: Http2SessionManager[] = [];
  const conn = Conn.dial(baseUrl, token, {
    retry: { attempts: 1 },
    transport: (auth) => {
      const sessionManager = new Http2SessionManager(baseUrl);
      managers.push(sessionManager);
      return createConnectTransport({ baseUrl, httpVersion: "2", sessionManager, interceptors: [auth, interceptor], readMaxBytes: MaxMessageBytes });
    },
  });
  return {
    conn,
    closeSessions: () => {
      for (const m of managers) m.abort();
    },
  };
}

// A gated call whose tool runs until its call is cancelled.
export interface CallUntilCancelled {
  // The call's outcome.
  call: Promise<string>;
  // Resolves once the tool runs.
  running: Promise<void>;
  // The reason the tool's signal aborted with (undefined until it did).
  stoppedWith: () => unknown;
  // Ends the tool if it still runs (the test's end: a guard against the hang).
  release: () => void;
  // Waits for the call to end (20 s at the most, a guard against the hang:
  // deaf says what a call still running then means), and asserts that the
  // tool's signal and the call ended with ToolCallCancelled, and that the
  // gate recorded (recorded: what its onRecorded was given) one end of the
  // call, its cancel acknowledged.
  cancelled: (deaf: () => string, recorded: ToolCall[]) => Promise<void>;
}

// callUntilCancelled begins a call of the tool "write" through gate with
// token, whose tool runs until its signal aborts, rejecting then with the
// signal's reason, or until the test releases it.
export function callUntilCancelled(gate: ToolGate, token: string): CallUntilCancelled {
  let release!: () => void;
  const guard = new Promise<void>((resolve) => (release = resolve));
  let begun!: () => void;
  const running = new Promise<void>((resolve) => (begun = resolve));
  let stoppedWith: unknown;
  const call = gate.call(token, "write", (signal) => {
    begun();
    return new Promise<string>((resolve, reject) => {
      signal.addEventListener(
        "abort",
        () => {
          stoppedWith = signal.reason;
          reject(signal.reason);
        },
        { once: true },
      );
      void guard.then(() => resolve("the test ended with the tool still running"));
    });
  });
  const cancelled = async (deaf: () => string, recorded: ToolCall[]): Promise<void> => {
    const outcome: unknown = await within(
      call.then((v) => `resolved ${v}`, (err: unknown) => err),
      20_000,
      deaf,
    ).catch((err: unknown) => {
      release();
      throw err;
    });
    assert.ok(stoppedWith instanceof ToolCallCancelled, `the tool's signal aborted with ${String(stoppedWith)}`);
    assert.ok(outcome instanceof ToolCallCancelled, `the call ${String(outcome)}`);
    assert.equal(recorded.length, 1, `the gate reported ${recorded.length} ends of the call`);
    assert.equal(recorded[0]!.resolution, CallResolution.CANCELLED_ACKED, `the call recorded ${CallResolution[recorded[0]!.resolution]}`);
  };
  return { call, running, stoppedWith: () => stoppedWith, release, cancelled };
}
