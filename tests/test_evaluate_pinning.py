"""CPU pinning of an evaluation: the core-choosing rule over synthetic topologies, and on this
machine a real sandboxed child started on the chosen CPUs, the parent's thread given its own back."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from pathlib import Path

import pytest

from quasar.evaluate import pinning
from quasar.evaluate.confinement import descendants
from quasar.evaluate.pinning import (
    CpuPlan,
    choose_cpus,
    device_slot,
    format_cpu_list,
    parse_cpu_list,
    physical_cores,
    read_thread_siblings,
)
from tests.evaluate_runs import FAST_CPU


def smt_topology(cores: int, threads: int) -> dict[int, frozenset[int]]:
    """Linux's usual numbering: CPU ``c + k * cores`` is hardware thread ``k`` of core ``c``."""
    siblings = {}
    for core in range(cores):
        group = frozenset(core + k * cores for k in range(threads))
        siblings.update({cpu: group for cpu in group})
    return siblings


def check_plan(plan: CpuPlan, allowed: set[int], siblings: dict[int, frozenset[int]]) -> None:
    assert plan.child and plan.timing
    assert plan.child <= allowed and plan.timing <= allowed
    # Never the same physical core: no CPU of one is a hardware sibling of a CPU of the other.
    assert not any(siblings.get(cpu, frozenset({cpu})) & plan.timing for cpu in plan.child)
    # Each side is one whole physical core (as far as the affinity allows).
    for side in (plan.child, plan.timing):
        cpu = min(side)
        assert side == (siblings.get(cpu, frozenset()) | {cpu}) & allowed


# --- the rule --------------------------------------------------------------------------------


def test_cpu_lists_parse_and_format_like_the_kernel():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("5") == {5}
    assert format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    rng = random.Random()
    for _ in range(50):
        cpus = set(rng.sample(range(200), rng.randint(1, 60)))
        assert parse_cpu_list(format_cpu_list(cpus)) == cpus
    for bad in ("a", "3-1", "-1", "1-x"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


def test_siblings_are_read_from_sysfs_and_missing_files_mean_a_core_of_its_own(tmp_path):
    for cpu, text in ((0, "0,4\n"), (4, "0,4\n"), (1, "1-2"), (3, "garbage")):
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(text)
    siblings = read_thread_siblings([0, 1, 3, 4, 7], tmp_path)
    assert siblings == {0: {0, 4}, 4: {0, 4}, 1: {1, 2}, 3: {3}, 7: {7}}


def test_one_core_is_not_pinned():
    assert choose_cpus({0}, {}, 0) is None
    assert choose_cpus({0, 1}, smt_topology(1, 2), 0) is None
    assert choose_cpus(set(), {}, 0) is None


def test_smt_pairs_give_whole_cores_never_siblings_of_each_other():
    siblings = smt_topology(4, 2)
    assert physical_cores(range(8), siblings) == [{1, 5}, {2, 6}, {3, 7}, {0, 4}]
    assert choose_cpus(range(8), siblings, 0) == CpuPlan(child=frozenset({1, 5}), timing=frozenset({2, 6}))
    assert choose_cpus(range(8), siblings, 1) == CpuPlan(child=frozenset({3, 7}), timing=frozenset({0, 4}))
    for slot in range(2):
        check_plan(choose_cpus(range(8), siblings, slot), set(range(8)), siblings)


def test_without_smt_every_gpu_slot_gets_distinct_cores():
    plans = [choose_cpus(range(16), {}, slot) for slot in range(8)]
    used = [cpu for plan in plans for cpu in (*plan.child, *plan.timing)]
    assert sorted(used) == list(range(16)) and not any(plan.shared for plan in plans)
    # CPU 0 (interrupts, housekeeping) is the last one handed out.
    assert plans[-1].timing == {0} and plans[0].child == {1}


def test_an_affinity_subset_is_respected():
    siblings = smt_topology(8, 2)
    allowed = {4, 5, 6, 7, 12, 13}
    assert physical_cores(allowed, siblings) == [{4, 12}, {5, 13}, {6}, {7}]
    first, second = choose_cpus(allowed, siblings, 0), choose_cpus(allowed, siblings, 1)
    assert (first.child, first.timing, second.child, second.timing) == ({4, 12}, {5, 13}, {6}, {7})
    check_plan(first, allowed, siblings)


def test_more_gpus_than_core_pairs_share_gracefully():
    siblings = smt_topology(3, 2)
    plans = [choose_cpus(range(6), siblings, slot) for slot in range(5)]
    assert [plan.shared for plan in plans] == [False, True, True, True, True]
    for plan in plans:
        check_plan(plan, set(range(6)), siblings)
    assert plans[3] == CpuPlan(plans[0].child, plans[0].timing, shared=True)


def test_random_topologies_follow_the_rule():
    rng = random.Random()
    for _ in range(200):
        cores, threads = rng.randint(1, 12), rng.choice((1, 2, 4))
        siblings = smt_topology(cores, threads)
        allowed = set(rng.sample(sorted(siblings), rng.randint(1, len(siblings))))
        count = len(physical_cores(allowed, siblings))
        plans = [choose_cpus(allowed, siblings, slot) for slot in range(6)]
        if count < 2:
            assert plans == [None] * 6
            continue
        for slot, plan in enumerate(plans):
            check_plan(plan, allowed, siblings)
            assert plan == choose_cpus(sorted(allowed, reverse=True), siblings, slot)
            assert plan.shared == (slot >= count // 2)
        distinct = [plan for plan in plans if not plan.shared]
        cpus = [cpu for plan in distinct for cpu in (*plan.child, *plan.timing)]
        assert len(cpus) == len(set(cpus))


@pytest.mark.parametrize(
    ("device", "visible", "slot"),
    [
        ("cuda", None, 0),
        ("cuda:2", None, 2),
        ("cuda", "3", 3),
        ("cuda:1", "4,5", 5),
        ("cuda", "GPU-8a1f0c2e-uuid", 0),
        ("cuda:1", "GPU-a,GPU-b", 1),
        ("cpu", None, 0),
        ("cuda:3", "1", 3),
    ],
)
def test_the_slot_is_the_physical_gpu_index_where_known(device, visible, slot):
    assert device_slot(device, visible) == slot


# --- this machine ----------------------------------------------------------------------------

needs_two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs this process may use",
)


@needs_two_cpus
def test_pinned_sets_and_restores_this_threads_cpus(caplog):
    before = os.sched_getaffinity(0)
    cpu = max(before)
    with pinning.pinned(frozenset({cpu})) as done:
        assert done and os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before
    with pinning.pinned(None) as done:
        assert not done and os.sched_getaffinity(0) == before
    monkey_state = pinning._failure_logged
    pinning._failure_logged = False
    try:
        with caplog.at_level(logging.DEBUG, logger="quasar.evaluate.pinning"):
            for _ in range(2):
                with pinning.pinned(frozenset({1 << 16})) as done:
                    assert not done and os.sched_getaffinity(0) == before
        levels = [record.levelno for record in caplog.records if "cannot pin" in record.getMessage()]
        assert levels == [logging.INFO, logging.DEBUG]
    finally:
        pinning._failure_logged = monkey_state
    assert os.sched_getaffinity(0) == before


def sandbox_processes(pid: int) -> list[int]:
    """Processes under ``pid`` that carry the sandbox's marker variable (the launcher and the child)."""
    from quasar.evaluate.stragglers import MARKER_VARIABLE

    def marked(process: int) -> bool:
        try:
            return f"{MARKER_VARIABLE}=".encode() in Path(f"/proc/{process}/environ").read_bytes()
        except OSError:
            return False

    return [process for process in descendants(pid) if process != pid and marked(process)]


@needs_two_cpus
@pytest.mark.slow
def test_a_real_sandboxed_child_runs_on_the_chosen_cpus(tmp_path):
    from quasar.evaluate.sandbox import SandboxedChild, SandboxPolicy

    before = os.sched_getaffinity(0)
    plan, _ = pinning.plan_for("cuda")
    assert plan is not None
    (tmp_path / "fork").mkdir()
    with SandboxedChild(tmp_path / "fork", "cpu", SandboxPolicy(allow_unsandboxed=True), cpus=plan.child) as child:
        assert os.sched_getaffinity(0) == before
        assert child.child_cpus == sorted(plan.child)
        processes = sandbox_processes(os.getpid())
        assert len(processes) >= 2, "the sandbox's launcher and child are not under this process"
        assert all(os.sched_getaffinity(pid) == plan.child for pid in processes)
    assert os.sched_getaffinity(0) == before


@needs_two_cpus
@pytest.mark.slow
def test_an_evaluation_pins_the_child_and_its_timing_thread_then_restores(tmp_path):
    from quasar.evaluate import (
        ProgressEvent,
        SandboxPolicy,
        evaluate,
    )
    from quasar.starter_fork import write_starter_fork

    before = os.sched_getaffinity(0)
    plan, note = pinning.plan_for("cpu")
    seen: dict[str, set] = {}

    def progress(event: ProgressEvent) -> None:
        if event.stage == "timed" and "timing" not in seen:
            seen["timing"] = os.sched_getaffinity(0)
            processes = sandbox_processes(os.getpid())
            seen["children"] = {frozenset(os.sched_getaffinity(pid)) for pid in processes} if processes else set()

    fork = tmp_path / "fork"
    write_starter_fork(fork)
    options = dataclasses.replace(FAST_CPU, pin_cpus=True, policy=SandboxPolicy(allow_unsandboxed=True))
    report = evaluate(fork, 64, None, options, progress)
    assert report.cpu_pinning == note == plan.describe()
    assert seen["timing"] == plan.timing and seen["children"] == {plan.child}
    assert os.sched_getaffinity(0) == before


def test_pinning_is_on_cuda_unless_turned_off_or_forced():
    from quasar.evaluate.start import cpu_plan

    assert cpu_plan("cpu", None) == (None, "not pinned (CPU device)")
    assert cpu_plan("cuda", False) == (None, "not pinned (pin_cpus is off)")
    assert cpu_plan("cuda", None) == pinning.plan_for("cuda")
    assert cpu_plan("cpu", True) == pinning.plan_for("cpu")
