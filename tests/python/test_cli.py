"""The command line on any machine: help, info, synth, and clear errors (CPU)."""
import argparse
import os
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
    assert ("  verdict: valid: libprefill's reader and model checks accept it (those of `run` and "
            "Model.load)") in out.splitlines()


def test_engine_commands_fail_cleanly(tmp_path, capsys):
    """Without a GPU (or on a missing file) the engine commands print one error line."""
    missing = str(tmp_path / "missing.gguf")
    assert main(["run", missing, "--tokens", "1,2"]) == 1     # run checks the file first, anywhere
    err = capsys.readouterr().err
    assert "cannot open" in err and "Traceback" not in err
    assert main(["bench", missing, "-p", "16"]) == 1        # checked before looking for a GPU
    err = capsys.readouterr().err
    assert "no such file" in err and "Traceback" not in err


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "pyprefill", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("pyprefill ")


# ------------------------------------------------------------------ user mistakes: one line each

@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    assert main(["synth", "--model", "qwen3-tiny", "--quant", "q8_0", "-o", str(path), "-q"]) == 0
    return str(path)


@pytest.fixture(scope="module")
def short_context_gguf(tmp_path_factory):
    """qwen3-tiny with context_length 16: a longer prompt cannot fit any session of it."""
    from gguf_helpers import tiny_desc, write_gguf
    path = tmp_path_factory.mktemp("cli") / "ctx16.gguf"
    return str(write_gguf(path, tiny_desc("qwen3-tiny"), extra_kv={"qwen3.context_length": 16}))


def _fails_in_one_line(capsys, argv, needle, rc=1):
    """main(argv) exits non-zero with exactly one stderr line, naming the problem."""
    try:
        got = main(argv)
    except SystemExit as e:                    # argparse: usage line + one error line, exit 2
        got = e.code
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.startswith("pyprefill")]
    else:
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
    assert got == rc, f"{argv}: exit {got}, stderr {err!r}"
    assert len(lines) == 1, f"{argv}: expected one line, got {err!r}"
    assert lines[0].startswith(f"pyprefill {argv[0]}"), lines[0]
    assert needle in lines[0], f"{argv}: {lines[0]!r} lacks {needle!r}"
    assert "Traceback" not in err
    return lines[0]


def test_synth_into_a_missing_directory_is_one_line(tmp_path):
    """The issue's case, end to end in a fresh interpreter: no traceback from the gguf writer."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-m", "pyprefill", "synth", "--model", "qwen3-tiny",
                          "-o", "missing_dir/x.gguf", "-q"], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip() == ("pyprefill synth: InvalidArgumentError: missing_dir/x.gguf: "
                                  "missing_dir does not exist")


@pytest.mark.parametrize("case", ["dir_output", "file_as_dir", "empty_output", "bad_layers",
                                  "bad_vocab", "huge_vocab", "negative_seed", "text_seed",
                                  "unknown_quant", "unknown_model"])
def test_synth_user_mistakes(case, tmp_path, capsys):
    """Each value is checked where it is parsed, with the flag's name (exit 2), or by the writer
    before it creates anything (exit 1); no message from the gguf writer or NumPy, no file."""
    (tmp_path / "f.txt").write_text("x")
    out = str(tmp_path / "m.gguf")
    argv, needle, rc = {
        "dir_output": (["-o", str(tmp_path)], "is a directory", 1),
        "file_as_dir": (["-o", str(tmp_path / "f.txt" / "m.gguf")], "is not a directory", 1),
        "empty_output": (["-o", ""], "argument -o/--output: an empty path", 2),
        "bad_layers": (["-o", out, "--layers", "0"], "argument --layers: 0 is less than 1", 2),
        "bad_vocab": (["-o", out, "--vocab", "10"], "argument --vocab: 10 is less than 260", 2),
        "huge_vocab": (["-o", out, "--vocab", str(2**31)], "argument --vocab: 2147483648 is more than", 2),
        "negative_seed": (["-o", out, "--seed", "-1"], "argument --seed: -1 is less than 0", 2),
        "text_seed": (["-o", out, "--seed", "x"], "argument --seed: 'x' is not an integer", 2),
        "unknown_quant": (["-o", str(tmp_path / "m.gguf"), "--quant", "q3_xl"], "invalid choice", 2),
        "unknown_model": (["-o", str(tmp_path / "m.gguf"), "--model", "llama-7b"], "invalid choice", 2),
    }[case]
    if "--model" not in argv:
        argv = ["--model", "qwen3-tiny", *argv]
    _fails_in_one_line(capsys, ["synth", *argv, "-q"], needle, rc)
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_synth_to_a_full_disk_names_the_file(capsys):
    _fails_in_one_line(capsys, ["synth", "--model", "qwen3-tiny", "-o", "/dev/full", "-q"],
                       "/dev/full: No space left on device")
    assert os.path.exists("/dev/full")          # the cleanup removes partial files, not devices


@pytest.mark.parametrize("quant", ["Q4_K_M", "Q8_0", "q4_0", "BF16", "Ud"])
def test_quant_names_in_any_case(quant, tmp_path):
    from pyprefill.formats.gguf_model import load_model_desc
    path = tmp_path / "m.gguf"
    assert main(["synth", "--model", "QWEN35-Tiny", "--quant", quant, "-o", str(path), "-q"]) == 0
    assert load_model_desc(path).arch == "qwen35"


def test_quant_names_in_any_case_in_the_python_api():
    from pyprefill.formats.hf_export import choose_qtype
    from pyprefill.formats.synth import preset_desc, tensor_qtype
    import numpy as np
    desc = preset_desc("Qwen3-Tiny")
    assert tensor_qtype("Q4_K_M", "blk.0.ffn_up.weight", desc) == tensor_qtype("q4_k_m", "blk.0.ffn_up.weight", desc)
    w = np.zeros((64, 64), np.float32)
    assert choose_qtype("blk.0.ffn_up.weight", w, "Q8_0") == choose_qtype("blk.0.ffn_up.weight", w, "q8_0") == 8


BAD_FILES = ["missing", "directory", "fifo", "not_gguf", "short_text", "text_19_bytes", "empty",
             "truncated_header", "truncated_data", "extra_tensor_count", "wrong_arch"]


def _bad_file(case, tmp_path, tiny_gguf):
    """A file `run` refuses, and the words the library refuses it with."""
    path = tmp_path / "x.gguf"
    data = open(tiny_gguf, "rb").read()
    if case == "directory":
        path = tmp_path
    elif case == "fifo":                   # open() would block until a writer came: refused first
        os.mkfifo(path)
    elif case == "text_19_bytes":
        path.write_text("just some text here")
    elif case == "extra_tensor_count":     # the header claims one tensor more than it holds
        import struct
        raw = bytearray(data)
        struct.pack_into("<Q", raw, 8, struct.unpack_from("<Q", raw, 8)[0] + 1)
        path.write_bytes(bytes(raw))
    elif case == "not_gguf":
        path.write_text("hello world, this is not a model at all. " * 10)
    elif case == "short_text":
        path.write_text("hello")
    elif case == "empty":
        path.write_bytes(b"")
    elif case == "truncated_header":
        path.write_bytes(data[:5000])
    elif case == "truncated_data":
        path.write_bytes(data[:len(data) // 2])
    elif case == "wrong_arch":
        from gguf_helpers import tiny_desc, write_gguf
        path = write_gguf(path, tiny_desc("qwen3-tiny"), arch="llama")
    io, fmt = "GGUFError: PF_STATUS_IO_ERROR: ", "GGUFFormatError: PF_STATUS_FORMAT_ERROR: "
    needle = {"missing": (io, "cannot open: No such file"),
              "directory": (io, "not a regular file (a directory)"),
              "fifo": (io, "not a regular file (a FIFO)"),
              "not_gguf": (fmt, 'not a GGUF file (bad magic "hell", expected "GGUF")'),
              "short_text": (fmt, 'not a GGUF file (bad magic "hell", expected "GGUF")'),
              "text_19_bytes": (fmt, 'not a GGUF file (bad magic "just", expected "GGUF")'),
              "empty": (fmt, "empty file (0 bytes): not a GGUF file"),
              "truncated_header": (fmt, "truncated GGUF"),
              "truncated_data": (fmt, "truncated GGUF"),
              "extra_tensor_count": (fmt, "has an empty name; is tensor_count too large?"),
              "wrong_arch": ("UnsupportedError: ", "llama")}[case]
    return str(path), needle


@pytest.mark.parametrize("case", BAD_FILES)
def test_info_user_mistakes(case, tmp_path, tiny_gguf, capsys):
    """One line each, with the status that names the class of fault: IO_ERROR for a file that
    cannot be read, FORMAT_ERROR for its contents (GGUFFormatError, a GGUFError)."""
    path, (kind, words) = _bad_file(case, tmp_path, tiny_gguf)
    line = _fails_in_one_line(capsys, ["info", path], words)
    assert line.startswith(f"pyprefill info: {kind}"), line


@pytest.mark.parametrize("case", BAD_FILES)
def test_info_and_run_give_the_same_verdict(case, tmp_path, tiny_gguf, capsys):
    """info reads a file with the library's reader, as run does: the same words for every fault."""
    path, _ = _bad_file(case, tmp_path, tiny_gguf)
    assert main(["info", path]) == 1
    info_err = capsys.readouterr().err.strip()
    assert main(["run", path, "--tokens", "1"]) == 1
    run_err = capsys.readouterr().err.strip()
    assert info_err.removeprefix("pyprefill info: ") == run_err.removeprefix("pyprefill run: ")


def test_info_reads_the_header_fast_and_lists_types(tmp_path, capsys):
    """A large vocabulary (the tokenizer arrays of a real Qwen3.5 GGUF: 248320 strings) is skipped,
    not parsed; the tensor table comes from the header, after the library's verdict."""
    import time

    from pyprefill.formats.info import skim_header
    from gguf_helpers import tiny_desc, write_gguf
    path = write_gguf(tmp_path / "v.gguf", tiny_desc("qwen35-tiny"),
                      extra_kv={"tokenizer.ggml.tokens": [f"t{i}" for i in range(200_000)]})
    t0 = time.perf_counter()
    meta, tensors = skim_header(str(path))
    assert time.perf_counter() - t0 < 5
    assert meta["general.architecture"] == "qwen35" and "tokenizer.ggml.tokens" not in meta
    assert {n for n, *_ in tensors} >= {"token_embd.weight", "blk.3.attn_q.weight"}
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "arch: qwen35" in out and "F32" in out and "attention at 3" in out


def test_info_without_the_library_says_so(tmp_path, tiny_gguf):
    """No library: the Python reader judges the file, and a note on stderr says so."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYPREFILL_LIBRARY=str(tmp_path / "none.so"),
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-m", "pyprefill", "info", tiny_gguf],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("note: libprefill is not loadable (cannot load libprefill")
    assert "the Python reader checked this file instead" in out.stderr
    assert "arch: qwen3" in out.stdout and "Q8_0" in out.stdout
    assert out.stdout.splitlines()[1].startswith("  verdict: valid for the Python reader")
    (tmp_path / "bad.gguf").write_bytes(open(tiny_gguf, "rb").read()[:5000])
    out = subprocess.run([sys.executable, "-m", "pyprefill", "info", str(tmp_path / "bad.gguf")],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "pyprefill info: GGUFFormatError: " in out.stderr     # the Python reader: the same class


@pytest.mark.parametrize("case", ["missing", "not_gguf", "empty_path", "bad_token", "no_tokens",
                                  "empty_item", "trailing_comma", "negative", "beyond_int32",
                                  "beyond_vocab", "longer_than_context", "n_predict", "chunk"])
def test_run_user_mistakes(case, tmp_path, tiny_gguf, short_context_gguf, capsys):
    """--tokens is checked where it is parsed (exit 2, naming the item by its index from 0 and
    its value: never read as another prompt); the vocabulary once the file is read (exit 1)."""
    (tmp_path / "notes.txt").write_text("not a model, just a note in a text file")
    argv, needle, rc = {
        "missing": ([str(tmp_path / "none.gguf"), "--tokens", "1"], "cannot open", 1),
        "not_gguf": ([str(tmp_path / "notes.txt"), "--tokens", "1"], "not a GGUF file", 1),
        "empty_path": (["", "--tokens", "1"], "argument file: an empty path", 2),
        "bad_token": ([tiny_gguf, "--tokens", "1,x,3"], "argument --tokens: '1,x,3': [1] = 'x' is not a token id", 2),
        "no_tokens": ([tiny_gguf, "--tokens", " , "], "argument --tokens: ' , ': no token ids given", 2),
        "empty_item": ([tiny_gguf, "--tokens", "1,,2"], "argument --tokens: '1,,2': [1] is empty", 2),
        "trailing_comma": ([tiny_gguf, "--tokens", "1,2,"], "'1,2,': [2] is empty", 2),
        "negative": ([tiny_gguf, "--tokens", "5 -1"], "'5 -1': [1] = -1 is not a token id in [0, 2147483647]", 2),
        "beyond_int32": ([tiny_gguf, "--tokens", "4294967301"], "[0] = 4294967301 is not a token id", 2),
        "beyond_vocab": ([tiny_gguf, "--tokens", "1,1024"], "--tokens[1] = 1024 is outside the vocabulary [0, 1024)", 1),
        "longer_than_context": ([short_context_gguf, "--tokens", ",".join(["7"] * 12)],
                                "context_length is 16", 1),
        "n_predict": ([tiny_gguf, "--tokens", "1", "--n-predict", "-1"], "argument --n-predict: -1 is less than 0", 2),
        "chunk": ([tiny_gguf, "--tokens", "1", "--chunk", "-1"], "argument --chunk: -1 is less than 0", 2),
    }[case]
    _fails_in_one_line(capsys, ["run", *argv], needle, rc)


def test_run_and_bench_take_chunk_0_alike():
    """--chunk 0 is the session's own chunk in both (the README's bench line uses it)."""
    from pyprefill.cli import build_parser
    assert build_parser().parse_args(["run", "m.gguf", "--tokens", "1", "--chunk", "0"]).chunk == 0
    assert build_parser().parse_args(["run", "m.gguf", "--tokens", "1"]).chunk == 0
    assert build_parser().parse_args(["bench", "m.gguf", "--chunk", "0"]).chunk == 0
    assert build_parser().parse_args(["run", "m.gguf", "--tokens", "1, 2 3"]).tokens == [1, 2, 3]


def test_run_without_a_gpu_is_one_line(tiny_gguf, capsys):
    from pyprefill import core
    if core.device_count():
        pytest.skip("a GPU is present: test_run_on_a_gpu covers this machine")
    _fails_in_one_line(capsys, ["run", tiny_gguf, "--tokens", "1,2,3"], "NoDeviceError")


@pytest.mark.gpu
def test_run_on_a_gpu(tiny_gguf, capsys):
    assert main(["run", tiny_gguf, "--tokens", "1,2,3", "--n-predict", "3"]) == 0
    out = capsys.readouterr().out
    assert "prefill: 3 tokens" in out and "greedy tokens:" in out


@pytest.mark.gpu
def test_run_prompt_at_the_context_limit_fits(short_context_gguf, capsys):
    """12 prompt tokens + 3 predicted + 1 = 16 positions: exactly the context length."""
    assert main(["run", short_context_gguf, "--tokens", ",".join(["7"] * 12), "--n-predict", "3"]) == 0


def test_demo_names_its_models_and_removes_a_temporary_dir(tmp_path, capsys):
    """Without --dir the synthetic models go to a temporary directory that the output names and
    the end removes (it used to stay, 6 MB a run, unnamed); --dir keeps them, named, for the next
    run to reuse."""
    import re
    assert main(["demo", "--length", "4"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"^synthetic models in (\S+) \(removed at the end; --dir DIR keeps them\)$", out, re.M)
    assert m, out
    assert os.path.basename(m.group(1)).startswith("pyprefill-demo-") and not os.path.exists(m.group(1))
    keep = tmp_path / "models"
    assert main(["demo", "--length", "4", "--dir", str(keep)]) == 0
    assert f"synthetic models in {keep} (kept)" in capsys.readouterr().out
    assert sorted(p.name for p in keep.iterdir()) == ["qwen3-tiny-q8_0.gguf", "qwen35-tiny-q4_k_m.gguf"]


def test_demo_user_mistakes(tmp_path, capsys):
    (tmp_path / "f.txt").write_text("x")
    _fails_in_one_line(capsys, ["demo", "--length", "0"], "--length", 2)
    _fails_in_one_line(capsys, ["demo", "--length", "4", "--dir", str(tmp_path / "f.txt" / "d")],
                       "Not a directory")


def test_demo_tokens_is_a_deprecated_spelling_of_length(tmp_path, capsys):
    """`run --tokens` takes token ids; demo's prompt length is --length. The old spelling still
    works and warns, naming the new one."""
    from pyprefill.cli import build_parser
    assert build_parser().parse_args(["demo", "--length", "12"]).length == 12
    assert capsys.readouterr().err == ""
    assert build_parser().parse_args(["demo", "--tokens", "12"]).length == 12
    err = capsys.readouterr().err
    assert "warning: --tokens is deprecated" in err and "use --length" in err
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert "--length" in out and "--tokens" not in out


def test_option_names_agree_across_subcommands(capsys):
    """One name, one meaning: --tokens is token ids (run), a prompt length is --length (demo) or
    --lengths (bench), a quant mix is --quant (synth, bench), a seed --seed."""
    from pyprefill.cli import build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    shown = {name: {o for act in p._actions if act.help != argparse.SUPPRESS
                    for o in act.option_strings}
             for name, p in sub.choices.items()}
    assert "--tokens" in shown["run"] and "--tokens" not in shown["demo"]
    assert "--length" in shown["demo"] and "--lengths" in shown["bench"]
    assert "--quant" in shown["synth"] and "--quant" in shown["bench"] and "--mix" not in shown["bench"]
    assert all("--seed" in shown[c] for c in ("check", "synth", "demo"))


def test_bench_bad_lengths_is_one_line(tmp_path, capsys):
    """bench's own parsing may change; the main() handler turns its ValueError into one line."""
    try:
        rc = main(["bench", str(tmp_path / "m.gguf"), "-p", "16,x"])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err and len(err.strip().splitlines()) >= 1


@pytest.mark.parametrize("case", ["not_an_elf", "missing"])
def test_library_not_loadable_shows_the_whole_reason(tmp_path, case):
    """A library that cannot load: which file, the loader's own reason (not cut to "(...)") and
    the README's install command; no traceback."""
    lib = tmp_path / "libprefill.so"
    if case == "not_an_elf":
        lib.write_text("not a shared object\n" * 4)
    env = dict(os.environ, PYPREFILL_LIBRARY=str(lib))
    out = subprocess.run([sys.executable, "-m", "pyprefill", "run", str(tmp_path / "m.gguf"),
                          "--tokens", "1"], capture_output=True, text=True, env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr and "(...)" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith("pyprefill run: cannot load libprefill: "), lines
    if case == "not_an_elf":    # dlopen's words, e.g. "invalid ELF header" or "file too short"
        assert lines[0].startswith(f"pyprefill run: cannot load libprefill: {lib}: "), lines
        assert len(lines[0]) > len(f"pyprefill run: cannot load libprefill: {lib}: ") + 5, lines
    else:
        assert f"not found: {lib}" in out.stderr
    assert "pip install ." in out.stderr and "PYPREFILL_LIBRARY" in out.stderr


def test_load_error_names_cublas_and_every_candidate():
    from pyprefill._ffi import load_error
    text = load_error([("/pkg/lib/libprefill.so", None),
                       ("/src/build/libprefill.so",
                        "libcublasLt.so.13: cannot open shared object file: No such file or directory"),
                       ("/src/build-old/libprefill.so", "wrong ELF class: ELFCLASS32")])
    lines = text.splitlines()
    assert lines[0] == ("cannot load libprefill: /src/build/libprefill.so: libcublasLt.so.13: cannot "
                        "open shared object file: No such file or directory")
    assert "also failed: /src/build-old/libprefill.so: wrong ELF class" in text
    assert "pip install nvidia-cublas" in text and "LD_LIBRARY_PATH" in text
    assert "not found: /pkg/lib/libprefill.so" in text and "pip install ." in text


def test_user_error_line_names_the_file():
    from pyprefill.cli import user_error_line
    assert user_error_line(FileNotFoundError(2, "No such file or directory", "a/b.gguf")) == \
        "a/b.gguf: No such file or directory"
    assert user_error_line(ValueError("bad\nsecond line")) == "ValueError: bad (...)"


@pytest.mark.parametrize("exc,rc,line", [(KeyboardInterrupt(), 130, "pyprefill check: interrupted"),
                                         (MemoryError(), 1, "pyprefill check: MemoryError: ")])
def test_interrupts_and_host_memory_are_one_line(monkeypatch, capsys, exc, rc, line):
    import pyprefill.cli as cli

    def boom(args):
        raise exc
    monkeypatch.setattr(cli, "cmd_check", boom)
    assert cli.main(["check"]) == rc
    assert capsys.readouterr().err.strip() == line.strip()


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only user-input errors are shortened: an unexpected exception type propagates."""
    import pyprefill.cli as cli

    def bug(args):
        raise KeyError("internal")
    monkeypatch.setattr(cli, "cmd_check", bug)
    with pytest.raises(KeyError):
        cli.main(["check"])


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="no sysfs (a place no one may write, root included)")
def test_unwritable_outputs_are_one_line(capsys):
    _fails_in_one_line(capsys, ["synth", "--model", "qwen3-tiny", "-o", "/sys/x.gguf", "-q"],
                       "/sys/x.gguf: Permission denied")
    _fails_in_one_line(capsys, ["demo", "--length", "4", "--dir", "/sys/pyprefill-demo"],
                       "/sys/pyprefill-demo: ")     # EPERM from mkdir on sysfs


def test_run_prompt_builds_the_tokenizer_once(tiny_gguf, monkeypatch, capsys):
    """--prompt tokenizes, and (with a GPU) decodes the reply, with one Tokenizer build."""
    pytest.importorskip("regex", reason="the `tokenizer` extra (regex) is not installed")
    from pyprefill import core
    from pyprefill.tokenizer import Tokenizer
    builds = []
    real = Tokenizer.from_gguf.__func__

    def counting(cls, path):
        builds.append(path)
        return real(cls, path)
    monkeypatch.setattr(Tokenizer, "from_gguf", classmethod(counting))
    rc = main(["run", tiny_gguf, "--prompt", "Hello world", "--n-predict", "2"])
    assert rc == (0 if core.device_count() else 1)
    assert builds == [tiny_gguf]
    if rc == 0:
        assert "text: " in capsys.readouterr().out
