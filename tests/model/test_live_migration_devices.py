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

    params = SamplingParams(max_tokens=48)
    ref = real_engine(load_model(str(tiny_llama_dir[0])), num_blocks=96)
    ref.add_request("x", PROMPT, params)
    expected = drain(ref)["x"]

    src = _server(load_model(str(tiny_llama_dir[0]), device=src_device), "src", 0.01)
    dst = _server(load_model(str(tiny_llama_dir[0]), device=dst_device), "dst", 0.01)
    endpoint = DestinationEndpoint(dst, TOKEN, reservation_timeout_s=5.0, options=OPTIONS)
    sender = KVSender(endpoint.address, TOKEN, OPTIONS)
    try:
        assert src.engine.executor.kv_cache.device.type == src_device
        assert dst.engine.executor.kv_cache.device.type == dst_device
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
        assert [t for _, t in sorted(got)] == expected
        for srv in (src, dst):
            srv.call(srv.engine.check_invariants)
            assert srv.call(lambda s=srv: s.engine.kv.num_free_blocks) == srv.engine.kv.num_total_blocks
    finally:
        sender.close()
        endpoint.close()
        src.stop()
        dst.stop()
