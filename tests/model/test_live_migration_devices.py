"""Live migration of a real model's request between two in-process instances over
real TCP sockets, for every pair of devices: the KV cache is read from the source's
cache tensor (CPU or CUDA) while it keeps decoding, and written into the
destination's. The CPU pair runs everywhere; pairs with CUDA need a GPU."""
from __future__ import annotations

import time

import pytest
import torch

from llumnix.cluster.instance import InstanceServer
from llumnix.core.clock import WallClock
from llumnix.core.sampling_params import SamplingParams
from llumnix.migration import MigrationConfig
from llumnix.migration.destination import DestinationEndpoint
from llumnix.migration.driver import migrate
from llumnix.migration.tcp_transport import KVSender
from llumnix.migration.transport import TransportOptions
from llumnix.policy import FreenessConfig, Llumlet, ReschedulingConfig
from tests.model.helpers import drain, real_engine

TOKEN = b"device-pair-secret"
OPTIONS = TransportOptions(bulk_nice=0)  # correctness here, not the niced copy path
PROMPT = [(i * 37 + 11) % 250 for i in range(45)]
NEEDS_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
PAIRS = [pytest.param("cpu", "cpu", id="cpu-cpu"),
         pytest.param("cuda", "cuda", id="cuda-cuda", marks=NEEDS_CUDA),
         pytest.param("cuda", "cpu", id="cuda-cpu", marks=NEEDS_CUDA),
         pytest.param("cpu", "cuda", id="cpu-cuda", marks=NEEDS_CUDA)]


def _server(loaded, iid: str, step_s: float) -> InstanceServer:
    eng = real_engine(loaded, num_blocks=96, instance_id=iid)
    eng.clock = WallClock()
    ex = eng.executor
    orig = ex.execute

    def paced(batch, orig=orig):
        time.sleep(step_s)  # steps take time, so the pre-copy stages overlap decoding
        return orig(batch)

    ex.execute = paced
    srv = InstanceServer(eng, Llumlet(iid, eng, ReschedulingConfig(), FreenessConfig()))
    srv.start()
    return srv


def _collect(servers, rid: str, timeout: float = 60.0) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        for srv in servers:
            for o in srv.get_outputs(0.01):
                if o.request_id != rid:
                    continue
                first = o.num_output_tokens - len(o.new_token_ids) + 1
                got += [(first + k, t) for k, t in enumerate(o.new_token_ids)]
                if o.is_finished:
                    return got
    raise AssertionError(f"{rid} did not finish")


@pytest.mark.parametrize("src_device,dst_device", PAIRS)
def test_live_migration_between_devices_keeps_the_token_stream(tiny_llama_dir, src_device, dst_device):
    from llumnix.model import load_model

    path = str(tiny_llama_dir[0])
    got = _migrate_midway(load_model(path, device=src_device), load_model(path, device=dst_device))
    assert [t for _, t in sorted(got)] == _unmigrated(load_model(path))


@pytest.mark.parametrize("fmt", ["int4", "w8a8"])
def test_live_migration_between_packed_instances_keeps_the_token_stream(tiny_llama_dir, fmt):
    """Same packed weights on both sides: the migrated stream is the unmigrated one."""
    from llumnix.model import load_model

    path = str(tiny_llama_dir[0])
    expected = _unmigrated(load_model(path, weight_format=fmt))
    src, dst = load_model(path, weight_format=fmt), load_model(path, weight_format=fmt)
    assert src.model.weight_format == dst.model.weight_format == fmt
    got = _migrate_midway(src, dst)
    assert [t for _, t in sorted(got)] == expected


def test_live_migration_between_weight_formats_is_allowed(tiny_llama_dir):
    """Allowed by design: every weight format keeps its KV cache in the engine's dtype with
    the same block shape, so the blocks move unchanged; the destination continues with its
    own weights (the tokens after the move are its model's, not the source's)."""
    from llumnix.model import load_model

    path = str(tiny_llama_dir[0])
    src, dst = load_model(path, weight_format="int4"), load_model(path)
    got = _migrate_midway(src, dst)
    assert sorted(got)[:3] == list(enumerate(_unmigrated(load_model(path, weight_format="int4"))[:3], 1))


def _unmigrated(loaded) -> list[int]:
    ref = real_engine(loaded, num_blocks=96)
    ref.add_request("x", PROMPT, SamplingParams(max_tokens=48))
    return drain(ref)["x"]


def _migrate_midway(src_loaded, dst_loaded) -> list[tuple[int, int]]:
    """Start request x on a source over ``src_loaded``, migrate it after 3 tokens to a
    destination over ``dst_loaded``; its (index, token) stream, checked gapless."""
    params = SamplingParams(max_tokens=48)
    src = _server(src_loaded, "src", 0.01)
    dst = _server(dst_loaded, "dst", 0.01)
    endpoint = DestinationEndpoint(dst, TOKEN, reservation_timeout_s=5.0, options=OPTIONS)
    sender = KVSender(endpoint.address, TOKEN, OPTIONS)
    try:
        assert src.engine.executor.kv_cache.device == src_loaded.model.device
        assert dst.engine.executor.kv_cache.device == dst_loaded.model.device
        src.call(lambda: src.engine.add_request("x", PROMPT, params))
        deadline = time.time() + 30
        while src.call(lambda: src.engine.requests["x"].num_output_tokens) < 3:
            assert time.time() < deadline, "no decode on the source"
            time.sleep(0.005)
        rep = migrate("x", src, endpoint, sender, MigrationConfig(max_stages=3))
        assert rep.committed, rep.abort_reason
        assert rep.num_stages >= 2 and rep.num_bytes > 0
        got = _collect([src, dst], "x")
        assert [i for i, _ in sorted(got)] == list(range(1, 49))  # no gap, no duplicate
        for srv in (src, dst):
            srv.call(srv.engine.check_invariants)
            assert srv.call(lambda s=srv: s.engine.kv.num_free_blocks) == srv.engine.kv.num_total_blocks
        return got
    finally:
        sender.close()
        endpoint.close()
        src.stop()
        dst.stop()
