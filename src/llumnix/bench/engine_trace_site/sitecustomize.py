"""Runs at every Python start-up of a ``bench cluster --trace`` cluster (this directory is
first on its ``PYTHONPATH``): install the engine trace when ``LLUMNIX_ENGINE_TRACE`` is set."""
import os

if os.environ.get("LLUMNIX_ENGINE_TRACE"):
    from llumnix.bench.engine_trace import install

    install(os.environ["LLUMNIX_ENGINE_TRACE"])
