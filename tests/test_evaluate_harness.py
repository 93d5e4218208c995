"""The whole evaluation (quasar/evaluate/harness.py), where its parts meet."""

from __future__ import annotations

import time

from quasar.evaluate import options


def test_a_fork_failing_the_import_check_has_its_started_child_killed_at_once(tmp_path, monkeypatch):
    # The child starts before the import check (its torch import overlaps the check); a fork that
    # fails the check never reaches the child's load, and the child, still starting, is killed
    # without the two seconds an exit request would wait for a reply.
    from quasar.evaluate import harness
    from quasar.evaluate.sandbox import SandboxedChild
    from quasar.starter_fork import copy_starter_tree

    fork = tmp_path / "fork"
    copy_starter_tree(fork)
    chunk = fork / "fla" / "ops" / "quasar" / "chunk.py"
    chunk.write_text("from fla.ops.gla import chunk_gla\n" + chunk.read_text())
    started, closed = [], []
    real_start, real_close = SandboxedChild.start, SandboxedChild.close

    def start(self):
        started.append(time.monotonic())
        return real_start(self)

    def close(self):
        began = time.monotonic()
        real_close(self)
        closed.append((began, time.monotonic(), self.process.poll() if self.process else None, self.workdir))

    monkeypatch.setattr(SandboxedChild, "start", start)
    monkeypatch.setattr(SandboxedChild, "close", close)
    checked = []
    real_check = harness._import_check
    monkeypatch.setattr(
        harness, "_import_check", lambda repo, options: checked.append(time.monotonic()) or real_check(repo, options)
    )
    report = harness.evaluate(fork, 64, None, options.EvaluationOptions(seq_lens=(), device="cpu"))
    assert report.verdict == "fail" and report.import_check.ok is False
    assert any(
        reason.startswith("import check: fla/ops/quasar/chunk.py:1: forbidden-import") for reason in report.reasons
    )
    assert len(started) == 1 and started[0] < checked[0]
    ((began, ended, exit_status, workdir),) = closed
    assert ended - began < 1.5 and exit_status is not None and workdir is None
