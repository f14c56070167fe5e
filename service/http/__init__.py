"""The OpenAI-compatible HTTP API beside gRPC: openai.py converts, app.py serves."""
