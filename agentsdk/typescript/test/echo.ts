// A function tool for the @openai/agents adapter tests.
import { tool } from "@openai/agents";
import { z } from "zod";

/** A function tool named name that answers `${name} ${x}`. */
export const echo = (name: string) =>
  tool({ name, description: name, parameters: z.object({ x: z.string() }), execute: async ({ x }) => `${name} ${x}` });
