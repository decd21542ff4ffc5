"""``benchmarks/suite_cpu.py``: the per-test CPU log of ``tests/conftest.py`` and its summary."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import load_benchmark, run_quick


def test_the_summary_adds_cpu_per_module_and_divides_by_the_cores():
    suite_cpu = load_benchmark("suite_cpu")
    records = [
        {"id": "tests/a.py::x", "cpu": 30.0, "wall": 20.0},
        {"id": "tests/a.py::y", "cpu": 10.0, "wall": 12.0},
        {"id": "tests/b.py::z", "cpu": 60.0, "wall": 70.0},
    ]
    summary = suite_cpu.summarise(records, cores=2)
    assert (summary["tests"], summary["cpu_seconds"], summary["wall_seconds"]) == (3, 100, 102)
    assert summary["floor_seconds"] == 50  # 100 CPU-s on 2 cores
    assert summary["modules"] == [
        {"module": "tests/b.py", "cpu": 60.0, "share": 0.6},
        {"module": "tests/a.py", "cpu": 40.0, "share": 0.4},
    ]
    assert [t["id"] for t in summary["top_tests"]] == [
        "tests/b.py::z",
        "tests/a.py::x",
        "tests/a.py::y",
    ]
    assert summary["top_tests"][1]["share"] == pytest.approx(0.3)


def test_suite_cpu_quick_logs_every_test_of_its_modules():
    saved = run_quick("suite_cpu")
    assert saved["pytest_exit_code"] == 0
    modules = {m["module"] for m in saved["modules"]}
    assert modules == {"tests/test_config.py", "tests/test_layout.py"}
    assert saved["tests"] == saved["headline"]["tests"] > len(modules)
    assert all(t["cpu"] >= 0 and t["wall"] >= 0 for t in saved["top_tests"])
    assert sum(m["cpu"] for m in saved["modules"]) == pytest.approx(saved["cpu_seconds"], abs=0.2)
    assert saved["floor_seconds"] == pytest.approx(saved["cpu_seconds"] / saved["cores"], abs=0.1)
    # the session's own line (tests/conftest.py): all of the session, so at least its tests
    session = saved["session"]
    assert session["cpu_seconds"] >= saved["cpu_seconds"] - 0.2
    assert saved["wall_seconds"] - 0.2 <= session["wall_seconds"] <= saved["pytest_wall"]
    assert session["busy"] == pytest.approx(
        session["cpu_seconds"] / (session["wall_seconds"] * saved["cores"]), abs=1e-3
    )
    # machine-wide: at most every core busy throughout (CI's other workers may fill them),
    # give or take 1 CPU-s, as /proc/stat and the clock are read at different instants
    assert 0 < session["cpu_seconds"] <= saved["cores"] * session["wall_seconds"] + 1.0


def test_the_session_line_is_read_back_and_its_absence_is_none():
    suite_cpu = load_benchmark("suite_cpu")
    output = (
        "... 3 passed\n"
        "machine CPU during the suite: 1200.0 CPU-s in 640.0 s wall on 2 cores (94% busy; ...)\n"
    )
    assert suite_cpu.session_totals(output) == {
        "cpu_seconds": 1200.0,
        "wall_seconds": 640.0,
        "busy": pytest.approx(1200.0 / (2 * 640.0), abs=1e-3),
    }
    assert suite_cpu.session_totals("3 passed in 1.0s") is None


def test_chosen_tests_are_run_and_saved_apart_from_the_whole_suites_record(monkeypatch, tmp_path):
    suite_cpu = load_benchmark("suite_cpu")
    ran, saved = [], []

    def run_suite(log, tests):
        ran.append(tests)
        log.write_text('{"id": "tests/a.py::x", "cpu": 3.0, "wall": 2.0}\n')
        return 0, 2.5, None

    monkeypatch.setattr(suite_cpu, "run_suite", run_suite)
    monkeypatch.setattr(suite_cpu, "report", lambda name, quick, *_: saved.append(name))
    assert suite_cpu.main(["tests/a.py", "tests/b.py::y"]) == 0
    assert suite_cpu.main(["tests/a.py", "--save-as", "suite_cpu.before"]) == 0
    assert suite_cpu.main([]) == 0
    assert ran == [["tests/a.py", "tests/b.py::y"], ["tests/a.py"], []]
    assert saved == ["suite_cpu.selected", "suite_cpu.before", "suite_cpu"]
    log = tmp_path / "log.jsonl"
    log.write_text("")
    with pytest.raises(SystemExit) as refused:
        suite_cpu.main(["--from", str(log), "tests/a.py"])
    assert refused.value.code == 2
