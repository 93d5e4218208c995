"""The kernel's tunables contract: the starter fork's ``fla/ops/quasar/tuning.py`` (its defaults,
its errors, a tuning for one chip), loaded from the template as the tools load it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quasar.starter_fork import (
    KERNEL_DIR,
    template_root,
    tuning_contract,
)


def test_tuning_contract_defaults_and_errors(tmp_path):
    contract = tuning_contract()
    assert contract.parse_tuning({}) == contract.DEFAULTS
    tuned = contract.parse_tuning({"segment_chunks": 32, "precision": "tf32", "layer_tile_tokens": 4096})
    assert (tuned.segment_chunks, tuned.precision, tuned.layer_tile_tokens) == (32, "tf32", 4096)
    with pytest.raises(ValueError, match="unknown tunable 'chunk'"):
        contract.parse_tuning({"chunk": 64})
    with pytest.raises(ValueError, match="segment_chunks must be one of"):
        contract.parse_tuning({"segment_chunks": 12})
    with pytest.raises(ValueError, match="layer_tile_tokens must be a positive multiple of 64"):
        contract.parse_tuning({"layer_tile_tokens": 100})
    with pytest.raises(ValueError, match="num_stages"):
        contract.parse_tuning({"num_stages": True})
    assert contract.parse_tuning({"wy_maxnreg": 0}).wy_maxnreg == 0
    assert contract.parse_tuning({"wy_maxnreg": 128}).wy_maxnreg == 128
    for bad in (100, 160, 256, False, "168"):
        with pytest.raises(ValueError, match=r"wy_maxnreg must be one of \[0, 128, 136"):
            contract.parse_tuning({"wy_maxnreg": bad})
    bad = tmp_path / "tuning.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        contract.load_tuning(str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"segment_warps": 8}))
    assert contract.load_tuning(str(good)).segment_warps == 8
    assert contract.load_tuning(str(tmp_path / "absent.json")) == contract.DEFAULTS


def test_a_tuning_for_one_chip_applies_on_that_chip_alone(tmp_path):
    contract = tuning_contract()
    values = {"segment_chunks": 64, "devices": {"H200": {"wy_warps": 1}, "nvidia h": {"wy_warps": 4}}}
    assert contract.parse_tuning(values).wy_warps == contract.DEFAULTS.wy_warps
    for device, warps in (("NVIDIA H200", 1), ("NVIDIA H100 80GB HBM3", 4), ("NVIDIA A100-SXM4-80GB", 2), (None, 2)):
        tuned = contract.parse_tuning(values, device=device)
        assert (tuned.wy_warps, tuned.segment_chunks) == (warps, 64), device
    for bad, message in (
        ({"devices": []}, "devices must map"),
        ({"devices": {" ": {}}}, "empty device-name"),
        ({"devices": {"H200": {"wy_warps": 3}}}, r"devices\['H200'\]: wy_warps must be one of"),
        ({"devices": {"H200": {"devices": {}}}}, "unknown tunable 'devices'"),
    ):
        with pytest.raises(ValueError, match=message):
            contract.parse_tuning(bad, device="NVIDIA H200")
    # The shipped file is the defaults on every chip: the H100's tuning measured faster on an H200
    # too than the H200's own entry did (benchmarks/RESULTS.md, issue 16's ninth session).
    shipped = json.loads((Path(str(template_root())) / KERNEL_DIR / "tuning.json").read_text())
    for device in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", None):
        assert contract.parse_tuning(shipped, device=device) == contract.DEFAULTS
    file = tmp_path / "chips.json"
    file.write_text(json.dumps(values))
    assert contract.load_tuning(str(file), "NVIDIA H200").wy_warps == 1
    assert contract.load_tuning(str(file)).wy_warps == 2
    assert contract.device_name_of(torch.zeros(1)) is None
