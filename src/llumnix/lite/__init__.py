"""Lite mode: Llumnix's dispatch in front of engines it does not own (no llumlet inside
them): a local real-time state per endpoint, health checks, retries and traffic splitting
across pools (``docs/lite.md``)."""
