"""install-slurm-hooks run again (an upgrade, the guide's step configure again) renders what its
options set and keeps what the site changed by hand in agent.json (issue 42)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from malleable_policy.model import Policy
from slurm_plugin.hooks.install import SiteSettingsUnreadable, with_site_settings
from slurm_plugin.node.config import AgentConfig


def test_a_new_render_keeps_the_sites_own_settings(tmp_path):
    existing = tmp_path / "agent.json"
    site = json.loads(AgentConfig(node="x", policy=Policy.STATIC).to_json())
    site.update(input_cpu_budget_ms=250, enabled=False, max_borrowed_cpus=2,
                partition_max_weight={"gpu": 4}, removed_in_this_version=1)
    existing.write_text(json.dumps(site))
    rendered = AgentConfig(node="x", policy=Policy.LEND_IDLE, feed_dir=Path("/new/feed"))
    merged = with_site_settings(rendered, existing)
    assert (merged.input_cpu_budget_ms, merged.enabled, merged.max_borrowed_cpus,
            dict(merged.partition_max_weight)) == (250, False, 2, {"gpu": 4})
    # What the command line says is the command line's.
    assert (merged.policy, merged.feed_dir) == (Policy.LEND_IDLE, Path("/new/feed"))


def test_none_there_is_the_render_and_a_broken_one_is_refused(tmp_path):
    rendered = AgentConfig(node="x")
    assert with_site_settings(rendered, tmp_path / "missing.json") is rendered
    bad = tmp_path / "agent.json"
    bad.write_text("{not json")
    with pytest.raises(SiteSettingsUnreadable, match="cannot be read as JSON"):
        with_site_settings(rendered, bad)
    bad.write_text(json.dumps({"input_cpu_budget_ms": 0}))
    with pytest.raises(SiteSettingsUnreadable, match="input_cpu_budget_ms"):
        with_site_settings(rendered, bad)
    assert bad.read_text() == json.dumps({"input_cpu_budget_ms": 0})   # the site's, untouched
