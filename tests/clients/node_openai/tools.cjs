// Drives /v1/chat/completions with the official openai npm package (tests/clients/test_node_openai_sdk.py).
//
//   node tools.cjs BASE_URL < cases.json
//
// Each case is {"name", "body", "stream"}; every answer's choices go to stdout as one JSON line per
// case: {"name", "choices": [{"index", "finish_reason", "content", "tool_calls": [{"id", "type",
// "name", "arguments"}]}]}. A streamed case is run twice: its chunks accumulated by hand (by choice,
// then by tool call index, as OpenAI documents the deltas), and through the SDK's own accumulator
// (chat.completions.stream(...).finalChatCompletion()), reported as "sdk_choices".
"use strict";

const OpenAI = require("openai");

function choiceOf(choice) {
  const message = choice.message;
  return {
    index: choice.index,
    finish_reason: choice.finish_reason,
    content: message.content,
    tool_calls: (message.tool_calls || []).map((call) => ({
      id: call.id, type: call.type, name: call.function.name, arguments: call.function.arguments,
    })),
  };
}

async function accumulated(client, body) {
  const choices = new Map();
  const stream = await client.chat.completions.create({ ...body, stream: true });
  for await (const chunk of stream) {
    for (const delta of chunk.choices) {
      const choice = choices.get(delta.index)
        || { index: delta.index, finish_reason: null, content: null, calls: new Map() };
      choices.set(delta.index, choice);
      if (delta.delta.content) choice.content = (choice.content || "") + delta.delta.content;
      for (const part of delta.delta.tool_calls || []) {
        const call = choice.calls.get(part.index) || { id: "", type: "", name: "", arguments: "" };
        choice.calls.set(part.index, call);
        if (part.id) call.id += part.id;
        if (part.type) call.type = part.type;
        if (part.function && part.function.name) call.name += part.function.name;
        if (part.function && part.function.arguments) call.arguments += part.function.arguments;
      }
      if (delta.finish_reason) choice.finish_reason = delta.finish_reason;
    }
  }
  return [...choices.values()].sort((a, b) => a.index - b.index).map((choice) => ({
    index: choice.index, finish_reason: choice.finish_reason, content: choice.content,
    tool_calls: [...choice.calls.entries()].sort((a, b) => a[0] - b[0]).map(([, call]) => call),
  }));
}

async function run(client, testCase) {
  const body = { model: "", ...testCase.body };
  if (!testCase.stream) {
    const answer = await client.chat.completions.create(body);
    return { name: testCase.name, choices: answer.choices.map(choiceOf) };
  }
  const choices = await accumulated(client, body);
  const final = await client.chat.completions.stream(body).finalChatCompletion();
  return { name: testCase.name, choices, sdk_choices: final.choices.map(choiceOf) };
}

async function main() {
  const client = new OpenAI({ baseURL: process.argv[2], apiKey: "none", maxRetries: 0, timeout: 120000 });
  let input = "";
  for await (const piece of process.stdin) input += piece;
  for (const testCase of JSON.parse(input)) {
    process.stdout.write(JSON.stringify(await run(client, testCase)) + "\n");
  }
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
