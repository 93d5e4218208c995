"""The pm2 ecosystem file (ecosystem.config.js) as pm2 reads it: evaluated by node, pm2's runtime."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def ecosystem_apps() -> dict[str, dict]:
    """The apps of ecosystem.config.js, by name, as node evaluates the file."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node (pm2's runtime) is not installed")
    listing = subprocess.run(
        [node, "-e", "console.log(JSON.stringify(require(process.argv[1]).apps))", str(ROOT / "ecosystem.config.js")],
        capture_output=True,
        text=True,
        check=True,
    )
    return {app["name"]: app for app in json.loads(listing.stdout)}


def test_a_crash_loop_backs_off_by_the_one_restart_delay_pm2_applies():
    # pm2 (lib/God.js, handleExit) takes exp_backoff_restart_delay over restart_delay when both are
    # set: a fixed restart_delay beside it is silently ignored, and the file said what pm2 did not do.
    apps = ecosystem_apps()
    assert apps
    for name, app in apps.items():
        assert "restart_delay" not in app, f"{name}: pm2 ignores restart_delay beside exp_backoff_restart_delay"
        # A transient crash comes back after 1 s; a crash loop (a missing wallet) backs off by 1.5 x
        # per restart to pm2's cap of 15 s, so it neither spins nor waits long once fixed.
        assert app["exp_backoff_restart_delay"] == 1000, name
        assert app["autorestart"] is True and app["kill_timeout"] == 30000, name
