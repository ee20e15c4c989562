"""What ptxas made of the kernels, without a GPU: each kernel's SASS instruction count, its local
memory operations (spills, or a register array indexed at run time) and its commonest opcodes,
from cuobjdump's disassembly of a built object or of the library; with --base, the same kernels
of another build beside it.

    python3 scripts/sass_stats.py build/CMakeFiles/prefill.dir/cuda/kernels/gdn/gdn_chunk_prep.cu.o
    python3 scripts/sass_stats.py NEW.o --base OLD.o --kernel prep

The counts are static (a loop body counts once): a guide between device calls, not a profile.
Session 46 checked with it, without a GPU, that the GDN prep kernel's rework no longer held the
network of predicated moves (a run-time index into a register array) that ncu's SASS page had
shown in its slower first form. cuobjdump: $CUOBJDUMP, then PATH, then NVIDIA's wheel in this Python's environment
(`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`, 0.3 + 5 MB: cuobjdump runs nvdisasm;
the CUDA toolkit of the dev machine has neither).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$")
INSTRUCTION = re.compile(r"/\*[0-9a-f]+\*/\s+([^;]*);")
LOCAL = ("LDL", "STL")


def parse_sass(text: str) -> dict[str, list[str]]:
    """{kernel (mangled) name: its instructions' opcodes with modifiers} from cuobjdump -sass
    output; a predicate guard (@P0, @!PT) is dropped. A kernel compiled for several
    architectures keeps its last listing."""
    kernels: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = FUNCTION.match(line)
        if m:
            current = kernels.setdefault(m.group(1), [])
            current.clear()
            continue
        if current is None:
            continue
        m = INSTRUCTION.search(line)
        if m:
            words = m.group(1).split()
            if words and words[0].startswith("@"):
                words = words[1:]
            if words:
                current.append(words[0])
    return kernels


def stats(ops: list[str], top: int = 8) -> dict:
    """Count, local memory operations and the commonest opcodes (modifiers dropped)."""
    base = Counter(op.split(".")[0] for op in ops)
    return {"count": len(ops), "local": sum(base[o] for o in LOCAL),
            "top": base.most_common(top)}


def find_cuobjdump() -> str | None:
    if os.environ.get("CUOBJDUMP"):
        return os.environ["CUOBJDUMP"]
    found = shutil.which("cuobjdump")
    if found:
        return found
    for entry in sys.path:
        for cand in Path(entry).glob("nvidia/cu*/bin/cuobjdump"):
            if os.access(cand, os.X_OK):
                return str(cand)
    return None


def disassemble(path: str, tool: str) -> str:
    # cuobjdump runs nvdisasm: the one beside it first (the wheels install both in one folder)
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(tool).parent), os.environ.get("PATH", "")])}
    r = subprocess.run([tool, "-sass", path], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"sass_stats: {tool} -sass {path} failed: {r.stderr.strip()}")
    return r.stdout


def short(name: str) -> str:
    """A mangled kernel name as its identifier and literal template arguments:
    ..21gdn_chunk_prep_kernelILb1ELi2EEEv.. -> gdn_chunk_prep_kernel<1, 2>."""
    pos = name.find("_ZN") + 3 if name.startswith("_ZN") else 0
    while pos:  # the nested name's parts, each <length><identifier>
        m = re.match(r"\d+", name[pos:])
        if not m:
            break
        ident = name[pos + m.end():pos + m.end() + int(m.group(0))]
        pos += m.end() + len(ident)
        if "kernel" in ident:
            rest = name[pos:]
            args = re.findall(r"L[a-z](\d+)E", rest.split("EEv")[0]) if rest.startswith("I") else []
            return ident + (f"<{', '.join(args)}>" if args else "")
    return name


def report(new: dict[str, list[str]], base: dict[str, list[str]] | None, pattern: str | None,
           top: int) -> list[str]:
    names = [n for n in new if not pattern or re.search(pattern, n)]
    lines = []
    for n in sorted(names):
        s = stats(new[n], top)
        ops = " ".join(f"{op}:{c}" for op, c in s["top"])
        head = f"{short(n)}: {s['count']} instructions"
        if base is not None and n in base:
            b = stats(base[n], top)
            head += f" (base {b['count']}, {s['count'] - b['count']:+d})"
        local = f", local memory ops {s['local']}" if s["local"] else ""
        lines.append(f"{head}{local}\n    {ops}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file", help="a built object (.o) or the library (.so)")
    p.add_argument("--base", help="another build's object: its counts beside each kernel's")
    p.add_argument("--kernel", help="only kernels whose mangled name matches this regex")
    p.add_argument("--top", type=int, default=8, help="opcodes listed per kernel (default 8)")
    a = p.parse_args(argv)
    tool = find_cuobjdump()
    if tool is None:
        print("sass_stats: no cuobjdump (set CUOBJDUMP, or pip install nvidia-cuda-cuobjdump "
              "nvidia-cuda-nvdisasm)",
              file=sys.stderr)
        return 2
    new = parse_sass(disassemble(a.file, tool))
    base = parse_sass(disassemble(a.base, tool)) if a.base else None
    lines = report(new, base, a.kernel, a.top)
    if not lines:
        print(f"sass_stats: no kernel{' matching ' + a.kernel if a.kernel else ''} in {a.file}",
              file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
