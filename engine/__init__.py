"""Ladder's engine: a pure prefill planner and the onnxruntime executors that carry its plans out."""
