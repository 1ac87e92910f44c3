// One Vercel AI SDK run against legate, driven by test_ai_sdk.py:
//   node ai_sdk.mjs '{"baseURL": URL, "provider": "openai"|"anthropic", "model": NAME,
//                     "mode": "generate"|"stream", "maxRetries": N}'
// Runs a two-step agent (one call of the `read_note` tool, then the answer) and prints one JSON
// line: the final text, the tool calls and results, the steps' finish reasons and legate's
// served-by header of each step.
import { createAnthropic } from '@ai-sdk/anthropic';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, stepCountIs, streamText, tool } from 'ai';
import { z } from 'zod';

const args = JSON.parse(process.argv[2]);

const notes = { todo: 'The secret word is pineapple.' };
const tools = {
  read_note: tool({
    description: 'Read a note by name.',
    inputSchema: z.object({ name: z.string() }),
    execute: async ({ name }) => notes[name] ?? 'no such note',
  }),
};

function model() {
  if (args.provider === 'anthropic') {
    // The Anthropic provider's base URL includes /v1.
    const anthropic = createAnthropic({
      baseURL: `${args.baseURL}/v1`,
      apiKey: 'dummy-client-key',
    });
    return anthropic(args.model);
  }
  // The Chat Completions model explicitly: `openai(model)` means the Responses API.
  const openai = createOpenAI({ baseURL: `${args.baseURL}/v1`, apiKey: 'dummy-client-key' });
  return openai.chat(args.model);
}

const request = {
  model: model(),
  tools,
  stopWhen: stepCountIs(3),
  // legate retries and falls back; the SDK's own retries would multiply that.
  maxRetries: args.maxRetries ?? 0,
  prompt: 'What does the note "todo" say?',
};

function summary(text, steps) {
  return {
    text,
    toolCalls: steps.flatMap((s) => s.toolCalls.map((c) => ({ name: c.toolName, input: c.input }))),
    toolResults: steps.flatMap((s) => s.toolResults.map((r) => r.output)),
    finishReasons: steps.map((s) => s.finishReason),
    servedBy: steps.map((s) => s.response?.headers?.['x-legate-served-by'] ?? null),
  };
}

let out;
if (args.mode === 'stream') {
  let error = null;
  const result = streamText({ ...request, onError: ({ error: e }) => { error = e; } });
  let streamed = '';
  for await (const delta of result.textStream) streamed += delta;
  if (error) throw error;
  out = { ...summary(await result.text, await result.steps), streamed };
} else {
  const result = await generateText(request);
  out = summary(result.text, result.steps);
}
process.stdout.write(`${JSON.stringify(out)}\n`);
