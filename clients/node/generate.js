#!/usr/bin/env node
// Calls Ladder's Generate RPC with @grpc/grpc-js, loading proto/ladder/v1/ladder.proto at run time
// (no generated code). Prints the completion's text on stdout and a JSON summary on stderr.
//
//   node generate.js [--address host:port] [--max-new-tokens N] [--ignore-eos] [--tokens] [--token BEARER]
//                    [--timeout SECONDS] [--json-schema FILE|JSON | --regex RE | --choice A,B | --grammar FILE|GBNF]
//                    PROMPT
//
// --tokens sends PROMPT as space-separated token ids (for models without a tokenizer). The last four
// ask for structured output: the text is JSON valid against the schema, matches the regex, is one
// of the comma-separated options, or matches the GBNF grammar (docs/api.md, "Structured output").
'use strict';

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');
const PROTO_FILE = 'ladder/v1/ladder.proto';

function parseArgs(argv) {
  const args = {
    address: '127.0.0.1:50051', maxNewTokens: 32, ignoreEos: false, tokens: false, token: '', timeoutS: 60, prompt: [],
    constraint: null,
  };
  for (let i = 0; i < argv.length; i += 1) {
    const flag = argv[i];
    if (flag === '--address') args.address = argv[++i];
    else if (flag === '--max-new-tokens') args.maxNewTokens = Number(argv[++i]);
    else if (flag === '--ignore-eos') args.ignoreEos = true;
    else if (flag === '--tokens') args.tokens = true;
    else if (flag === '--token') args.token = argv[++i];
    else if (flag === '--timeout') args.timeoutS = Number(argv[++i]);
    else if (flag === '--json-schema') args.constraint = { json_schema: fileOrText(argv[++i]) };
    else if (flag === '--regex') args.constraint = { regex: argv[++i] };
    else if (flag === '--choice') args.constraint = { choice: { options: argv[++i].split(',') } };
    else if (flag === '--grammar') args.constraint = { grammar: fileOrText(argv[++i]) };
    else args.prompt.push(flag);
  }
  if (args.prompt.length === 0) throw new Error('usage: node generate.js [--address A] [--tokens] PROMPT');
  args.prompt = args.prompt.join(' ');
  return args;
}

// A file's text when VALUE names a file, else VALUE itself (a schema or a grammar written inline).
function fileOrText(value) {
  try {
    if (fs.statSync(value).isFile()) return fs.readFileSync(value, 'utf8');
  } catch (error) {
    // not a file: the text itself
  }
  return value;
}

function loadLadder() {
  // keepCase: field names as written in the .proto (max_new_tokens), the same as grpcurl's JSON.
  const definition = protoLoader.loadSync(PROTO_FILE, {
    includeDirs: [PROTO_ROOT], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).ladder.v1;
}

function promptOf(args) {
  if (!args.tokens) return { text: args.prompt };
  return { tokens: { ids: args.prompt.trim().split(/\s+/).map(Number) } };
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const ladder = loadLadder();
  const client = new ladder.Ladder(args.address, grpc.credentials.createInsecure());
  const metadata = new grpc.Metadata();
  if (args.token) metadata.set('authorization', `Bearer ${args.token}`);
  const request = {
    prompt: promptOf(args),
    sampling: { temperature: 0 },
    stopping: { max_new_tokens: args.maxNewTokens, ignore_eos: args.ignoreEos },
  };
  if (args.constraint) request.constraint = args.constraint;
  const deadline = new Date(Date.now() + args.timeoutS * 1000);
  client.Generate(request, metadata, { deadline }, (error, completion) => {
    client.close();
    if (error) {
      console.error(`Generate failed: ${grpc.status[error.code]}: ${error.details}`);
      process.exitCode = 1;
      return;
    }
    process.stdout.write(`${completion.text}\n`);
    const summary = {
      token_ids: completion.token_ids,
      finish_reason: completion.finish_reason,
      usage: completion.usage,
      ttft_ms: completion.timing.ttft_ms,
    };
    console.error(JSON.stringify(summary));
  });
}

main();
