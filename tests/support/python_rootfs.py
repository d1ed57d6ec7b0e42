"""A Python base image made from this machine, for building mat's Dockerfile where no registry is reachable.

    tar_path = python_rootfs(tmp / "rootfs.tar")     # busybox + this interpreter (+ git) + their libraries
    client.api.import_image_from_file(str(tar_path), repository="mat-test-python", tag="3.11")

The root file system holds busybox's applets as /bin/sh and friends, this interpreter relocated to /usr/local
(its standard library without site-packages, tests or the static libpython), git, and every shared library
these need (and what manylinux wheels expect from the system: libstdc++, librt, ...), found with ldd. It
stands in for `python:3.11-slim` in `docker build --build-arg BASE_IMAGE=...`.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.support.dockerd import busybox_rootfs

SKIPPED_STDLIB = {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "__pycache__"}
LDD_PATH = re.compile(r"(/\S+)")
# What manylinux wheels (pydantic-core, torch, ...) may take from the system, besides libc and libm.
SYSTEM_LIBRARIES = (
    "libstdc++.so.6", "libgcc_s.so.1", "librt.so.1", "libdl.so.2", "libpthread.so.0", "libutil.so.1",
    "libresolv.so.2", "libnss_files.so.2", "libnss_dns.so.2", "libcrypt.so.1", "libz.so.1",
)  # fmt: skip


def python_rootfs(target: Path, extra_binaries: Iterable[Path] = ()) -> Path:
    """Write the root file system described in the module docstring to `target` (a tar) and return it."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    interpreter = Path(sys.executable).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    git = Path(shutil.which("git") or "/usr/bin/git").resolve()
    with tarfile.open(target, "w") as archive:
        copy_members(archive, busybox_rootfs())
        add_dirs(archive, ["usr/local", "usr/local/bin", "usr/local/lib", "usr/lib", "usr/lib64", "usr/bin"])
        archive.add(str(interpreter), f"usr/local/bin/{version}")
        for name in ("python3", "python"):
            add_link(archive, f"usr/local/bin/{name}", version)
        archive.add(str(stdlib), f"usr/local/lib/{version}", filter=stdlib_filter())
        archive.add(str(git), "usr/bin/git")
        templates = Path("/usr/share/git-core/templates")
        if templates.is_dir():
            archive.add(str(templates), "usr/share/git-core/templates")
        wheels = Path("/usr/share/python-wheels")  # Debian's ensurepip takes pip from here
        if wheels.is_dir():
            archive.add(str(wheels), "usr/share/python-wheels")
        for library in shared_libraries([interpreter, git, *native_modules(), *extra_binaries]):
            archive.add(str(library.resolve()), library_member(library))
    return target


def copy_members(archive: tarfile.TarFile, tar_bytes: bytes) -> None:
    """Add every member of the tar in `tar_bytes` to `archive`."""
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as source:
        for member in source.getmembers():
            data = source.extractfile(member) if member.isfile() else None
            archive.addfile(member, data)


def add_dirs(archive: tarfile.TarFile, names: list[str]) -> None:
    for name in names:
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        archive.addfile(info)


def add_link(archive: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    archive.addfile(info)


def stdlib_filter() -> Callable[[tarfile.TarInfo], tarfile.TarInfo | None]:
    """A tarfile filter leaving out site-packages, tests, GUI modules, caches and config-* (libpython.a)."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if any(part in SKIPPED_STDLIB or part.startswith("config-") for part in parts[4:]):
            return None
        return info

    return keep


def native_modules() -> list[Path]:
    """The interpreter's extension modules (lib-dynload) and libpython, whose libraries the image needs."""
    dynload = Path(sysconfig.get_config_var("DESTSHARED") or "")  # the base interpreter's lib-dynload
    modules = (
        sorted(p for p in dynload.glob("*.so") if not p.name.startswith("_tkinter"))
        if dynload.is_dir()
        else []
    )
    libdir = sysconfig.get_config_var("LIBDIR")
    ldlibrary = sysconfig.get_config_var("INSTSONAME") or ""
    if libdir and ldlibrary and (Path(libdir) / ldlibrary).is_file():
        modules.append(Path(libdir) / ldlibrary)
    return modules


def shared_libraries(binaries: list[Path]) -> list[Path]:
    """Every library `ldd` resolves for `binaries`, plus SYSTEM_LIBRARIES, each name once."""
    found: dict[str, Path] = {}
    for binary in binaries:
        listing = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False).stdout
        for line in listing.splitlines():
            match = LDD_PATH.search(line.split("=>")[-1])
            if match and Path(match.group(1)).is_file():
                found.setdefault(Path(match.group(1)).name, Path(match.group(1)))
    for name in SYSTEM_LIBRARIES:
        path = next((p for p in system_library_dirs() if (p / name).is_file()), None)
        if path is not None:
            found.setdefault(name, path / name)
    return list(found.values())


def system_library_dirs() -> list[Path]:
    return [Path(d) for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64")]


def library_member(library: Path) -> str:
    """Where a library goes: the loader at its own path, everything else in the multiarch directory."""
    if library.name.startswith("ld-linux"):
        return f"usr/lib64/{library.name}"
    return f"usr/lib/x86_64-linux-gnu/{library.name}"
