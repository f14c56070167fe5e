#!/usr/bin/env node
// GenerateStream with n samples, log-probabilities and the OpenAI-style sampling options, with
// @grpc/grpc-js and the .proto loaded at run time. Prints one JSON line per token:
// {"sample", "id", "text", "logprob", "top": [[id, text, logprob], ...]}.
//
//   node samples.js [--address host:port] [--n N] [--top N] [--max-new-tokens N] PROMPT
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');

function parseArgs(argv) {
  const args = { address: '127.0.0.1:50051', n: 2, top: 3, maxNewTokens: 8, prompt: [] };
  for (let i = 0; i < argv.length; i += 1) {
    const flag = argv[i];
    if (flag === '--address') args.address = argv[++i];
    else if (flag === '--n') args.n = Number(argv[++i]);
    else if (flag === '--top') args.top = Number(argv[++i]);
    else if (flag === '--max-new-tokens') args.maxNewTokens = Number(argv[++i]);
    else args.prompt.push(flag);
  }
  args.prompt = args.prompt.join(' ');
  return args;
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const definition = protoLoader.loadSync('ladder/v1/ladder.proto', {
    includeDirs: [PROTO_ROOT], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
  });
  const ladder = grpc.loadPackageDefinition(definition).ladder.v1;
  const client = new ladder.Ladder(args.address, grpc.credentials.createInsecure());
  const request = {
    prompt: { text: args.prompt },
    sampling: { temperature: 0.8, min_p: 0.05, presence_penalty: 0.5, frequency_penalty: 0.3, seed: 42 },
    stopping: { max_new_tokens: args.maxNewTokens, ignore_eos: true },
    n: args.n,
    logprobs: { top: args.top },
  };
  const call = client.GenerateStream(request, { deadline: new Date(Date.now() + 60_000) });
  call.on('data', (event) => {
    if (event.event !== 'token') return;
    const t = event.token;
    const top = t.top_logprobs.map((a) => [a.id, a.text, a.logprob]);
    console.log(JSON.stringify({ sample: t.sample, id: t.id, text: t.text, logprob: t.logprob, top }));
  });
  call.on('error', (error) => {
    console.error(`GenerateStream failed: ${grpc.status[error.code]}: ${error.details}`);
    process.exitCode = 1;
  });
  call.on('end', () => client.close());
}

main();
