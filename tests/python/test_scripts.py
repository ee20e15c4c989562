"""The scripts a newcomer and a GPU machine run (CPU): scripts/device-check.sh's parts cover the
pytest suite exactly once and keep every file that measures the device's free memory in the part
that runs alone; its --help and option errors work without a GPU; scripts/build.sh shows the
build's steps and, on failure, the compiler's error; scripts/test_summary.py counts and groups
what ctest and pytest reported."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "python"
DEVICE_CHECK = ROOT / "scripts" / "device-check.sh"


def _bash(*args, env=None, cwd=ROOT, timeout=120):
    return subprocess.run(["bash", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def _parts() -> list[tuple[str, str, str, str]]:
    r = _bash(DEVICE_CHECK, "--list-parts")
    assert r.returncode == 0, r.stderr
    rows = [tuple(line.split("\t")) for line in r.stdout.splitlines() if line.strip()]
    assert rows and all(len(row) == 4 for row in rows), r.stdout
    return rows


# ------------------------------------------------------------------------ device-check.sh

def test_device_check_is_bash_clean_and_has_help():
    assert _bash("-n", DEVICE_CHECK).returncode == 0
    r = _bash(DEVICE_CHECK, "--help")
    assert r.returncode == 0, r.stderr
    for word in ("--part", "--list-parts", "--long", "--soak=N", "--no-sanitizer", "--no-bench",
                 "PART_BUDGET_S", "memcheck", "racecheck", "initcheck", "synccheck", "bench"):
        assert word in r.stdout, word
    for n in range(1, 15):
        assert re.search(rf"^\s*{n} \S", r.stdout, re.M), f"part {n} missing from --help"


@pytest.mark.parametrize("argv, words", [(["--bogus"], "unknown option --bogus"),
                                         (["--part", "15"], "no part '15'"),
                                         (["--part"], "--part needs")])
def test_device_check_rejects_bad_arguments_before_any_work(argv, words):
    r = _bash(DEVICE_CHECK, *argv)
    assert r.returncode == 2 and words in r.stderr, r.stdout + r.stderr


def test_every_test_file_is_in_exactly_one_part():
    """The union of parts 1-4 is the suite: each tests/python/test_*.py is listed, and a file
    split between processes (by -k and --pf-shard) has its tests selected exactly once. Checked
    on the test ids pytest collects for each listed selection."""
    rows = _parts()
    by_file: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for part, f, k, shard in rows:
        assert part in {"1", "2", "3", "4"}, part
        by_file[f].append((part, k, shard))
    files = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert sorted(by_file) == files, set(files) ^ set(by_file)

    def collect(f, k="", shard=""):
        args = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                str(TESTS / f)]
        args += ["-k", k] if k else []
        args += [f"--pf-shard={shard}"] if shard else []
        r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert r.returncode in (0, 5), r.stdout[-2000:] + r.stderr[-2000:]   # 5: none collected
        return [line for line in r.stdout.splitlines() if "::" in line]

    for f, sel in by_file.items():
        if len(sel) == 1:
            assert sel[0][1:] == ("", ""), f"{f} is listed once but only in part (k={sel[0][1]!r}, shard={sel[0][2]!r})"
            continue
        whole = collect(f)
        picked = [t for _, k, shard in sel for t in collect(f, k, shard)]
        assert len(picked) == len(set(picked)), f"{f}: a test is selected twice"
        assert sorted(picked) == sorted(whole), f"{f}: {len(set(whole) - set(picked))} tests in no part"


def test_memory_measuring_files_run_alone():
    """A file that reads the device's free memory (ctx.memory()), or that starts a child running
    such a file, is in part 4, whose files run one after another in one process."""
    parts = {f: part for part, f, _, _ in _parts()}
    alone = {f for f, p in parts.items() if p == "4"}
    measuring = {p.name for p in TESTS.glob("test_*.py")
                 if p.name != Path(__file__).name and ".memory()" in p.read_text()}
    assert measuring and measuring <= alone, measuring - alone
    for p in TESTS.glob("test_*.py"):
        if p.name == Path(__file__).name:
            continue
        text = p.read_text()
        if "subprocess" in text or "_run_child" in text:
            for other in measuring:
                if other != p.name and other in text:
                    assert p.name in alone, f"{p.name} runs {other} in a child but is not in part 4"
    assert "test_gemm_lt.py" in alone          # its child reruns test_gemm_path's allocation tests
    r = _bash(DEVICE_CHECK, "--help")
    assert "one after another in one process" in r.stdout


def test_shard_option_splits_a_selection(tmp_path):
    (tmp_path / "test_x.py").write_text("import pytest\n@pytest.mark.parametrize('i', range(7))\n"
                                        "def test_a(i):\n    pass\n")
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    ids = []
    for k in range(3):
        r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                            "-p", "no:cacheprovider", f"--pf-shard={k}/3", "test_x.py"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
        ids.append([line for line in r.stdout.splitlines() if "::" in line])
    assert [len(x) for x in ids] == [3, 2, 2]
    assert sorted(sum(ids, [])) == sorted(f"test_x.py::test_a[{i}]" for i in range(7))
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                        "no:cacheprovider", "--pf-shard=3/3", "test_x.py"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode != 0 and "expected K/N" in r.stdout + r.stderr


# ------------------------------------------------------------------------ build.sh

FAKE_CMAKE = r"""#!/usr/bin/env bash
# configure: succeeds; --build: two steps, the second fails as nvcc does (FAKE_BUILD=fail)
if [ "$1" = "--build" ]; then
  echo "[1/3] Building CUDA object CMakeFiles/prefill.dir/cuda/gdn.cu.o"
  if [ "${FAKE_BUILD:-ok}" = fail ]; then
    echo "[2/3] Building CUDA object CMakeFiles/prefill.dir/cuda/rows.cu.o"
    echo "FAILED: CMakeFiles/prefill.dir/cuda/rows.cu.o"
    echo "/src/cuda/rows.cu(12): error: identifier \"undefined_name\" is undefined"
    echo "1 error detected in the compilation of \"/src/cuda/rows.cu\"."
    echo "ninja: build stopped: subcommand failed."
    exit 1
  fi
  echo "[3/3] Linking CUDA shared library libprefill.so"
  exit 0
fi
mkdir -p "$4"
echo "CMAKE_CUDA_ARCHITECTURES:STRING=90a" > "$4/CMakeCache.txt"
echo "-- Configuring done"
"""


@pytest.fixture
def fake_cmake(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cmake").write_text(FAKE_CMAKE)
    (bin_dir / "cmake").chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("outcome", ["ok", "fail"])
def test_build_shows_steps_and_the_compilers_error(fake_cmake, tmp_path, outcome):
    env = {"PATH": f"{fake_cmake}{os.pathsep}{os.environ['PATH']}", "BUILD_DIR": str(tmp_path / "b"),
           "FAKE_BUILD": outcome}
    r = _bash("-c", "set -euo pipefail; . scripts/build.sh; pf_build OFF", env=env)
    assert "[1/3] Building CUDA object CMakeFiles/prefill.dir/cuda/gdn.cu.o" in r.stdout
    assert "building for CUDA architectures 90a" in r.stdout
    if outcome == "ok":
        assert r.returncode == 0, r.stdout + r.stderr
        assert "libprefill: built in" in r.stdout
    else:
        assert r.returncode == 1
        assert "the build failed" in r.stderr
        assert 'rows.cu(12): error: identifier "undefined_name" is undefined' in r.stderr
        assert "FAILED: CMakeFiles/prefill.dir/cuda/rows.cu.o" in r.stderr
        assert (tmp_path / "b" / "build.log").is_file()


def test_scripts_are_bash_clean():
    for name in ("build.sh", "demo.sh", "test.sh", "env.sh", "device-check.sh", "test-wheel.sh"):
        assert _bash("-n", ROOT / "scripts" / name).returncode == 0, name


# ------------------------------------------------------------------------ test.sh's live view

CTEST_V = """\
UpdateCTestConfiguration  from :/b/DartConfiguration.tcl
Test project /b
Constructing a list of tests
Checking test dependency graph end
test 3
    Start 3: api_checks

3: Test command: /b/tests/test_api
3: Working Directory: /b/tests
3: Test timeout computed to be: 10000000
3: test_api: 0 device(s), 0 failure(s)
1/2 Test #3: api_checks .......................   Passed    0.07 sec
test 5
    Start 5: pytest

5: Test command: /v/python "-m" "pytest" "-q" "-rs" "/w/tests/python"
5: Working Directory: /b/tests
5: Environment variables: 
5:  PYPREFILL_LIBRARY=/b/libprefill.so
5:  PYTHONUNBUFFERED=1
5: Environment variable modifications: 
5:  PYTHONPATH=path_list_prepend:/w
5: Test timeout computed to be: 3000
5: ....ss....  [ 10%]
5:   an indented line of a test's output
2/2 Test #5: pytest ...........................   Passed   41.60 sec

The following tests passed:
\tapi_checks
\tpytest

100% tests passed, 0 tests failed out of 2
"""


def test_ctest_progress_shows_the_tests_output_and_hides_the_preamble():
    r = subprocess.run(["awk", "-f", str(ROOT / "scripts" / "ctest-progress.awk")], input=CTEST_V,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "    Start 3: api_checks",
        "      test_api: 0 device(s), 0 failure(s)",
        "1/2 Test #3: api_checks .......................   Passed    0.07 sec",
        "    Start 5: pytest",
        "      ....ss....  [ 10%]",
        "        an indented line of a test's output",
        "2/2 Test #5: pytest ...........................   Passed   41.60 sec",
        "100% tests passed, 0 tests failed out of 2"]
    assert "awk -f scripts/ctest-progress.awk" in (ROOT / "scripts" / "test.sh").read_text()


def test_a_run_names_the_models_it_keeps(tmp_path):
    """conftest.py ends a run with the place and size of the synthetic models kept for the next
    one ($PF_TEST_TMP), and says nothing when there are none."""
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    cache = tmp_path / "cache"
    env = dict(os.environ, PF_TEST_TMP=str(cache),
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "python"), str(ROOT)]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
           "--rootdir", str(tmp_path), str(tmp_path / "test_one.py")]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0 and "synthetic models kept" not in r.stdout, r.stdout + r.stderr
    cache.mkdir()
    (cache / "m.gguf").write_bytes(bytes(3 << 20))
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert f"synthetic models kept for the next run: {cache} (1 files, 3 MiB;" in r.stdout, r.stdout


# ------------------------------------------------------------------------ test_summary.py

CTEST_LOG = """\
    Start 1: header_c99
1/4 Test #1: header_c99 .......................   Passed    0.01 sec
4/4 Test #4: wgmma_layout .....................***Skipped   0.01 sec
2/4 Test #2: pytest ...........................   Passed   70.00 sec
3/4 Test #3: api_checks .......................***Failed    0.10 sec
"""
LAST_TEST_LOG = """\
"wgmma_layout" start time: Dec 02 01:39 UTC
Output:
----------------------------------------------------------
no CUDA device: skipped
<end of output>
"pytest" start time: Dec 02 01:39 UTC
Output:
----------------------------------------------------------
..ss
SKIPPED [10] ../../tests/python/test_a.py:59: no CUDA device: no NVIDIA driver
SKIPPED [2] ../../tests/python/test_b.py: no CUDA device: no NVIDIA driver
SKIPPED [1] ../../tests/python/test_c.py:9: set PF_LONG_CONTEXT=1
5 passed, 13 skipped in 70.33s (0:01:10)
<end of output>
"""


def test_summary_counts_and_groups_skip_reasons(tmp_path):
    (tmp_path / "Testing" / "Temporary").mkdir(parents=True)
    (tmp_path / "ctest.log").write_text(CTEST_LOG)
    (tmp_path / "Testing" / "Temporary" / "LastTest.log").write_text(LAST_TEST_LOG)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_summary.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("ctest: 2 passed, 1 failed, 1 skipped (wgmma_layout: no CUDA device: "
                        "skipped) -- failed: api_checks")
    assert "pytest: 5 passed, 0 failed, 13 skipped" in lines
    assert any(re.match(r"^\s+12 in\s+2 files: no CUDA device: no NVIDIA driver$", x) for x in lines), lines
    assert any(re.match(r"^\s+1 in\s+1 file : set PF_LONG_CONTEXT=1$", x) for x in lines), lines


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_readme_commands_exist():
    """The README's two commands are the scripts here, and they name what they do."""
    readme = (ROOT / "README.md").read_text()
    for cmd in ("bash scripts/demo.sh", "bash scripts/test.sh"):
        assert cmd in readme
    assert "pyprefill demo" in (ROOT / "scripts" / "demo.sh").read_text()


def test_readme_names_what_exists():
    """The README's install line names the extras pyproject.toml defines; its CMakeLists asks for
    this version of the package; the tiny presets it offers for a machine without a GPU exist."""
    readme = (ROOT / "README.md").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'pip install -v "\.\[([\w,]+)\]"', readme)
    assert m, "no one-command install with the extras in the README"
    for extra in m.group(1).split(","):
        assert re.search(rf"^{extra} = \[", pyproject, re.M), extra
    header = (ROOT / "include" / "prefill.h").read_text()
    major_minor = ".".join(re.search(rf"#define PF_VERSION_{p} (\d+)", header).group(1)
                           for p in ("MAJOR", "MINOR"))
    for doc in (readme, (ROOT / "docs" / "usage.md").read_text(),
                (ROOT / "tests" / "consumer" / "CMakeLists.txt").read_text()):
        assert re.findall(r"find_package\(prefill ([\d.]+)", doc) == [major_minor]
    from pyprefill.formats.synth import PRESETS
    tiny = re.findall(r"`(qwen3\w*-tiny[\w-]*)`", readme)
    assert len(tiny) >= 4 and all(t in PRESETS for t in tiny), tiny
    assert {p for p in PRESETS if "tiny" in p} <= set(tiny)


# ------------------------------------------------------------------------ the repository's docs

PENDING_DOCS = {"docs/tuning.md"}   # written with the change that makes the switches tuning fields


def test_docs_point_inside_the_repository():
    """README.md, NOTES.md, docs/ and the code's comments cite only files of this repository:
    every relative Markdown link resolves, and nothing names the design notes, spec or benchmark
    files that once lived outside it."""
    r = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        pytest.skip("not a git checkout")
    outside = re.compile(r"DESIGN\.md|BENCHMARKS\.md|METHOD\.md|shared/|spec §|spec G\d")
    for name in r.stdout.splitlines():
        if name == "tests/python/test_scripts.py" or not name.endswith(
                (".md", ".py", ".cu", ".cuh", ".h", ".cpp", ".c", ".sh", ".txt", ".toml")):
            continue
        if not (ROOT / name).is_file():  # a copy whose git index predates its files (the device's)
            continue
        text = (ROOT / name).read_text(errors="replace")
        m = outside.search(text)
        assert m is None, f"{name} points outside the repository: {m.group(0)!r}"
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)", doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path = (doc.parent / target).resolve()
            rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
            assert path.exists() or rel in PENDING_DOCS, f"{doc.name}: broken link {target}"


# ------------------------------------------------------------------------ sass_stats.py

SASS = """
Fatbin elf code:
================
arch = sm_90a
\tcode for sm_90a
\t\tFunction : _ZN2pf4gdnc12_GLOBAL__N_121gdn_chunk_prep_kernelILb1ELi2EEEvNS0_8PrepArgsE
\t.headerflags\t@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                        /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 IMAD.MOV.U32 R2, RZ, RZ, R3 ;                 /* 0x000000ffff027224 */
        /*0020*/                   STL.64 [R1], R4 ;                             /* 0x0000000401007387 */
        /*0030*/                   IMAD R5, R6, 0x4, R7 ;                        /* 0x0000000406057824 */
        /*0040*/                   EXIT ;                                        /* 0x000000000000794d */
\t\t..........
\t\tFunction : _ZN2pf11demo_kernelEv
        /*0000*/                   EXIT ;                                        /* 0x000000000000794d */
"""


def _load_script(name: str):
    """scripts/NAME.py as a module (its main does not run)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sass_stats():
    return _load_script("sass_stats")


def test_sass_stats_counts_kernels_and_local_memory():
    """scripts/sass_stats.py: kernels split at each Function line, predicate guards dropped,
    spills (STL) counted, names shortened to the kernel and its literal template arguments,
    and a base build's count set beside each kernel's."""
    m = _sass_stats()
    k = m.parse_sass(SASS)
    prep = "_ZN2pf4gdnc12_GLOBAL__N_121gdn_chunk_prep_kernelILb1ELi2EEEvNS0_8PrepArgsE"
    assert k[prep] == ["LDC", "IMAD.MOV.U32", "STL.64", "IMAD", "EXIT"]
    assert k["_ZN2pf11demo_kernelEv"] == ["EXIT"]
    s = m.stats(k[prep])
    assert s["count"] == 5 and s["local"] == 1 and s["top"][0] == ("IMAD", 2)
    assert m.short(prep) == "gdn_chunk_prep_kernel<1, 2>"
    assert m.short("_ZN2pf11demo_kernelEv") == "demo_kernel"
    base = {prep: ["EXIT"] * 7}
    lines = m.report(k, base, "prep", 3)
    assert len(lines) == 1
    assert lines[0].startswith("gdn_chunk_prep_kernel<1, 2>: 5 instructions (base 7, -2), local memory ops 1")


def test_sass_stats_without_cuobjdump_says_how_to_get_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CUOBJDUMP"}
    env["PATH"] = str(tmp_path)             # no cuobjdump on it
    # -S: no site-packages either (where the wheel would put it)
    r = subprocess.run([sys.executable, "-S", str(ROOT / "scripts" / "sass_stats.py"), "x.o"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "pip install nvidia-cuda-cuobjdump" in r.stderr, (r.returncode, r.stderr)


def test_profile_model_sorts_kernels_into_families():
    """scripts/profile_model.py: the names its run printed (session 48) land in their families,
    and the summary's shares and top kernels follow the times given."""
    m = _load_script("profile_model")
    names = {
        "void pf::(anonymous namespace)::wgmma_attn_kernel<256, 80>(pf::(anonymous namespace)::Wgmm": "attention",
        "void pf::gdnc::(anonymous namespace)::gdn_chunk_state_wg_kernel<true, 1>(pf::gdnc::StateAr": "gdn",
        "void pf::(anonymous namespace)::conv1d_silu_l2norm_kernel<4, 4>(pf::(anonymous namespace):": "gdn",
        "nvjet_sm90_hss_256x128_64x4_1x2_h_bz_coopA_TNT": "gemm",
        "void pf::(anonymous namespace)::swiglu_f16_reg_kernel<10>(pf::(anonymous namespace)::Swigl": "other",
        "void pf::(anonymous namespace)::cast_rows_f16_kernel<true>(pf::(anonymous namespace)::Cast": "other",
        "Memset (Unknown)": "copy",
        "Memcpy DtoH (Device -> Pageable)": "copy",
    }
    for name, fam in names.items():
        assert m.family(name) == fam, name
    lines = m.summarize({"nvjet_a": (30.0, 3), "wgmma_attn_kernel<128, 176>": (10.0, 1), "rms": (60.0, 2)}, top=2)
    assert lines[0] == "   kernel time 100.0 ms; families: other 60.0 ms (60%), gemm 30.0 ms (30%), attention 10.0 ms (10%)"
    assert len(lines) == 3 and "60.00 ms" in lines[1] and "rms" in lines[1] and "nvjet_a" in lines[2]


def test_profile_model_help_and_bad_arguments_need_no_gpu():
    script = str(ROOT / "scripts" / "profile_model.py")
    r = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--models" in r.stdout and "torch.profiler" not in r.stderr, r.stderr
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv, words in ((["-T", "0"], "-T must be >= 1 (got 0)"),
                        (["--chunk", "-1"], "--chunk must be >= 0 (got -1)"),
                        (["--models", "qwen35-4b", "qwen9-1b"], "--models: no preset qwen9-1b (presets: "),
                        (["--mix", "q3_k"], "--mix: no mix q3_k (mixes: ")):
        r = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 2 and words in r.stderr, (argv, r.stderr)
