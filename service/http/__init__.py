"""The OpenAI-compatible HTTP API beside gRPC: openai.py converts, answers.py answers, app.py serves
(completions.py: what only /v1/completions has)."""
