// ladder-cpp: Ladder's Generate and GenerateStream from C++, through stubs that protoc and
// grpc_cpp_plugin generate from proto/ladder/v1/ladder.proto at build time (see Makefile, build.sh).
//
//   ladder-cpp [--address host:port] [--max-new-tokens N] [--ignore-eos] [--tokens] [--stream]
//              [--token BEARER] [--timeout SECONDS]
//              [--json-schema JSON | --regex RE | --choice A,B,... | --grammar GBNF] PROMPT
//
// --tokens sends PROMPT as space-separated token ids (for models without a tokenizer); --stream
// calls GenerateStream and prints each token's text as it arrives. The last four flags ask for
// structured output (the request's Constraint; docs/api.md). The completion's text goes to
// stdout, a one-line JSON summary to stderr. A failed call prints "<RPC> failed: <CODE>: <message>"
// on stderr and exits 1; bad arguments exit 2.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ladder/v1/ladder.grpc.pb.h"

namespace {

struct Args {
  std::string address = "127.0.0.1:50051";
  uint32_t max_new_tokens = 32;
  bool ignore_eos = false;
  bool tokens = false;
  bool stream = false;
  std::string bearer;
  double timeout_s = 60;
  std::string prompt;
  std::string constraint_kind;  // json_schema, regex, choice or grammar; empty: free text
  std::string constraint;
};

constexpr const char* kUsage =
    "usage: ladder-cpp [--address host:port] [--max-new-tokens N] [--ignore-eos] [--tokens] [--stream]\n"
    "                  [--token BEARER] [--timeout SECONDS]\n"
    "                  [--json-schema JSON | --regex RE | --choice A,B,... | --grammar GBNF] PROMPT\n";

// grpc::StatusCode has no name table; these are the canonical names (google.rpc.Code).
const char* CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
      "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int index = static_cast<int>(code);
  return index >= 0 && index <= 16 ? kNames[index] : "UNKNOWN";
}

// The whole of `text` as a number at least `least`; std::invalid_argument naming the flag otherwise.
double NumberOf(const std::string& flag, const std::string& text, double least) {
  try {
    size_t used = 0;
    const double number = std::stod(text, &used);
    if (used == text.size() && number >= least) return number;
  } catch (const std::logic_error&) {
  }
  throw std::invalid_argument(flag + " wants a number >= " + std::to_string(static_cast<int>(least)) +
                              ", got '" + text + "'");
}

// Throws std::invalid_argument on a flag without its value or a value that is not a number.
Args ParseArgs(int argc, char** argv) {
  Args args;
  std::vector<std::string> words;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--address") args.address = value();
    else if (flag == "--max-new-tokens") args.max_new_tokens = static_cast<uint32_t>(NumberOf(flag, value(), 0));
    else if (flag == "--ignore-eos") args.ignore_eos = true;
    else if (flag == "--tokens") args.tokens = true;
    else if (flag == "--stream") args.stream = true;
    else if (flag == "--token") args.bearer = value();
    else if (flag == "--timeout") args.timeout_s = NumberOf(flag, value(), 0);
    else if (flag == "--json-schema" || flag == "--regex" || flag == "--choice" || flag == "--grammar") {
      args.constraint_kind = flag == "--json-schema" ? "json_schema" : flag.substr(2);
      args.constraint = value();
    }
    else if (flag == "--help" || flag == "-h") throw std::invalid_argument("help");
    else words.push_back(flag);
  }
  if (words.empty()) throw std::invalid_argument("a PROMPT is required");
  for (const auto& word : words) args.prompt += (args.prompt.empty() ? "" : " ") + word;
  return args;
}

// Throws std::invalid_argument when a token id is not an integer.
void SetPrompt(const Args& args, ladder::v1::Prompt* prompt) {
  if (!args.tokens) {
    prompt->set_text(args.prompt);
    return;
  }
  std::istringstream ids(args.prompt);
  std::string id;
  while (ids >> id) prompt->mutable_tokens()->add_ids(static_cast<int32_t>(std::stol(id)));
}

void SetConstraint(const Args& args, ladder::v1::Constraint* constraint) {
  if (args.constraint_kind == "json_schema") constraint->set_json_schema(args.constraint);
  else if (args.constraint_kind == "regex") constraint->set_regex(args.constraint);
  else if (args.constraint_kind == "grammar") constraint->set_grammar(args.constraint);
  else {  // choice: the comma-separated options
    std::istringstream options(args.constraint);
    std::string option;
    while (std::getline(options, option, ',')) constraint->mutable_choice()->add_options(option);
  }
}

ladder::v1::GenerateRequest RequestOf(const Args& args) {
  ladder::v1::GenerateRequest request;
  SetPrompt(args, request.mutable_prompt());
  request.mutable_sampling()->set_temperature(0);  // greedy: the same tokens as any other client
  request.mutable_stopping()->set_max_new_tokens(args.max_new_tokens);
  request.mutable_stopping()->set_ignore_eos(args.ignore_eos);
  if (!args.constraint_kind.empty()) SetConstraint(args, request.mutable_constraint());
  return request;
}

void PrepareContext(const Args& args, grpc::ClientContext* context) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
  context->set_deadline(std::chrono::system_clock::now() + timeout);
  if (!args.bearer.empty()) context->AddMetadata("authorization", "Bearer " + args.bearer);
}

// {"token_ids":[...],"finish_reason":"FINISH_REASON_LENGTH","prompt_tokens":N,...}: what tests compare.
std::string Summary(const ladder::v1::Completion& completion) {
  std::ostringstream json;
  json << "{\"token_ids\":[";
  for (int i = 0; i < completion.token_ids_size(); ++i) json << (i ? "," : "") << completion.token_ids(i);
  json << "],\"finish_reason\":\"" << ladder::v1::FinishReason_Name(completion.finish_reason()) << "\""
       << ",\"prompt_tokens\":" << completion.usage().prompt_tokens()
       << ",\"completion_tokens\":" << completion.usage().completion_tokens()
       << ",\"ttft_ms\":" << completion.timing().ttft_ms()
       << ",\"request_id\":\"" << completion.request_id() << "\"}";
  return json.str();
}

int Failed(const char* rpc, const grpc::Status& status) {
  std::cerr << rpc << " failed: " << CodeName(status.error_code()) << ": " << status.error_message() << "\n";
  return 1;
}

int Generate(ladder::v1::Ladder::Stub& stub, const Args& args) {
  grpc::ClientContext context;
  PrepareContext(args, &context);
  ladder::v1::Completion completion;
  const grpc::Status status = stub.Generate(&context, RequestOf(args), &completion);
  if (!status.ok()) return Failed("Generate", status);
  std::cout << completion.text() << "\n";
  std::cerr << Summary(completion) << "\n";
  return 0;
}

int GenerateStream(ladder::v1::Ladder::Stub& stub, const Args& args) {
  grpc::ClientContext context;
  PrepareContext(args, &context);
  auto reader = stub.GenerateStream(&context, RequestOf(args));
  ladder::v1::TokenEvent event;
  ladder::v1::Completion done;
  while (reader->Read(&event)) {
    if (event.has_token()) std::cout << event.token().text() << std::flush;
    if (event.has_done()) done = event.done();
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return Failed("GenerateStream", status);
  std::cout << "\n";
  std::cerr << Summary(done) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  ladder::v1::GenerateRequest probe;
  try {
    args = ParseArgs(argc, argv);
    SetPrompt(args, probe.mutable_prompt());
  } catch (const std::exception& error) {
    if (std::string(error.what()) != "help") std::cerr << "ladder-cpp: " << error.what() << "\n";
    std::cerr << kUsage;
    return 2;
  }
  auto channel = grpc::CreateChannel(args.address, grpc::InsecureChannelCredentials());
  auto stub = ladder::v1::Ladder::NewStub(channel);
  return args.stream ? GenerateStream(*stub, args) : Generate(*stub, args);
}
