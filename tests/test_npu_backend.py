"""The NPU backend on a fake ``torch.npu``: where the frequency comes from, the device,
buffers in device memory, and a capture session that stores what the device wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fake_npu import FakeNpu, fake_torch_npu, install

from multicore_profiler import Store, mega_kernel_profile
from multicore_profiler.abi import DESC_WAIT_DEPENDENCY, BufferLayout, CoreType
from multicore_profiler.errors import BackendError, FrequencyError
from multicore_profiler.kernels import (
    ProfileSpec,
    ProfileStage,
    build_runtime_config,
    new_tasks,
    prepare_call,
)
from multicore_profiler.kernels.npu import (
    CycleFrequency,
    NpuBackend,
    normalize_soc,
    profiler_info_file,
    profiler_info_frequency,
    resolve_frequency,
    soc_frequency,
)


@pytest.fixture
def npu(monkeypatch: pytest.MonkeyPatch) -> FakeNpu:
    fake = install()
    fake.reset()
    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu(fake))
    return fake


def write_info(path: Path, start_info: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"start_info": start_info, "end_info": {}}))
    return path


def test_importing_the_package_and_cli_imports_no_torch_npu() -> None:
    code = (
        "import sys, multicore_profiler, multicore_profiler.cli, multicore_profiler.kernels.npu\n"
        "print('torch_npu' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_without_torch_npu_the_backend_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(BackendError, match=r"pip install 'multicore_profiler\[npu\]'"):
        NpuBackend()


@pytest.mark.parametrize(
    ("name", "normalized", "hz"),
    [
        ("Ascend910B4", "ascend910b4", 50e6),
        ("Ascend910B1", "ascend910b1", 50e6),
        ("Ascend 910B3", "ascend910b3", 50e6),
        ("Ascend910_9372", "ascend910_9372", 50e6),
        ("Ascend910_9391", "ascend910_9391", 50e6),
        ("Ascend910C", "ascend910c", 50e6),
        ("Ascend910A", "ascend910a", None),
        ("Ascend910ProB", "ascend910prob", None),
        ("Ascend310P3", "ascend310p3", None),
    ],
)
def test_soc_table_by_normalized_name(name: str, normalized: str, hz: float | None) -> None:
    assert normalize_soc(name) == normalized
    found = soc_frequency(name)
    assert (found.hz if found else None) == hz
    if found:
        assert found.source == "soc_table"


def test_an_unknown_soc_with_no_report_raises_unless_overridden() -> None:
    with pytest.raises(FrequencyError, match=r"SoC 'Ascend310P3' is unknown.*give frequency_hz"):
        resolve_frequency("Ascend310P3")
    assert resolve_frequency("Ascend310P3", override_hz=19.2e6) == CycleFrequency(
        19.2e6, "override", "given"
    )
    for bad in (0, -5e6, float("nan"), "50e6", True):
        with pytest.raises(FrequencyError, match="frequency_hz: "):
            resolve_frequency("Ascend910B4", override_hz=bad)  # type: ignore[arg-type]


def test_profiler_info_is_read_in_mhz_and_only_when_the_counter_was_read(
    tmp_path: Path,
) -> None:
    on = write_info(tmp_path / "a" / "profiler_info_3.json", {"syscnt_enable": True, "freq": 100})
    assert profiler_info_frequency(on) == CycleFrequency(100e6, "profiler_info", str(on))
    spaced = write_info(tmp_path / "b" / "profiler_info.json", {"syscnt freq": 25})
    assert profiler_info_frequency(spaced).hz == 25e6  # type: ignore[union-attr]
    # Without the system counter torch_npu writes its default 100, not the chip's.
    off = write_info(tmp_path / "c" / "profiler_info.json", {"syscnt_enable": False, "freq": 100})
    assert profiler_info_frequency(off) is None
    bad = write_info(tmp_path / "d" / "profiler_info.json", {"syscnt_enable": True, "freq": "x"})
    with pytest.raises(FrequencyError, match=r"profiler_info.json start_info.freq \(MHz\)"):
        profiler_info_frequency(bad)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "profiler_info.json").write_text("{not json")
    with pytest.raises(FrequencyError, match="cannot be read"):
        profiler_info_frequency(tmp_path / "e")
    empty = write_info(tmp_path / "f" / "profiler_info.json", {"syscnt_enable": True})
    with pytest.raises(FrequencyError, match="start_info has no freq"):
        profiler_info_frequency(empty)


def test_profiler_info_file_in_a_capture_directory(tmp_path: Path) -> None:
    capture = tmp_path / "capture"
    r0 = write_info(capture / "host_a_ascend_pt" / "profiler_info_0.json", {"freq": 100})
    r1 = write_info(capture / "host_b_ascend_pt" / "profiler_info_1.json", {"freq": 100})
    assert profiler_info_file(capture, rank=1) == r1
    assert profiler_info_file(capture / "host_a_ascend_pt") == r0  # one rank's file only
    with pytest.raises(FrequencyError, match=r"holds no profiler_info.json \(but 2 other"):
        profiler_info_file(capture)
    with pytest.raises(FrequencyError, match=r"holds no profiler_info_7\.json or profiler_info"):
        profiler_info_file(capture, rank=7)
    write_info(capture / "again" / "profiler_info_1.json", {"freq": 100})
    with pytest.raises(FrequencyError, match=r"holds 2 files named profiler_info_1\.json"):
        profiler_info_file(capture, rank=1)
    with pytest.raises(FrequencyError, match="does not exist"):
        profiler_info_file(tmp_path / "nowhere")


def test_frequency_sources_in_order(npu: FakeNpu, tmp_path: Path) -> None:
    info = write_info(tmp_path / "profiler_info.json", {"syscnt_enable": True, "freq": 25})
    npu.freq_mhz = 100
    assert NpuBackend(frequency_hz=24e6, profiler_info=info).cycle_frequency == CycleFrequency(
        24e6, "override", "given"
    )
    device = NpuBackend(profiler_info=info)
    assert (device.frequency_hz, device.frequency_source) == (100e6, "device")
    npu.syscnt_enable = False
    from_info = NpuBackend(profiler_info=info)
    assert (from_info.frequency_hz, from_info.frequency_source) == (25e6, "profiler_info")
    table = NpuBackend()
    assert table.cycle_frequency == CycleFrequency(
        50e6, "soc_table", "Ascend910B4 matches ascend910b*"
    )
    assert repr(table) == "NpuBackend(npu:0, soc='Ascend910B4', 50 MHz from soc_table)"
    npu.names = ["Ascend310P3"]
    with pytest.raises(FrequencyError, match="SoC 'Ascend310P3' is unknown"):
        NpuBackend()


def test_the_device_comes_from_torch_npu_or_the_user(npu: FakeNpu) -> None:
    npu.names = ["Ascend910B4", "Ascend910_9372"]
    npu.current = 1
    backend = NpuBackend()
    assert (backend.device, backend.device_index, backend.soc) == (
        torch.device("npu", 1),
        1,
        "Ascend910_9372",
    )
    assert NpuBackend(0).device == torch.device("npu", 0)
    assert NpuBackend("npu").device_index == 1
    with pytest.raises(BackendError, match=r"npu:5 does not exist: torch.npu sees 2 device"):
        NpuBackend("npu:5")
    with pytest.raises(BackendError, match="'cpu' is not an NPU device"):
        NpuBackend("cpu")
    npu.names = []
    with pytest.raises(BackendError, match="reports no NPU"):
        NpuBackend()


def test_host_copies_are_taken_after_the_device_finished(npu: FakeNpu) -> None:
    backend = NpuBackend()
    buffer = backend.allocate(8)
    assert (buffer.device, backend.placeholder.device) == (torch.device("npu", 0),) * 2
    npu.launch(buffer, torch.arange(1, 9, dtype=torch.uint8))
    host = np.full(8, 7, np.uint8)
    backend.to_host(buffer, host)
    assert host.tolist() == [0] * 8  # still running
    backend.synchronize()
    backend.to_host(buffer, host)
    assert host.tolist() == list(range(1, 9))
    assert npu.synchronized == [0]


def device_writes(layout: BufferLayout, entry: int) -> torch.Tensor:
    """What a two-worker launch writes: AIC/0 waits 100 cycles then computes stage 1 for
    250; AIV/0 computes its fallback stage for 50."""
    buffer = layout.new_buffer()
    for core, records in (
        (CoreType.AIC, [(entry, entry + 100, DESC_WAIT_DEPENDENCY), (entry + 100, entry + 350, 1)]),
        (CoreType.AIV, [(entry + 10, entry + 60, 0x20002)]),
    ):
        region = layout.region(buffer, core)
        for i, (start, end, desc) in enumerate(records):
            region["records"]["start_cycle"][0, i] = start
            region["records"]["end_cycle"][0, i] = end
            region["records"]["desc_id"][0, i] = desc
            region["records"]["task_id"][0, i] = 0 if core == CoreType.AIC else 1
            region["records"]["owner_id"][0, i] = 0xFFFFFFFF
        header = region["header"][0]
        header["entry_cycle"], header["record_count"] = entry, len(records)
        header["core_type"], header["record_capacity"] = core, layout.capacity(core)
    return torch.from_numpy(buffer)


def test_a_capture_on_the_npu_stores_its_device_soc_and_frequency(
    npu: FakeNpu, store: Store
) -> None:
    npu.names = ["Ascend910B4", "Ascend910B4"]
    npu.current = 1
    npu.syscnt_enable = False  # the SoC table's 50 MHz: 20 ns a cycle
    tasks = new_tasks(2)
    tasks["core_type"] = [CoreType.AIC, CoreType.AIV]
    tasks["task_type"] = [1, 2]
    tasks["wait_event"][0], tasks["trigger_event"][1] = 0, 0
    spec = ProfileSpec(kernel_name="NpuMoe", stages=[ProfileStage(1, "GMM", task_type=1)])
    config = build_runtime_config(
        tasks, event_count=1, aic_workers=1, aiv_workers=1, backend=NpuBackend(), spec=spec
    )
    with mega_kernel_profile(store=store) as prof:
        for launch in range(2):
            with prepare_call(config) as call:
                assert call.buffer.device == torch.device("npu", 1)
                npu.launch(call.buffer, device_writes(config.layout, 1000 + 500 * launch))
            prof.step()
    assert npu.synchronized == [1, 1]
    invocations = store.sql(
        "SELECT step, device, soc, frequency_hz, frequency_source FROM invocations ORDER BY step"
    ).to_pylist()
    assert invocations == [
        {"step": s, "device": 1, "soc": "Ascend910B4", "frequency_hz": 50e6,
         "frequency_source": "soc_table"}
        for s in (0, 1)
    ]  # fmt: skip
    records = store.sql(
        "SELECT step, core, phase, stage, ts_ns, dur_ns FROM records_ns ORDER BY step, core, ts_ns"
    ).to_pylist()
    assert [tuple(r.values()) for r in records] == [
        (step, *record)
        for step in (0, 1)
        for record in (
            ("AIC", "wait", "GMM", 0.0, 2000.0),
            ("AIC", "compute", "GMM", 2000.0, 5000.0),
            ("AIV", "compute", "TaskType_2", 200.0, 1000.0),
        )
    ]
    assert npu.pending == []
