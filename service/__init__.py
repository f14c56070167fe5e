"""Ladder's gRPC service: servicer, validation, status mapping, sessions, health, metrics, config."""
