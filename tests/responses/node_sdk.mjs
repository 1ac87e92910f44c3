// The official OpenAI Node SDK's Responses API against legate: responses.create,
// responses.stream and responses.retrieve, then a function-call round trip chained by
// previous_response_id. Prints one JSON line for the pytest driver to check.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "dummy-client-key", maxRetries: 0 });
const tools = [{
  type: "function", name: "weather", description: "Weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  strict: false,
}];

const first = await client.responses.create({ model, input: "Weather in Oslo?", tools });
const call = first.output.find((i) => i.type === "function_call");
const stream = client.responses.stream({
  model, tools, previous_response_id: first.id,
  input: [{ type: "function_call_output", call_id: call.call_id, output: "rain" }],
});
let deltas = "";
for await (const event of stream) {
  if (event.type === "response.output_text.delta") deltas += event.delta;
}
const second = await stream.finalResponse();
const again = await client.responses.retrieve(second.id);
console.log(JSON.stringify({
  call: { name: call.name, arguments: JSON.parse(call.arguments) },
  deltas, text: second.output_text, retrieved: again.output_text ?? again.output?.[0]?.content?.[0]?.text,
}));
