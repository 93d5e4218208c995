"""Several QUASAR processes on one multi-GPU host: which GPU and which CPUs each evaluation gets.

The outer boundary is the NVIDIA driver's listing (/proc/driver/nvidia/gpus), stood in for by a
folder of the same shape; everything else is the real code. What CUDA itself does with the
numbering is checked on GPUs by tests/test_validator_gpu.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from quasar import config
from quasar.evaluate import gpus as gpus_module
from quasar.evaluate.gpus import GpuOrderError, assigned_gpu, missing_gpu, nvidia_gpus, use_pci_bus_order
from quasar.evaluate.pinning import choose_cpus, device_slot
from quasar.evaluate.sandbox_contents import nvidia_device_nodes, scrubbed_environment
from quasar.evaluate.sandbox_layout import SandboxPolicy
from quasar.miner.runner import MinerSetupError, _device_name
from quasar.validator.devices import Device, ValidatorSetupError, evaluation_devices

UUID_0 = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
UUID_1 = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
UUID_2 = "GPU-bbbbcccc-1111-2222-3333-444444444444"
REPO = Path(__file__).resolve().parent.parent
FASTEST_FIRST_REFUSED = "CUDA_DEVICE_ORDER=FASTEST_FIRST: QUASAR numbers GPUs in PCI bus order"


def run_fastest_first(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """``quasar ARGV`` run with CUDA_DEVICE_ORDER=FASTEST_FIRST and a HOME of its own."""
    environment = {**os.environ, "HOME": str(tmp_path), "CUDA_DEVICE_ORDER": "FASTEST_FIRST", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "quasar", *argv],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def driver(tmp_path, monkeypatch):
    """Three GPUs as the driver lists them, its folders named out of bus order as listdir may give them."""
    root = tmp_path / "gpus"
    for bus, minor, uuid in (("0000:CA:00.0", 2, UUID_2), ("0000:17:00.0", 0, UUID_0), ("0000:65:00.0", 1, UUID_1)):
        (root / bus).mkdir(parents=True)
        (root / bus / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n"
        )
    monkeypatch.setattr(gpus_module, "DRIVER_GPUS", str(root))
    return nvidia_gpus()


def test_the_driver_listing_is_in_pci_bus_order(driver):
    assert [(gpu.bus, gpu.minor, gpu.uuid) for gpu in driver] == [
        ("0000:17:00.0", 0, UUID_0),
        ("0000:65:00.0", 1, UUID_1),
        ("0000:ca:00.0", 2, UUID_2),
    ]


def test_workers_named_by_uuid_get_their_own_cpu_slots(driver):
    """CUDA_VISIBLE_DEVICES by UUID gave every worker slot 0: two evaluations timed on the same cores."""
    devices = evaluation_devices("cuda", 2, f"{UUID_2},{UUID_1}", driver)
    slots = [device_slot("cuda", device.cuda_visible_devices, driver) for device in devices]
    assert slots == [2, 1]
    cores = {cpu: frozenset({cpu}) for cpu in range(8)}
    plans = [choose_cpus(range(8), cores, slot) for slot in slots]
    assert plans[0] is not None and plans[1] is not None
    assert not (plans[0].child | plans[0].timing) & (plans[1].child | plans[1].timing)


def test_a_uuid_prefix_names_its_one_gpu(driver):
    """CUDA takes the start of a UUID (nvidia-smi -L's GPU-8a1f0c2e); the sandbox must find that GPU."""
    assert assigned_gpu("GPU-aaaaaaaa", driver) == driver[0]
    assert assigned_gpu("GPU-bbbbc", driver) == driver[2]
    assert assigned_gpu("GPU-bbbb", driver) is None  # two GPUs start so: CUDA refuses it too
    assert assigned_gpu("3", driver) is None
    assert assigned_gpu("MIG-0f2a7c1d-1111-2222-3333-444444444444", driver) is None
    assert device_slot("cuda", "GPU-bbbbbbbb", driver) == 1


def test_a_sandbox_named_by_uuid_prefix_holds_its_own_gpu_only(driver, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbbbbbb")
    environment = scrubbed_environment(str(tmp_path), "cuda", SandboxPolicy(), "marker")
    assert environment["CUDA_VISIBLE_DEVICES"] == UUID_1
    assert environment["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    _, note = nvidia_device_nodes("cuda")
    assert note == "its own GPU's device node only (0000:65:00.0)"


@pytest.mark.parametrize(
    ("visible", "cuda_count", "why"),
    [
        ("0,7", 1, "lists 2 GPU\\(s\\) but CUDA uses 1"),  # CUDA stops at the GPU past the last
        ("1,1", 0, "lists 2 GPU\\(s\\) but CUDA uses 0"),  # a repeat: CUDA uses none
        ("", 0, "lists 0 GPU\\(s\\) but CUDA uses 0"),
        ("-1", 0, "lists 1 GPU\\(s\\) but CUDA uses 0"),
    ],
)
def test_visible_devices_that_cuda_does_not_use_stop_the_validator_at_start(driver, visible, cuda_count, why):
    """Each names the setting and the GPUs the driver lists (before: 0,7 silently ran on one GPU,
    and an empty list said to install the NVIDIA driver)."""
    with pytest.raises(ValidatorSetupError, match=f"CUDA_VISIBLE_DEVICES='{visible}' {why}") as caught:
        evaluation_devices("cuda", cuda_count, visible, driver)
    assert "the NVIDIA driver lists 3 GPU(s) (nvidia-smi's numbering, PCI bus order): 0: 0000:17:00.0" in str(
        caught.value
    )
    assert UUID_2 in str(caught.value)


def test_device_past_the_last_gpu_names_the_gpus_found(driver):
    assert evaluation_devices("cuda:1", 2, "2,0", driver) == [Device("cuda:1", "0")]
    with pytest.raises(ValidatorSetupError, match=r"DEVICE is cuda:2 .*CUDA_VISIBLE_DEVICES=2,0; .*lists 3 GPU"):
        evaluation_devices("cuda:2", 2, "2,0", driver)


@pytest.mark.parametrize("count", [0, 1, 2, 5])
def test_a_device_names_a_gpu_exactly_when_its_ordinal_is_below_the_count(count):
    """The one rule the evaluation, the miner, step1, the reference model's loader and the validator
    check DEVICE by at start (tests/test_device_ordinal_gpu.py runs them on a GPU), against
    torch's numbering: cuda is cuda:0, and cuda:N exists where N < the count."""
    assert missing_gpu("cpu", count) is None
    for index in range(7):
        assert (missing_gpu(f"cuda:{index}", count) is None) == (index < count)
    assert (missing_gpu("cuda", count) is None) == (count > 0)
    if count:
        said = missing_gpu(f"cuda:{count}", count, "3,1,4,1,5"[: 2 * count - 1])
        assert said is not None and f"torch sees {count} CUDA device(s), cuda:0" in said
        assert said.endswith(f"of CUDA_VISIBLE_DEVICES={'3,1,4,1,5'[: 2 * count - 1]}"), said
    else:
        assert missing_gpu("cuda:0", 0) == "CUDA is not available here: torch sees no CUDA device"


def test_gpus_are_numbered_in_pci_bus_order_in_every_process():
    environ: dict[str, str] = {}
    use_pci_bus_order(environ)
    assert environ == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    with pytest.raises(GpuOrderError, match=FASTEST_FIRST_REFUSED):
        use_pci_bus_order({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})


def test_a_validator_told_fastest_first_stops_before_anything_else(tmp_path):
    """Its workers number GPUs in PCI bus order: CUDA_VISIBLE_DEVICES=2 would be another GPU in the
    validator's own process (its reference model) than in its evaluations."""
    finished = run_fastest_first(tmp_path, "validator", "--device", "cuda")
    assert finished.returncode == 1
    assert FASTEST_FIRST_REFUSED in finished.stderr


def test_quasar_evaluate_told_fastest_first_stops_naming_it(tmp_path):
    """The parent's torch would take cuda:1 in CUDA's fastest-first order, its sandbox nvidia-smi's GPU 1."""
    finished = run_fastest_first(tmp_path, "evaluate", str(tmp_path), "--target", "512", "--device", "cuda:1")
    assert finished.returncode == 2
    assert FASTEST_FIRST_REFUSED in finished.stderr


def test_the_miner_told_fastest_first_stops_naming_it(monkeypatch):
    """Its benchmarks' sandboxes take DEVICE=cuda:1 as nvidia-smi's GPU 1, its own torch as CUDA's order's."""
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    with pytest.raises(MinerSetupError, match=FASTEST_FIRST_REFUSED):
        _device_name("cuda:1")


def test_the_inference_server_told_fastest_first_stops_naming_it(tmp_path):
    """CUDA_VISIBLE_DEVICES=0 for it and =2,3 for a validator must be nvidia-smi's GPUs in both."""
    finished = run_fastest_first(tmp_path, "inference", "serve", "--device", "cuda")
    assert finished.returncode == 1
    assert FASTEST_FIRST_REFUSED in finished.stderr


def test_cuda_variables_in_the_env_file_reach_every_process(tmp_path, monkeypatch):
    """START_MINER_INFERENCE.sh exports no .env: its CUDA_VISIBLE_DEVICES=1 left the inference server on GPU 0."""
    dotenv = tmp_path / "miner.env"
    dotenv.write_text("CUDA_VISIBLE_DEVICES=1\nCUDA_DEVICE_ORDER=PCI_BUS_ID\n")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    config.resolve(dotenv_path=dotenv)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the environment wins, as everywhere
    config.resolve(dotenv_path=dotenv)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def test_the_inference_server_reads_cuda_device_order_from_its_env_file(tmp_path):
    dotenv = tmp_path / "miner.env"
    dotenv.write_text("CUDA_DEVICE_ORDER=FASTEST_FIRST\n")
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CUDA_")}
    environment.update(HOME=str(tmp_path), QUASAR_DOTENV=str(dotenv), PYTHONPATH=str(REPO))
    finished = subprocess.run(
        [str(REPO / "START_MINER_INFERENCE.sh"), "--device", "cuda"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 1
    assert FASTEST_FIRST_REFUSED in finished.stderr
