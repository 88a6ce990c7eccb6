// A function tool for the @openai/agents adapter tests, and a scripted
// model's call of a sandbox shell's command.
import { tool } from "@openai/agents";
import { functionCall } from "@openai/agents/testing";
import { z } from "zod";

/** A function tool named name that answers `${name} ${x}`. */
export const echo = (name: string) =>
  tool({ name, description: name, parameters: z.object({ x: z.string() }), execute: async ({ x }) => `${name} ${x}` });

/** echo(name), running before first each time it is called. */
export const echoAfter = (name: string, before: () => Promise<void>): ReturnType<typeof echo> => {
  const e = echo(name);
  return {
    ...e,
    invoke: async (...args: Parameters<typeof e.invoke>) => {
      await before();
      return e.invoke(...args);
    },
  };
};

/**
 * A scripted model's call (callId) of a sandbox shell capability's
 * exec_command running cmd. yield_time_ms: the local sandbox waits for a
 * command's exit up to this long on a timer it leaves running (10 s by
 * default, holding the test process after its tests).
 */
export const exec = (cmd: string, callId: string) => functionCall("exec_command", { cmd, login: false, yield_time_ms: 1000 }, { callId });
