// ladder-go: Ladder's API from Go, through the stubs generated from proto/ladder/v1/ladder.proto
// (package github.com/ladder-serve/ladder/clients/go/ladder/v1; clients/go/build.sh --generate).
//
//	ladder-go [--address host:port] [--max-new-tokens N] [--ignore-eos] [--tokens]
//	          [--stream | --session] [--token BEARER] [--tls-ca FILE] [--timeout SECONDS] PROMPT
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
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	ladderv1 "github.com/ladder-serve/ladder/clients/go/ladder/v1"
)

// codeNames are the canonical status names (google.rpc.Code); codes.Code's String is CamelCase.
var codeNames = []string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
	"OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

func codeName(code codes.Code) string {
	if int(code) < len(codeNames) {
		return codeNames[code]
	}
	return "UNKNOWN"
}

// summary is the JSON line the tests compare with the Python client's answer.
type summary struct {
	TokenIDs         []int32 `json:"token_ids"`
	FinishReason     string  `json:"finish_reason"`
	CompletionTokens uint32  `json:"completion_tokens"`
	SessionID        string  `json:"session_id,omitempty"`
	SessionLength    uint32  `json:"session_length,omitempty"`
	PrefillNextToken *int32  `json:"prefill_next_token,omitempty"`
	DecodeCalls      int     `json:"decode_calls,omitempty"`
	ClosedLength     *uint32 `json:"closed_length,omitempty"`
}

// errorDetails is the JSON line a failed call prints: what a client branches on.
type errorDetails struct {
	Code            string            `json:"code"`
	Domain          string            `json:"domain,omitempty"`
	Reason          string            `json:"reason,omitempty"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	FieldViolations []fieldViolation  `json:"field_violations,omitempty"`
	RetryDelayS     *float64          `json:"retry_delay_s,omitempty"`
}

type fieldViolation struct {
	Field       string `json:"field"`
	Description string `json:"description"`
}

// callFailed is a failed RPC: its name and its gRPC status error.
type callFailed struct {
	rpc string
	err error
}

func (f *callFailed) Error() string { return f.rpc + " failed: " + f.err.Error() }

// report prints a failed call's status and the details in its grpc-status-details-bin trailer.
func report(failed *callFailed) {
	st := status.Convert(failed.err)
	fmt.Fprintf(os.Stderr, "%s failed: %s: %s\n", failed.rpc, codeName(st.Code()), st.Message())
	out := errorDetails{Code: codeName(st.Code())}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			out.Domain, out.Reason, out.Metadata = d.GetDomain(), d.GetReason(), d.GetMetadata()
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				out.FieldViolations = append(out.FieldViolations, fieldViolation{v.GetField(), v.GetDescription()})
			}
		case *errdetails.RetryInfo:
			delay := d.GetRetryDelay()
			seconds := float64(delay.GetSeconds()) + float64(delay.GetNanos())/1e9
			out.RetryDelayS = &seconds
		}
	}
	printJSON(out)
}

// printJSON writes one JSON line on stderr, "<" and ">" as they are (json.Marshal escapes them).
func printJSON(value interface{}) {
	encoder := json.NewEncoder(os.Stderr)
	encoder.SetEscapeHTML(false)
	_ = encoder.Encode(value)
}

func prompt(text string, tokens bool) (*ladderv1.Prompt, error) {
	if !tokens {
		return &ladderv1.Prompt{Input: &ladderv1.Prompt_Text{Text: text}}, nil
	}
	var ids []int32
	for _, field := range strings.Fields(text) {
		id, err := strconv.ParseInt(field, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--tokens wants space-separated token ids, got %q", field)
		}
		ids = append(ids, int32(id))
	}
	return &ladderv1.Prompt{Input: &ladderv1.Prompt_Tokens{Tokens: &ladderv1.TokenIds{Ids: ids}}}, nil
}

func generate(ctx context.Context, client ladderv1.LadderClient, request *ladderv1.GenerateRequest) (*summary, error) {
	completion, err := client.Generate(ctx, request)
	if err != nil {
		return nil, &callFailed{"Generate", err}
	}
	fmt.Println(completion.GetText())
	return completionSummary(completion), nil
}

func completionSummary(c *ladderv1.Completion) *summary {
	return &summary{TokenIDs: append([]int32{}, c.GetTokenIds()...), FinishReason: c.GetFinishReason().String(),
		CompletionTokens: c.GetUsage().GetCompletionTokens()}
}

// readTokens reads a token stream (GenerateStream or Decode) to its final Completion, printing each
// token's text as it arrives. A streaming call's error shows at the first Recv, not at the call.
func readTokens(rpc string, stream interface {
	Recv() (*ladderv1.TokenEvent, error)
}) (*ladderv1.Completion, error) {
	for {
		event, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, &callFailed{rpc, status.Error(codes.Internal, "the stream ended without a Completion")}
			}
			return nil, &callFailed{rpc, err}
		}
		switch e := event.GetEvent().(type) {
		case *ladderv1.TokenEvent_Token:
			fmt.Print(e.Token.GetText())
		case *ladderv1.TokenEvent_Tokens:
			for _, token := range e.Tokens.GetTokens() {
				fmt.Print(token.GetText())
			}
		case *ladderv1.TokenEvent_Done:
			return e.Done, nil
		}
	}
}

func generateStream(ctx context.Context, client ladderv1.LadderClient, request *ladderv1.GenerateRequest) (*summary, error) {
	stream, err := client.GenerateStream(ctx, request)
	if err != nil {
		return nil, &callFailed{"GenerateStream", err}
	}
	done, err := readTokens("GenerateStream", stream)
	if err != nil {
		return nil, err
	}
	fmt.Println()
	return completionSummary(done), nil
}

// session prefills the prompt into a new session, decodes in two calls and closes the session.
func session(ctx context.Context, client ladderv1.LadderClient, p *ladderv1.Prompt, stopping *ladderv1.StoppingOptions) (*summary, error) {
	prefill, err := client.Prefill(ctx)
	if err != nil {
		return nil, &callFailed{"Prefill", err}
	}
	// One message that is also the last: the server answers PrefillDone without waiting for the
	// client's half-close. A longer prompt may be sent in parts, one Send each.
	if err := prefill.Send(&ladderv1.PrefillRequest{Prompt: p, Last: true}); err != nil && !errors.Is(err, io.EOF) {
		return nil, &callFailed{"Prefill", err}
	}
	var done *ladderv1.PrefillDone
	for done == nil {
		event, err := prefill.Recv()
		if err != nil { // io.EOF here: the server ended the stream before PrefillDone
			return nil, &callFailed{"Prefill", err}
		}
		done = event.GetDone() // ForwardEvents (one per forward) come first
	}
	if err := prefill.CloseSend(); err != nil {
		return nil, &callFailed{"Prefill", err}
	}
	id := done.GetSessionId()
	next := done.GetNextToken()
	out := &summary{TokenIDs: []int32{}, SessionID: id, PrefillNextToken: &next}
	closeSession := func() {
		closed, err := client.CloseSession(ctx, &ladderv1.CloseSessionRequest{SessionId: id})
		if err == nil {
			length := closed.GetLength()
			out.ClosedLength = &length
		}
	}
	first := stopping.GetMaxNewTokens() / 2
	for _, n := range []uint32{first, stopping.GetMaxNewTokens() - first} {
		if n == 0 {
			continue
		}
		request := &ladderv1.DecodeRequest{SessionId: id, Stopping: &ladderv1.StoppingOptions{
			MaxNewTokens: n, IgnoreEos: stopping.GetIgnoreEos()}}
		stream, err := client.Decode(ctx, request)
		if err == nil {
			var completion *ladderv1.Completion
			completion, err = readTokens("Decode", stream)
			if err == nil {
				out.TokenIDs = append(out.TokenIDs, completion.GetTokenIds()...)
				out.FinishReason = completion.GetFinishReason().String()
				out.CompletionTokens += completion.GetUsage().GetCompletionTokens()
				out.SessionLength = completion.GetSessionLength()
				out.DecodeCalls++
				if completion.GetFinishReason() != ladderv1.FinishReason_FINISH_REASON_LENGTH {
					break // end of sequence or a full session: no more to decode
				}
				continue
			}
		} else {
			err = &callFailed{"Decode", err}
		}
		closeSession()
		return nil, err
	}
	fmt.Println()
	closeSession()
	return out, nil
}

// bearer sends "authorization: Bearer <token>" on every call (grpc.PerRPCCredentials).
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

func run() int {
	flags := flag.NewFlagSet("ladder-go", flag.ContinueOnError)
	address := flags.String("address", "127.0.0.1:50051", "the server's host:port")
	maxNewTokens := flags.Uint("max-new-tokens", 32, "most tokens to generate")
	ignoreEOS := flags.Bool("ignore-eos", false, "keep generating past end-of-sequence tokens")
	tokens := flags.Bool("tokens", false, "PROMPT is space-separated token ids")
	streamFlag := flags.Bool("stream", false, "call GenerateStream")
	sessionFlag := flags.Bool("session", false, "Prefill, Decode twice, CloseSession")
	token := flags.String("token", "", "bearer token")
	tlsCA := flags.String("tls-ca", "", "connect with TLS, trusting this CA certificate (PEM)")
	timeout := flags.Float64("timeout", 60, "deadline of the whole run, in seconds")
	requestID := flags.String("request-id", "", "x-request-id metadata")
	if err := flags.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if flags.NArg() != 1 || (*streamFlag && *sessionFlag) {
		fmt.Fprintln(os.Stderr, "usage: ladder-go [flags] PROMPT (at most one of --stream, --session)")
		flags.PrintDefaults()
		return 2
	}
	p, err := prompt(flags.Arg(0), *tokens)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}

	options := []grpc.DialOption{grpc.WithInsecure()}
	if *tlsCA != "" {
		creds, err := credentials.NewClientTLSFromFile(*tlsCA, "")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		options = []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	}
	if *token != "" {
		options = append(options, grpc.WithPerRPCCredentials(bearer{*token, *tlsCA != ""}))
	}
	conn, err := grpc.Dial(*address, options...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	client := ladderv1.NewLadderClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*timeout*float64(time.Second)))
	defer cancel()
	if *requestID != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-request-id", *requestID)
	}
	stopping := &ladderv1.StoppingOptions{MaxNewTokens: uint32(*maxNewTokens), IgnoreEos: *ignoreEOS}
	request := &ladderv1.GenerateRequest{Prompt: p, Stopping: stopping}
	var result *summary
	switch {
	case *sessionFlag:
		result, err = session(ctx, client, p, stopping)
	case *streamFlag:
		result, err = generateStream(ctx, client, request)
	default:
		result, err = generate(ctx, client, request)
	}
	var failed *callFailed
	if errors.As(err, &failed) {
		report(failed)
		return 1
	}
	printJSON(result)
	return 0
}

func main() {
	os.Exit(run())
}
