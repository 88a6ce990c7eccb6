// A rogue path for the tests: a Conn to a real tether server over HTTP/2
// whose every request passes a test's interceptor after the auth one (a
// proxy, a peer or a replica under a rogue's control standing on the
// SDK's own path).
import type { Interceptor } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { Conn, MaxMessageBytes } from "../src/index.js";

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
