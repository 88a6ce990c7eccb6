// A flake audit of the TypeScript tests' server, as the Go tests'
// (internal/freeport, TestMembersPortsAreNotTheKernelsToHandOut): the port
// a `tether serve` is started on came from a listen on port 0, in the
// kernel's ephemeral range, released before the server bound it — and in
// between the kernel could hand it to any listen on port 0 or outgoing
// connection of any process (this one's own clients and peers included),
// so that the server exited "address already in use" (seen: rogue26's
// server, "listen tcp 127.0.0.1:40099: bind: address already in use").
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { ephemeralLow, freePort, portFloor } from "./server.js";

describe("rogue32g: the test server's port", () => {
  test("is picked below the kernel's ephemeral range, where no listen on port 0 nor outgoing connection gets it", async (t) => {
    const low = ephemeralLow();
    if (low <= portFloor) {
      t.skip(`no room below the ephemeral range (it starts at ${low})`);
      return;
    }
    for (let i = 0; i < 20; i++) {
      const port = await freePort();
      assert.ok(port >= portFloor && port < low, `port ${port} is in the kernel's ephemeral range (from ${low}): it may be handed out before the server binds it`);
    }
  });
});
