"""Llumnix: multi-instance LLM serving with live migration of running requests."""

__version__ = "0.1.0"
