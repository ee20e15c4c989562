"""How the package hangs together (CPU): the command-line modules import one way, the three
version numbers agree, and the public names show in dir(pyprefill)."""
import ast
import re
from pathlib import Path

import pyprefill

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "pyprefill"

# cli.py -> the subcommand modules -> _cli_args.py (a leaf)
CLI = "pyprefill.cli"
SUBCOMMANDS = ["pyprefill.model_cli", "pyprefill.bench.cli", "pyprefill.info_cli",
               "pyprefill.formats.synth"]
# pyprefill/formats/ is the file formats' pure Python (the reference reads through it): it never
# imports the binding (_ffi, core, model) or the kernels.
BINDING = ("pyprefill._ffi", "pyprefill.core", "pyprefill.model", "pyprefill.kernels", "pyprefill._errors")
LEAF = "pyprefill._cli_args"


def _imports(module: str, source: str | None = None) -> set[str]:
    """Every pyprefill module `module` imports, at any depth of its code (lazy imports too);
    source: its text (default: the file)."""
    if source is None:
        source = PKG.joinpath(*module.split(".")[1:]).with_suffix(".py").read_text()
    package = module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)    # `from . import cli`
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {n for n in out if n.startswith("pyprefill")}


def test_cli_args_is_a_leaf():
    got = _imports(LEAF)
    assert got <= {"pyprefill.errors", "pyprefill.errors.PrefillError"}, got


def test_subcommands_never_import_the_cli():
    for module in SUBCOMMANDS:
        got = _imports(module)
        assert CLI not in got and not any(n.startswith(CLI + ".") for n in got), (module, got)


def test_formats_never_import_the_binding():
    for path in sorted((PKG / "formats").glob("*.py")):
        module = "pyprefill.formats." + path.stem
        got = _imports(module)
        bad = sorted(n for n in got if n.startswith(BINDING))
        assert not bad, f"{module} imports the binding: {bad}"


def test_the_cli_reaches_its_helpers_through_the_leaf():
    for module in [CLI, *SUBCOMMANDS]:
        got = _imports(module)
        assert any(n.startswith(LEAF) for n in got), f"{module} does not use {LEAF}"
    assert "DeprecatedOption" not in (PKG / "cli.py").read_text()


def test_the_import_check_sees_a_circle():
    """_imports() resolves relative imports at any depth: the old bench/cli.py line and a lazy
    import inside a function, as model_cli.py had, are both seen."""
    assert CLI in _imports("pyprefill.bench.cli", "from ..cli import DeprecatedOption\n")
    assert CLI in _imports("pyprefill.model_cli", "def f():\n    from .cli import DeprecatedOption\n")
    assert CLI in _imports("pyprefill.formats.info", "from .. import cli\n")
    assert LEAF in _imports("pyprefill.bench.cli", "from .._cli_args import flatten\n")


def test_versions_agree():
    """CMake's project VERSION, the header's PF_VERSION_* and pyprefill.__version__ are one
    number (a status added to the header bumps all three); the library reports it too."""
    cmake = re.search(r"project\(pyprefill VERSION (\d+)\.(\d+)\.(\d+)", (ROOT / "CMakeLists.txt").read_text())
    header = (ROOT / "include" / "prefill.h").read_text()
    hv = tuple(int(re.search(rf"#define PF_VERSION_{p} (\d+)", header).group(1)) for p in ("MAJOR", "MINOR", "PATCH"))
    assert tuple(map(int, cmake.groups())) == hv
    assert pyprefill.__version__ == ".".join(map(str, hv))
    try:
        from pyprefill._ffi import lib
    except ImportError:
        return
    assert lib.pf_version() == hv[0] * 10000 + hv[1] * 100 + hv[2]


def test_dir_lists_the_lazy_api():
    """dir(pyprefill) shows Model, Session, Batch, ... (loaded on first use) as well."""
    names = dir(pyprefill)
    for name in ("Model", "Session", "Batch", "Context", "Tokenizer", "GGUFFormatError", "__version__"):
        assert name in names, name
    assert set(pyprefill.__all__) <= set(names)
