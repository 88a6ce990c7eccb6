// A function tool for the @openai/agents adapter tests.
import { tool } from "@openai/agents";
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
