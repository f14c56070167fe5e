"""The engine worker: the scheduler, its rounds, jobs and answers, KV slot grants (slots), and the job
bodies it runs (generation, samples, speculation, min_tokens, the door's cut orders: cuts). Its
bodies work on a session's state (service/core/sessions.py)."""
