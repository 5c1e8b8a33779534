"""PD on a real cluster (Ray, LlumSched, the gateway over HTTP): new requests go to the
prefill instance only, each is handed off to the decode instance after its first token, the
client's stream is the one a co-located engine gives (greedy), the counts are in
/admin/cluster and /metrics, and both instances' blocks come back exactly."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.cluster.helpers import ADMIN, running_cluster, stream_completion, wait_idle

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ENGINE = {"num_blocks": 512}
MAX_TOKENS = 160  # long enough that each hand-off commits before its request ends


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    with running_cluster(tiny_model_dir, "pd", instances=2, engine=ENGINE,
                         scheduling={"pd": {"mode": "static", "prefill_instances": 1}}) as c:
        yield c


def _reference(model_dir, prompts: list[str]) -> list[str]:
    from llumnix.core.sampling_params import SamplingParams
    from llumnix.llm import LLM

    llm = LLM(str(model_dir), block_size=4, num_blocks=512, max_num_seqs=8)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [c.text for c in llm.generate(prompts, params)]


def test_requests_prefill_on_the_prefill_instance_and_decode_on_the_decode_instance(server, cluster,
                                                                                     tiny_model_dir):
    url, _ = server
    info = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()
    assert info["pd"]["roles"] == {"instance-0": "prefill", "instance-1": "decode"}
    assert {i["instance_id"]: i["role"] for i in info["instances"]} == info["pd"]["roles"]
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    prompts = [f"the story number {i} begins" for i in range(4)]

    async def main():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(stream_completion(client, url, {
                "model": name, "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})
                for p in prompts))

    results = asyncio.run(main())
    assert [r.errors for r in results] == [[]] * 4
    assert [r.completion_tokens for r in results] == [MAX_TOKENS] * 4
    assert [r.text for r in results] == _reference(tiny_model_dir, prompts)  # one stream, tokens once

    pd = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()["pd"]
    assert pd["handoffs_done"] == 4 and pd["handoffs_failed"] == 0, pd
    assert pd["handoff_downtime_s"]["count"] == 4
    # each hand-off listed by both ends and LlumSched's time, as the dashboard shows it
    assert {(h["src_instance_id"], h["dst_instance_id"]) for h in pd["handoffs_recent"]} == {("instance-0", "instance-1")}
    assert all(h["reported_at"] > 1e9 for h in pd["handoffs_recent"])
    metrics = httpx.get(f"{url}/metrics").text
    assert 'llumnix:pd_handoffs_total{model_name="' in metrics and 'outcome="done"} 4.0' in metrics
    # every prefill ran on the prefill instance; the decode instance only decoded
    logs = {iid: ray.get(a.step_log.remote(True)) for iid, a in cluster.instances.items()}
    assert any(step[4] for step in logs["instance-0"])
    assert logs["instance-1"] and not any(step[4] for step in logs["instance-1"])
    counts = wait_idle(cluster.instances)
    assert all(c["num_requests"] == 0 and c["num_used_blocks"] == 0 for c in counts.values()), counts
