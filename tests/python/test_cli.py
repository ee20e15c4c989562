"""The command line on any machine: help, info, synth, and clear errors (CPU)."""
import subprocess
import sys

import pytest

from pyprefill.cli import main


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("check", "info", "synth", "demo", "run", "bench"):
        assert cmd in out


def test_synth_then_info(tmp_path, capsys):
    path = tmp_path / "m.gguf"
    assert main(["synth", "--model", "qwen35-tiny", "--quant", "q4_k_m", "-o", str(path), "-q"]) == 0
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "arch: qwen35" in out and "Q4_K" in out


def test_engine_commands_fail_cleanly(tmp_path, capsys):
    """Without a GPU (or on a missing file) the engine commands print one error line."""
    from pyprefill import core
    missing = str(tmp_path / "missing.gguf")
    assert main(["run", missing, "--tokens", "1,2"]) == 1
    err = capsys.readouterr().err
    expected = "cannot open" if core.device_count() else "NoDeviceError"
    assert expected in err and "Traceback" not in err
    assert main(["bench", missing, "-p", "16"]) == 1        # checked before looking for a GPU
    err = capsys.readouterr().err
    assert "no such file" in err and "Traceback" not in err


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "pyprefill", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("pyprefill ")
