// ladder-java: Ladder's API from Java, through the classes protoc and grpc-java's plugin generate from
// proto/ladder/v1/ladder.proto (package com.ladder.v1; clients/java/build.sh, or `mvn package`).
//
//   ladder-java [--address host:port] [--max-new-tokens N] [--ignore-eos] [--tokens]
//               [--stream | --session] [--token BEARER] [--tls-ca FILE] [--timeout SECONDS] PROMPT
//
// Default: one Generate call. --stream: GenerateStream, printing each token's text as it arrives.
// --session: a stateful session: Prefill the prompt, Decode max-new-tokens in two calls (the first
// half, then the rest: under greedy sampling Decode(n) then Decode(m) equals Decode(n + m)), then
// CloseSession. --tokens sends PROMPT as space-separated token ids. --tls-ca turns TLS on (the
// server's CA certificate); --token sends "authorization: Bearer <token>" on every call.
//
// The completion's text goes to stdout, a one-line JSON summary to stderr:
// {"token_ids":[...],"finish_reason":"FINISH_REASON_LENGTH","completion_tokens":N,...}.
// A failed call prints "<RPC> failed: <CODE>: <message>" and then a JSON line of the status's
// details (the ErrorInfo reason, the BadRequest field violations, the RetryInfo delay) on stderr
// and exits 1; bad arguments exit 2.
package com.ladder.example;

import com.google.protobuf.Any;
import com.google.protobuf.ByteString;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.UnknownFieldSet;
import com.google.rpc.BadRequest;
import com.google.rpc.RetryInfo;
import com.ladder.v1.CloseSessionRequest;
import com.ladder.v1.CloseSessionResponse;
import com.ladder.v1.Completion;
import com.ladder.v1.DecodeRequest;
import com.ladder.v1.FinishReason;
import com.ladder.v1.GenerateRequest;
import com.ladder.v1.LadderGrpc;
import com.ladder.v1.PrefillDone;
import com.ladder.v1.PrefillEvent;
import com.ladder.v1.PrefillRequest;
import com.ladder.v1.Prompt;
import com.ladder.v1.StoppingOptions;
import com.ladder.v1.Token;
import com.ladder.v1.TokenEvent;
import com.ladder.v1.TokenIds;
import io.grpc.CallCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.GrpcSslContexts;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.protobuf.StatusProto;
import io.grpc.stub.StreamObserver;
import java.io.File;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;

public final class LadderExample {
  private static final PrintStream OUT = new PrintStream(System.out, true, StandardCharsets.UTF_8);
  private static final PrintStream ERR = new PrintStream(System.err, true, StandardCharsets.UTF_8);
  private static final String USAGE =
      "usage: ladder-java [--address host:port] [--max-new-tokens N] [--ignore-eos] [--tokens]\n"
          + "                   [--stream | --session] [--token BEARER] [--tls-ca FILE] [--timeout SECONDS] PROMPT";

  /** Bad arguments: exit 2. */
  static final class UsageError extends Exception {
    UsageError(String message) {
      super(message);
    }
  }

  /** A failed RPC: its name and the status exception. */
  static final class CallFailed extends Exception {
    final String rpc;
    final StatusRuntimeException status;

    CallFailed(String rpc, StatusRuntimeException status) {
      super(rpc + " failed", status);
      this.rpc = rpc;
      this.status = status;
    }
  }

  private String address = "127.0.0.1:50051";
  private int maxNewTokens = 32;
  private boolean ignoreEos;
  private boolean tokens;
  private boolean stream;
  private boolean session;
  private String bearer = "";
  private String tlsCa = "";
  private double timeoutS = 60;
  private String prompt;

  // The summary's fields (the JSON line the tests compare with the Python client's answer).
  private final List<Integer> tokenIds = new ArrayList<>();
  private String finishReason = "";
  private int completionTokens;
  private final List<String> extra = new ArrayList<>();

  public static void main(String[] args) {
    System.exit(new LadderExample().run(args));
  }

  int run(String[] args) {
    try {
      parse(args);
    } catch (UsageError e) {
      ERR.println(e.getMessage());
      ERR.println(USAGE);
      return 2;
    }
    ManagedChannel channel;
    try {
      channel = channel();
    } catch (Exception e) {
      ERR.println("cannot connect: " + e);
      return 2;
    }
    try {
      LadderGrpc.LadderBlockingStub blocking = LadderGrpc.newBlockingStub(channel);
      LadderGrpc.LadderStub async = LadderGrpc.newStub(channel);
      if (!bearer.isEmpty()) {
        CallCredentials credentials = new Bearer(bearer);
        blocking = blocking.withCallCredentials(credentials);
        async = async.withCallCredentials(credentials);
      }
      long deadlineMs = (long) (timeoutS * 1000);
      blocking = blocking.withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS);
      async = async.withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS);
      StoppingOptions stopping =
          StoppingOptions.newBuilder().setMaxNewTokens(maxNewTokens).setIgnoreEos(ignoreEos).build();
      GenerateRequest request =
          GenerateRequest.newBuilder().setPrompt(prompt()).setStopping(stopping).build();
      if (session) {
        session(blocking, async, stopping);
      } else if (stream) {
        generateStream(blocking, request);
      } else {
        generate(blocking, request);
      }
      ERR.println(summary());
      return 0;
    } catch (CallFailed failed) {
      report(failed);
      return 1;
    } catch (UsageError e) {
      ERR.println(e.getMessage());
      return 2;
    } finally {
      channel.shutdownNow();
    }
  }

  private void parse(String[] args) throws UsageError {
    List<String> positional = new ArrayList<>();
    for (int i = 0; i < args.length; i++) {
      String arg = args[i];
      switch (arg) {
        case "--ignore-eos" -> ignoreEos = true;
        case "--tokens" -> tokens = true;
        case "--stream" -> stream = true;
        case "--session" -> session = true;
        case "--address", "--max-new-tokens", "--token", "--tls-ca", "--timeout" -> {
          if (i + 1 >= args.length) {
            throw new UsageError(arg + " wants a value");
          }
          String value = args[++i];
          switch (arg) {
            case "--address" -> address = value;
            case "--token" -> bearer = value;
            case "--tls-ca" -> tlsCa = value;
            case "--max-new-tokens" -> maxNewTokens = (int) number(arg, value);
            default -> timeoutS = number(arg, value);
          }
        }
        default -> {
          if (arg.startsWith("--")) {
            throw new UsageError("unknown flag " + arg);
          }
          positional.add(arg);
        }
      }
    }
    if (positional.size() != 1 || (stream && session)) {
      throw new UsageError("one PROMPT, and at most one of --stream, --session");
    }
    prompt = positional.get(0);
  }

  private static double number(String flag, String text) throws UsageError {
    try {
      double value = Double.parseDouble(text);
      if (value >= 0) {
        return value;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    throw new UsageError(flag + " wants a number >= 0, got '" + text + "'");
  }

  private Prompt prompt() throws UsageError {
    if (!tokens) {
      return Prompt.newBuilder().setText(prompt).build();
    }
    TokenIds.Builder ids = TokenIds.newBuilder();
    for (String field : prompt.trim().split("\\s+")) {
      try {
        ids.addIds(Integer.parseInt(field));
      } catch (NumberFormatException e) {
        throw new UsageError("--tokens wants space-separated token ids, got '" + field + "'");
      }
    }
    return Prompt.newBuilder().setTokens(ids).build();
  }

  private ManagedChannel channel() throws Exception {
    NettyChannelBuilder builder = NettyChannelBuilder.forTarget(address);
    if (tlsCa.isEmpty()) {
      builder.usePlaintext();
    } else {
      builder.sslContext(GrpcSslContexts.forClient().trustManager(new File(tlsCa)).build());
    }
    return builder.build();
  }

  /** Sends "authorization: Bearer <token>" on every call. */
  static final class Bearer extends CallCredentials {
    private static final Metadata.Key<String> AUTHORIZATION =
        Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
    private final String token;

    Bearer(String token) {
      this.token = token;
    }

    @Override
    public void applyRequestMetadata(RequestInfo info, Executor executor, MetadataApplier applier) {
      Metadata headers = new Metadata();
      headers.put(AUTHORIZATION, "Bearer " + token);
      applier.apply(headers);
    }

    @Override
    public void thisUsesUnstableApi() {}
  }

  private void generate(LadderGrpc.LadderBlockingStub stub, GenerateRequest request) throws CallFailed {
    Completion completion;
    try {
      completion = stub.generate(request);
    } catch (StatusRuntimeException e) {
      throw new CallFailed("Generate", e);
    }
    OUT.println(completion.getText());
    add(completion);
  }

  private void generateStream(LadderGrpc.LadderBlockingStub stub, GenerateRequest request)
      throws CallFailed {
    add(readTokens("GenerateStream", () -> stub.generateStream(request)));
    OUT.println();
  }

  interface Call {
    Iterator<TokenEvent> start();
  }

  /**
   * Reads a token stream (GenerateStream or Decode) to its final Completion, printing each token's
   * text as it arrives. A blocking stream's error shows at the iterator's first hasNext(), not at
   * the call.
   */
  private static Completion readTokens(String rpc, Call call) throws CallFailed {
    try {
      Iterator<TokenEvent> events = call.start();
      while (events.hasNext()) {
        TokenEvent event = events.next();
        switch (event.getEventCase()) {
          case TOKEN -> OUT.print(event.getToken().getText());
          case TOKENS -> {
            for (Token token : event.getTokens().getTokensList()) {
              OUT.print(token.getText());
            }
          }
          case DONE -> {
            return event.getDone();
          }
          default -> {}
        }
      }
    } catch (StatusRuntimeException e) {
      throw new CallFailed(rpc, e);
    }
    throw new CallFailed(rpc, io.grpc.Status.INTERNAL
        .withDescription("the stream ended without a Completion").asRuntimeException());
  }

  /** Prefill (a bidirectional stream: only the async stub has it), two Decodes, CloseSession. */
  private void session(LadderGrpc.LadderBlockingStub blocking, LadderGrpc.LadderStub async,
      StoppingOptions stopping) throws CallFailed, UsageError {
    CompletableFuture<PrefillDone> done = new CompletableFuture<>();
    StreamObserver<PrefillRequest> requests = async.prefill(new StreamObserver<PrefillEvent>() {
      @Override
      public void onNext(PrefillEvent event) {
        if (event.hasDone()) { // ForwardEvents (one per forward) come first
          done.complete(event.getDone());
        }
      }

      @Override
      public void onError(Throwable error) {
        done.completeExceptionally(error);
      }

      @Override
      public void onCompleted() {
        done.completeExceptionally(io.grpc.Status.INTERNAL
            .withDescription("Prefill ended without PrefillDone").asRuntimeException());
      }
    });
    // One message that is also the last: the server answers PrefillDone without waiting for the
    // client's half-close. A longer prompt may be sent in parts, one onNext each.
    requests.onNext(PrefillRequest.newBuilder().setPrompt(prompt()).setLast(true).build());
    PrefillDone prefilled;
    try {
      prefilled = done.get();
    } catch (ExecutionException e) {
      throw new CallFailed("Prefill", e.getCause() instanceof StatusRuntimeException s ? s
          : io.grpc.Status.fromThrowable(e.getCause()).asRuntimeException());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new CallFailed("Prefill", io.grpc.Status.CANCELLED.asRuntimeException());
    }
    requests.onCompleted();
    String id = prefilled.getSessionId();
    extra.add("\"session_id\":" + quote(id));
    extra.add("\"prefill_next_token\":" + prefilled.getNextToken());
    int first = stopping.getMaxNewTokens() / 2;
    int decodes = 0;
    int length = 0;
    try {
      for (int n : new int[] {first, stopping.getMaxNewTokens() - first}) {
        if (n == 0) {
          continue;
        }
        DecodeRequest request = DecodeRequest.newBuilder().setSessionId(id)
            .setStopping(stopping.toBuilder().setMaxNewTokens(n)).build();
        Completion completion = readTokens("Decode", () -> blocking.decode(request));
        add(completion);
        length = completion.getSessionLength();
        decodes++;
        if (completion.getFinishReason() != FinishReason.FINISH_REASON_LENGTH) {
          break; // end of sequence or a full session: no more to decode
        }
      }
    } finally {
      try {
        CloseSessionResponse closed =
            blocking.closeSession(CloseSessionRequest.newBuilder().setSessionId(id).build());
        extra.add("\"closed_length\":" + closed.getLength());
      } catch (StatusRuntimeException e) {
        ERR.println("CloseSession failed: " + e.getStatus().getCode().name());
      }
    }
    OUT.println();
    extra.add("\"session_length\":" + length);
    extra.add("\"decode_calls\":" + decodes);
  }

  private void add(Completion completion) {
    tokenIds.addAll(completion.getTokenIdsList());
    finishReason = completion.getFinishReason().name();
    completionTokens += completion.getUsage().getCompletionTokens();
  }

  private String summary() {
    StringBuilder json = new StringBuilder("{\"token_ids\":[");
    for (int i = 0; i < tokenIds.size(); i++) {
      json.append(i > 0 ? "," : "").append(tokenIds.get(i));
    }
    json.append("],\"finish_reason\":").append(quote(finishReason));
    json.append(",\"completion_tokens\":").append(completionTokens);
    for (String field : extra) {
      json.append(',').append(field);
    }
    return json.append('}').toString();
  }

  /** Prints a failed call's status and the details in its grpc-status-details-bin trailer. */
  private static void report(CallFailed failed) {
    io.grpc.Status status = failed.status.getStatus();
    String code = status.getCode().name();
    ERR.println(failed.rpc + " failed: " + code + ": " + status.getDescription());
    StringBuilder json = new StringBuilder("{\"code\":").append(quote(code));
    com.google.rpc.Status rich = StatusProto.fromThrowable(failed.status);
    if (rich != null) {
      for (Any detail : rich.getDetailsList()) {
        try {
          if (detail.getTypeUrl().endsWith("/google.rpc.ErrorInfo")) {
            errorInfo(detail.getValue(), json);
          } else if (detail.is(BadRequest.class)) {
            json.append(",\"field_violations\":[");
            List<BadRequest.FieldViolation> violations = detail.unpack(BadRequest.class).getFieldViolationsList();
            for (int i = 0; i < violations.size(); i++) {
              json.append(i > 0 ? "," : "").append("{\"field\":").append(quote(violations.get(i).getField()))
                  .append(",\"description\":").append(quote(violations.get(i).getDescription())).append('}');
            }
            json.append(']');
          } else if (detail.is(RetryInfo.class)) {
            com.google.protobuf.Duration delay = detail.unpack(RetryInfo.class).getRetryDelay();
            json.append(",\"retry_delay_s\":").append(delay.getSeconds() + delay.getNanos() / 1e9);
          }
        } catch (InvalidProtocolBufferException e) {
          ERR.println("unreadable detail " + detail.getTypeUrl() + ": " + e.getMessage());
        }
      }
    }
    ERR.println(json.append('}'));
  }

  /**
   * google.rpc.ErrorInfo's fields by number (1 reason, 2 domain, 3 metadata). With a
   * proto-google-common-protos jar that has com.google.rpc.ErrorInfo (2.x; Maven's), write
   * {@code detail.unpack(ErrorInfo.class).getReason()}; Debian 12's 1.16 jar lacks the class.
   */
  private static void errorInfo(ByteString value, StringBuilder json) throws InvalidProtocolBufferException {
    UnknownFieldSet fields = UnknownFieldSet.parseFrom(value);
    json.append(",\"domain\":").append(quote(text(fields, 2)));
    json.append(",\"reason\":").append(quote(text(fields, 1)));
    if (fields.hasField(3)) {
      json.append(",\"metadata\":{");
      List<ByteString> entries = fields.getField(3).getLengthDelimitedList();
      for (int i = 0; i < entries.size(); i++) {
        UnknownFieldSet entry = UnknownFieldSet.parseFrom(entries.get(i));
        json.append(i > 0 ? "," : "").append(quote(text(entry, 1))).append(':').append(quote(text(entry, 2)));
      }
      json.append('}');
    }
  }

  private static String text(UnknownFieldSet fields, int number) {
    if (!fields.hasField(number) || fields.getField(number).getLengthDelimitedList().isEmpty()) {
      return "";
    }
    return fields.getField(number).getLengthDelimitedList().get(0).toStringUtf8();
  }

  private static String quote(String text) {
    StringBuilder out = new StringBuilder("\"");
    for (char c : text.toCharArray()) {
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    return out.append('"').toString();
  }
}
