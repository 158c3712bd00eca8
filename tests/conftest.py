"""Settings every test shares."""

import os

import pytest
from hypothesis import HealthCheck, settings

# Generation speed and per-example deadlines measure the machine, not the code:
# on a loaded 2-core CI box they fail healthy tests. CI also runs derandomized,
# so a red run reproduces exactly.
settings.register_profile(
    "swarmrl",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("swarmrl")


@pytest.fixture(scope="session")
def default_model(tmp_path_factory):
    """The embedded default policy, built once per session as `swarmrl model init` does."""
    from orchestrator.pretrain import build_default_model

    return build_default_model(tmp_path_factory.mktemp("models") / "default")
