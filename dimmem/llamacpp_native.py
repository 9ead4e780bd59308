"""llama.cpp compiled for this machine's CPU, preferred over the wheel's wherever dimmem starts a server.

The `xllamacpp` wheel is llama.cpp built for any x86-64 (nothing past AVX2), so on a CPU with AVX-512 and
VNNI its matrix kernels leave half the vector width unused. Built from the same release's source with
`-march=native` it decodes the shipped student faster and answers as it does but for rounding
(BENCHMARKS.md). The build takes minutes (about 15 on 2 cores) and needs cmake and a C++ compiler, so it
is a step of its own, run once:

    make llamacpp-native               # = python -m dimmem.llamacpp_native
    dimmem serve llamacpp --portable   # the wheel's llama.cpp even where a native build is present

It lands in the dimmem cache, keyed by the wheel's version and the CPU's instruction sets: a cache shared
with another kind of machine, or a new wheel, is not used until built again (a build for another CPU could
stop on an illegal instruction).
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from dimmem.errors import DimmemError
from dimmem.paths import built_once, cache_dir, is_built
from dimmem.progress import progress

PACKAGE = "xllamacpp"
# left out of a serving build: llguidance grammars (Rust crates fetched at build time) and TLS for model
# downloads (BoringSSL cloned from git): dimmem's models are local files, and without llguidance a JSON
# Schema becomes llama.cpp's GBNF grammar. CMAKE_ARGS in the environment comes after these (theirs win).
CMAKE_ARGS = "-DLLAMA_LLGUIDANCE=OFF -DLLAMA_BUILD_BORINGSSL=OFF"
TOOLS = {"cmake": "cmake", "c++": "g++"}  # what the build runs -> the Debian package that has it


class NativeBuildError(DimmemError):
    """The build cannot run or failed: the message says why and where its log is."""


def cpu_key() -> str:
    """What `-march=native` depends on: the machine and its CPU's instruction-set flags."""
    flags = platform.processor()
    try:
        found = re.search(r"^(?:flags|Features)\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        found = None
    if found:
        flags = " ".join(sorted(found.group(1).split()))
    return hashlib.sha256(f"{platform.machine()}|{flags}".encode()).hexdigest()[:12]


def _marker() -> tuple[Path, str]:
    """The file a finished build writes last, and the key it is built for."""
    version, cpu = metadata.version(PACKAGE), cpu_key()
    folder = cache_dir() / "llamacpp" / f"{PACKAGE}-{version}-{cpu}"
    return folder / "built-for", f"{PACKAGE}=={version} cpu={cpu}"


def built() -> Path | None:
    """The folder to put on sys.path for the native build, if one is built for this CPU and wheel."""
    marker, key = _marker()
    site = marker.parent / "site"
    whole = is_built(marker, key) and any((site / PACKAGE).glob(f"{PACKAGE}*.so"))  # (not emptied by hand)
    return site if whole else None


def select(portable: bool = False) -> None:
    """Make `import xllamacpp` load the native build when one is built, unless `portable` (or xllamacpp
    is imported already). Call before anything imports it."""
    folder = None if portable or PACKAGE in sys.modules else built()
    if folder is not None and str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def which(module) -> str:
    """'native' when `module` (the imported xllamacpp) is a build of this module's, else 'portable'."""
    return "native" if cache_dir() / "llamacpp" in Path(module.__file__).resolve().parents else "portable"


def build() -> Path:
    """Compile the installed wheel's release for this CPU, once (later calls return at once)."""
    missing = [f"{tool} (apt install {package})" for tool, package in TOOLS.items() if not shutil.which(tool)]
    if missing:
        raise NativeBuildError(
            f"building llama.cpp needs {', '.join(missing)}; the wheel's build still serves"
        )
    marker, key = _marker()
    version = metadata.version(PACKAGE)

    def compile_into(marker: Path) -> None:
        site, partial = marker.parent / "site", marker.parent / "site.partial"
        shutil.rmtree(partial, ignore_errors=True)
        log = marker.parent / "build.log"
        command = [
            *(sys.executable, "-m", "pip", "install", "--verbose", "--no-deps", "--no-cache-dir"),
            *("--no-binary", PACKAGE, "--target", str(partial), f"{PACKAGE}=={version}"),
        ]
        own = f"{CMAKE_ARGS} {os.environ.get('CMAKE_ARGS', '')}".strip()  # the caller's last: theirs win
        env = os.environ | {"CMAKE_ARGS": own, "NPROC": str(os.cpu_count() or 1)}
        print(f"compiling llama.cpp ({PACKAGE} {version}) for this CPU; log: {log}", file=sys.stderr)
        # (cmake's own percentages restart with each of the build's targets: objects compiled are counted)
        with open(log, "w") as out, progress(desc="llama.cpp", unit=" objects compiled") as bar:
            child = subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for line in child.stdout:
                out.write(line)
                if re.match(r"\s*\[\s*\d+%\] Building C", line):
                    bar.update()
            if child.wait():
                out.flush()
                tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
                raise NativeBuildError(
                    f"the llama.cpp build failed (exit {child.returncode}); {log} ends:\n{tail}"
                )
        shutil.rmtree(site, ignore_errors=True)
        partial.rename(site)
        marker.write_text(key + "\n")

    built_once(marker, key, compile_into)
    return marker.parent / "site"


def main(argv: list[str] | None = None) -> int:
    """Build (once) and print where the build is."""
    import argparse
    import json

    from dimmem.errors import run_command

    argparse.ArgumentParser(prog="python -m dimmem.llamacpp_native", description=__doc__).parse_args(argv)

    def run() -> int:
        print(json.dumps({"native": str(build())}))
        return 0

    return run_command("llamacpp-native", run)


if __name__ == "__main__":
    raise SystemExit(main())
