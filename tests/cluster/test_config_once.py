"""The typed configs are built and checked once, in the serve process, and passed whole
(issue 44): serve's composition (the system config, the cluster config, LlumSched, the
gateway's scheduler) parses the scheduling config at most once, and no actor or the
gateway parses it again. No Ray: the actor's class is built directly; the instance actor,
which needs Ray and a model, is held to it by a scan of the cluster package's source."""
from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

from llumnix.cluster import launcher
from llumnix.cluster.llumsched import LlumSchedActor
from llumnix.config.sections import LiveMigrationConfig
from llumnix.config.system import SystemConfig
from llumnix.policy import GlobalScheduler, SchedulingConfig

CLUSTER = Path(__file__).resolve().parents[2] / "src/llumnix/cluster"
DOC = {"model": "smollm2",
       "scheduling": {"dispatch": {"policy": "llumnix", "pending_grace_s": 0.5},
                      "rescheduling": {"enabled": True, "trigger_gap_s": 0.02}},
       "migration": {"max_stages": 2, "transport_options": {"chunk_bytes": 4096}},
       "deployment": {"instances": 2}}


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every ``SchedulingConfig.from_dict`` call in this process from here on."""
    calls: list[object] = []
    real = SchedulingConfig.from_dict.__func__  # type: ignore[attr-defined]

    def counted(cls: type[SchedulingConfig], d: object) -> SchedulingConfig:
        calls.append(d)
        return real(cls, d)  # type: ignore[no-any-return]

    monkeypatch.setattr(SchedulingConfig, "from_dict", classmethod(counted))
    return calls


def test_serves_composition_parses_the_scheduling_config_at_most_once(parses):
    system = SystemConfig.from_dict(DOC)
    at_start = len(parses)
    cfg = system.to_cluster_config()
    sched, mig = launcher.scheduling_of(cfg), launcher.migration_of(cfg)
    assert sched is system.scheduling and mig is system.migration  # whole, not flattened
    actor = LlumSchedActor.__ray_actor_class__(sched, None, reschedule_interval_s=3600,
                                               instance_spec={"migration": mig, "scheduling": sched})
    setup = actor.gateway_setup()
    gateway_gs = GlobalScheduler(setup["scheduling"])  # what the gateway's client builds
    assert setup["scheduling"] is sched and gateway_gs.config is sched
    assert actor.gs.config is sched and actor.gs.config.rescheduling.trigger_gap_s == 0.02
    assert len(parses) == at_start <= 1, parses
    assert pickle.loads(pickle.dumps(sched)) == sched and pickle.loads(pickle.dumps(mig)) == mig  # Ray carries them


def test_a_dict_from_a_test_or_benchmark_is_parsed_once_with_its_grace_default(parses):
    cfg = launcher.ClusterConfig(scheduling={"rescheduling": {"enabled": False}}, migration={"timeout_s": 2.0})
    sched, mig = launcher.scheduling_of(cfg), launcher.migration_of(cfg)
    assert len(parses) == 1
    assert sched.dispatch.pending_grace_s == 1.0 and not sched.rescheduling.enabled
    assert mig == LiveMigrationConfig(timeout_s=2.0) and mig.protocol.timeout_s == 2.0
    with pytest.raises(Exception, match="migration.max_stagez"):
        launcher.migration_of(launcher.ClusterConfig(migration={"max_stagez": 2}))


def test_no_actor_or_gateway_module_parses_a_config():
    """Only the launcher's dict path (tests, benchmarks) may call ``SchedulingConfig.from_dict``
    in cluster/ (serve's one ``SystemConfig.from_dict`` builds it from the YAML)."""
    found = []
    for p in sorted(CLUSTER.glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "from_dict"
                    and isinstance(node.value, ast.Name) and node.value.id == "SchedulingConfig"):
                found.append(p.name)
    assert found == ["launcher.py"], found
