"""The one test harness: real servers, generated models, prompts and waits that every test shares.

- `servers`: `RunningServer` (a real LadderServer on a loopback port, its event loop on a thread
  of its own), `server_config`, `free_port`, and what a test may observe or hold: the scheduler's
  step log, the worker held inside a call (`frozen`), the event loop held (`paused`), call counts.
- `models`: the generated decoder with a byte-level tokenizer, and the default model's cache.
- `engines`: loading an engine and the greedy references (decode path and whole-append path).
- `prompts`: deterministic prompt ids and greedy requests.
- `waiting`: `wait_for`, the one bounded poll.
- `fixtures`: the pytest fixtures over them (a plugin the root conftest loads).
"""
