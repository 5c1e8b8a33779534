"""OpenAI-compatible HTTP gateway."""
