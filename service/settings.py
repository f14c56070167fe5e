"""What each setting of the one Config (service/config.py) means and allows: its help line, its
choices and its bounds. Pure tables: config.py reads them when it parses, checks and documents."""

from __future__ import annotations

from service.front.tool_formats import AUTO, FORMATS

HELP = {
    "host": "address to listen on",
    "port": "gRPC port (0 = any free port)",
    "metrics_port": "Prometheus /metrics port (0 = off)",
    "http_port": "OpenAI-compatible HTTP API port (0 = off)",
    "http_max_connections": "HTTP connections open at once; past it a new one is closed as it is accepted",
    "http_max_connections_per_peer": "HTTP connections one client address may have open at once; past it "
    "its new ones are closed as they are accepted",
    "http_header_timeout_seconds": "an HTTP connection whose request headers are not complete this long "
    "after it opened (or after the request's first byte) is closed",
    "http_body_timeout_seconds": "an HTTP request whose body has not all arrived this long after its "
    "headers gets 408",
    "http_idle_timeout_seconds": "a kept-alive HTTP connection with no request this long is closed",
    "http_cors_origins": 'comma-separated origins browsers may call the HTTP API from ("*": any; '
    "empty: CORS off)",
    "frontends": "frontend processes that share the gRPC and HTTP ports and serve every call (protobuf, "
    "JSON, interceptors, tokens to text), sending the engine's work to this process's core (0 = "
    "calls served in this process; auto: 2 on CUDA, 0 on CPU)",
    "core_transport": "how the frontend side reaches the core: direct (in this process) or socket (the "
    "core's orders over a local socket, as frontend processes of their own will send them; for tests "
    "of that transport)",
    "grpc_max_connections": "gRPC connections one process serving the port holds at once; past it a new one "
    "is closed as it is accepted (auto: half the process's open-file limit, which "
    "is raised to its hard limit at start)",
    "grpc_max_concurrent_streams": "calls one gRPC connection may have open at once (HTTP/2 "
    "MAX_CONCURRENT_STREAMS; more wait in the client)",
    "grpc_handshake_timeout_seconds": "a gRPC connection that has not finished its handshake (TLS, the "
    "HTTP/2 preface) this long after it was accepted is closed",
    "grpc_idle_timeout_seconds": "a gRPC connection with no call this long is closed (GOAWAY; clients "
    "reconnect when they next call)",
    "max_calls_per_peer": "Ladder calls one client address may have open at once over gRPC (more: "
    "RESOURCE_EXHAUSTED, PEER_CALLS; health and reflection never count); 0 = no "
    "limit, as behind a proxy every call has its address",
    "model": 'model directory or "default"',
    "served_model_name": "the model's id in the OpenAI-compatible API (empty: the model directory's name; "
    "requests may also name the directory or what --model says)",
    "model_cache": "cache directory of the default model (and of rewritten copies of model graphs)",
    "model_precision": "weights of the default model: auto (int4 on CPU, fp16 on CUDA), int4, fp16 or fp32",
    "model_read_only": "never rewrite the model's graph: its lm-head then runs on every prefill row",
    "provider": "execution provider: cpu | cuda",
    "chunk_size": "prefill chunk width (0 = whole prompts; unset: the model's, else 512 up to the capacity)",
    "padding": "query-axis padding of prefill forwards (also ONNX_GENAI_PREFILL_QUERY_PADDING)",
    "auth_tokens": "comma-separated bearer tokens (name=token names the caller)",
    "memory_budget_mb": "weights + KV + variants limit: the KV slots are as many as it holds (0 = off)",
    "pod_name": "prefix of session ids (defaults to the host name)",
    "warm_up": "prepare every ladder and batch width (CUDA graphs) before health turns SERVING",
    "lookahead": "CUDA: launch the next decode forward on the chosen tokens before the host reads them "
    "(off: run-to-run identical tokens on CUDA, see architecture-cuda.md)",
    "decode_chain": "CUDA, with lookahead: a greedy decode step's tokens are chosen on the device, which "
    "launches the next forward behind them without the host (off: the host chooses first)",
    "cuda_wait": "CUDA: how the host waits for the device's work, onnxruntime's graph replays included "
    "(each waits for its forward): spin (a core busy-polls the whole wait), block (the thread "
    "sleeps until the device signals: fewer cores, 8-13 % fewer tokens; see architecture-cuda.md) "
    "or replay (sleeps through graph replays alone, spins in the short waits; CUDA 12.1+ drivers; "
    "on an H100 no more tokens than block, more cores)",
    "replay_thread": "CUDA: captured forwards run on a thread of their own, so a step's host work "
    "(its tokens handed out, the next round's bookkeeping) overlaps its forward, which onnxruntime's "
    "graph replay otherwise waits for on the worker; measured slower, see architecture-cuda.md)",
    "variant_capacity": "shapes the variant cache holds (0 = the ladder widths + the decode batch widths)",
    "max_sessions": "KV slots: sessions held at once, and the widest decode batch",
    "max_queue": "requests the engine worker holds, running or waiting for a slot (more: RESOURCE_EXHAUSTED)",
    "sessions_per_caller": "sessions one caller may hold, those it waits for too (0: no limit but the memory "
    "when idle sessions park, as by default; every KV slot but one with "
    "--session-memory-mb 0)",
    "session_memory_mb": "idle sessions park off their KV slot in up to this many MB; open sessions "
    "are then bounded by it, not by slots (auto: half the host memory free once "
    "the model is loaded, plus on CUDA --session-device-memory-mb; 0 = off: a "
    "session holds its slot)",
    "session_memory_per_caller_mb": "of --session-memory-mb, what one caller's open sessions may hold, "
    "each counted at its parked size, parked or not (more: "
    "RESOURCE_EXHAUSTED, CALLER_QUOTA; auto: half of it when tokens or "
    "client certificates tell callers apart, else no limit; 0 = no limit)",
    "session_device_memory_mb": "CUDA: parked sessions' KV kept in device memory up to this many MB, "
    "the most idle spilling to pinned host memory past it (auto: half the "
    "device memory free once the model is loaded)",
    "prefix_sharing": "a prompt starting with a prefix the server holds (in ladder steps) copies its KV",
    "prefix_across_callers": "share held prefixes between callers told apart by auth (their timing leaks)",
    "deterministic": "each request's tokens and log-probabilities depend on the request alone, not on the "
    "load or what the pool holds: decode forwards at the widest batch, prefill forwards a "
    "fresh run's own (docs/api.md, Exactness)",
    "prefill_batch": "CUDA: the most new prompts (a Generate's, first chunk, one ladder width) one prefill "
    "forward runs together (0 = 8 on CUDA; 1 = each alone; never in the deterministic "
    "mode; the CPU prefills each alone)",
    "max_new_tokens": "the most new tokens one request may ask for (more: OUT_OF_RANGE)",
    "constraint_cache_mb": "memory for compiled structured-output constraints and their token masks "
    "(least recently used go first)",
    "constraint_compile_seconds": "CPU seconds (the compiling thread's) one structured-output constraint may "
    "take to compile; more: INVALID_ARGUMENT (CONSTRAINT_TOO_LARGE)",
    "json_schema_strict": "read every JSON schema constraint as OpenAI's strict mode does unless the "
    "request says: an object with declared properties and no additionalProperties "
    "holds only those (the spec's reading, the default, allows others after them)",
    "default_max_new_tokens": "new tokens for a request that names none (0 = as many as fit, up to "
    "--max-new-tokens; above it: --max-new-tokens)",
    "capacity": "KV capacity per session in tokens (auto = the model's max length)",
    "max_prompt_tokens": "the longest prompt in tokens (0 = the KV capacity)",
    "log_level": "log level",
    "speculate": "speculative decoding of a stream that decodes alone: it drafts tokens from its own "
    "prompt and output (prompt lookup) and checks them in one forward, keeping those its sampler "
    "would choose; lookup = on, auto = on where a verification row equals a decode row on this "
    "machine (measured at load; int4 on x86 CPUs parts by ~1.5 nats, so auto leaves it off there), "
    "off = never; never in the deterministic mode (docs/api.md, Speculative decoding)",
    "speculate_tokens": "drafted tokens one verification forward checks at most (1 to 8)",
    "tool_call_format": "how the model writes a tool call, read back under tool_choice auto: hermes "
    "(<tool_call>{json}</tool_call>), llama3_json, mistral, or auto (by the chat "
    "template; hermes when it shows none)",
}


# What a field allows beyond its type: a set of choices, or a lowest (and highest) value.
CHOICES: dict[str, tuple[str, ...]] = {
    "provider": ("cpu", "cuda"),
    "model_precision": ("auto", "int4", "fp16", "fp32"),
    "log_level": ("debug", "info", "warning", "error"),
    "tool_call_format": (AUTO, *FORMATS),
    "speculate": ("off", "lookup", "auto"),
    "cuda_wait": ("spin", "block", "replay"),
    "core_transport": ("direct", "socket"),
}
BOUNDS: dict[str, tuple[float, float | None]] = {
    "port": (0, 65535),
    "metrics_port": (0, 65535),
    "http_port": (0, 65535),
    "chunk_size": (0, None),
    "http_max_connections": (1, None),
    "http_max_connections_per_peer": (1, None),
    "http_header_timeout_seconds": (0.1, None),
    "http_body_timeout_seconds": (0.1, None),
    "http_idle_timeout_seconds": (1, None),
    "frontends": (0, 64),
    "grpc_max_connections": (1, None),
    "grpc_max_concurrent_streams": (1, None),
    "grpc_handshake_timeout_seconds": (0.1, None),
    "grpc_idle_timeout_seconds": (1, None),
    "max_calls_per_peer": (0, None),
    "capacity": (1, None),
    "variant_capacity": (0, None),
    "max_sessions": (1, None),
    "memory_budget_mb": (0, None),
    "max_queue": (1, None),
    "session_idle_seconds": (0.001, None),
    "drain_seconds": (0, None),
    "max_prompt_tokens": (0, None),
    "max_new_tokens": (1, None),
    "default_max_new_tokens": (0, None),
    "max_message_bytes": (1, None),
    "sessions_per_caller": (0, None),
    "session_memory_mb": (0, None),
    "session_device_memory_mb": (0, None),
    "session_memory_per_caller_mb": (0, None),
    "intra_op_threads": (0, None),
    "prefill_batch": (0, 64),
    "speculate_tokens": (1, 8),
    "constraint_cache_mb": (1, None),
    "constraint_compile_seconds": (0.01, None),
}
