"""`llumnix serve --engine-url URL` runs lite mode (no Ray, no local instances)."""
from __future__ import annotations

import pytest

from llumnix.cli import build_parser


def test_serve_with_engine_urls_runs_lite_mode(monkeypatch):
    import llumnix.lite.serve as lite

    seen = {}

    def fake_main_lite(args):
        seen["urls"] = args.engine_url
        return 0

    monkeypatch.setattr(lite, "main_lite", fake_main_lite)
    args = build_parser().parse_args(["serve", "--engine-url", "http://h1:8000", "--engine-url", "http://h2:8000",
                                      "--port", "0"])
    from llumnix.cluster.serve import main_serve

    assert main_serve(args) == 0
    assert seen["urls"] == ["http://h1:8000", "http://h2:8000"]


def test_serve_without_engine_urls_is_not_lite():
    from llumnix.lite.serve import wants_lite

    assert not wants_lite(build_parser().parse_args(["serve", "--port", "0"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--engine-url"])  # a URL is required
