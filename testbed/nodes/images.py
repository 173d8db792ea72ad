"""``testbed image build``: the CPU worker image, built offline (no registry needed).

Three cached steps, each keyed by its content, so a second build with nothing changed
only compares keys, and a change to the workloads only redoes the last (seconds):

1. base: a Debian bookworm root filesystem by ``debootstrap --variant=minbase`` with
   python3 (3.11, matching the CPU torch wheel), iproute2, iputils-ping and iperf3;
2. runtime: that root filesystem with a venv at /opt/testbed/venv holding torch (the
   version this host runs), numpy and scikit-learn, installed in a chroot from wheels that
   pip fetched on the host (from the host's own index configuration, so a local torch
   wheel is used as it is), then ``docker import``-ed as ``testbed/worker-base:KEY``;
3. the project: ``FROM`` that image, the ``workloads`` package copied into the venv,
   tagged ``testbed/worker:cpu`` and labelled with the combined key.

Users with a registry can build images/worker/Dockerfile instead (same layout).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable

from testbed.common.errors import TestbedError
from testbed.common.owners import make_dirs
from testbed.common.procs import run_tool
from testbed.nodes.docker.api import client, docker_sdk

DEFAULT_TAG = "testbed/worker:cpu"
BASE_REPO = "testbed/worker-base"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "iproute2", "iputils-ping", "iperf3", "procps")
PYTHON_PACKAGES = ("numpy", "scikit-learn")
VENV = "/opt/testbed/venv"
SITE = f"{VENV}/lib/python3.11/site-packages"
ENV_PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CACHE_ENV = "TESTBED_IMAGE_CACHE"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, "/var/cache/testbed/images"))


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def torch_requirement() -> str:
    """The torch the ranks inside containers must run: the host's, so results compare."""
    try:
        from importlib.metadata import version

        return f"torch=={version('torch').split('+')[0]}"
    except Exception:
        return "torch==2.13.0"


def workloads_dir() -> Path:
    import workloads

    return Path(workloads.__file__).resolve().parent


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def _base_rootfs(say: Callable[[str], None]) -> Path:
    key = _key(SUITE, MIRROR, PACKAGES)
    root = cache_dir() / f"rootfs-{key}"
    if (root / "etc" / "debian_version").exists():
        say(f"base root filesystem cached ({root})")
        return root
    if shutil.which("debootstrap") is None:
        raise TestbedError("debootstrap is not installed", "apt-get install debootstrap")
    tmp = Path(tempfile.mkdtemp(prefix="rootfs-", dir=cache_dir()))
    say(f"debootstrap {SUITE} (minbase + {', '.join(PACKAGES)}); about a minute")
    t = time.monotonic()
    run_tool(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp), MIRROR],
         "debootstrap")
    tmp.rename(root)
    say(f"debootstrap took {time.monotonic() - t:.0f} s")
    return root


def _wheels(say: Callable[[str], None]) -> Path:
    reqs = (torch_requirement(), *PYTHON_PACKAGES)
    key = _key(reqs)
    d = cache_dir() / f"wheels-{key}"
    if (d / ".complete").exists():
        return d
    make_dirs(d, CACHE_ENV)
    say(f"pip download {' '.join(reqs)} (cp311 wheels)")
    plats = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
    argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.11",
            "--implementation", "cp", "-d", str(d)]
    for p in plats:
        argv += ["--platform", p]
    run_tool([*argv, *reqs], "pip download of the worker's Python packages", cwd="/")
    (d / ".complete").write_text("\n".join(sorted(p.name for p in d.glob("*.whl"))) + "\n")
    return d


def _runtime_image(dc, base: Path, wheels: Path, say: Callable[[str], None]) -> str:
    docker = docker_sdk()
    names = sorted(p.name for p in wheels.glob("*.whl"))
    tag = f"{BASE_REPO}:{_key(base.name, names, VENV)}"
    try:
        dc.images.get(tag)
        say(f"runtime image cached ({tag})")
        return tag
    except docker.errors.ImageNotFound:
        pass
    work = Path(tempfile.mkdtemp(prefix="runtime-", dir=cache_dir()))
    try:
        say("copying the base root filesystem")
        run_tool(["cp", "-a", f"{base}/.", str(work)], "copying the base root filesystem")
        shutil.copytree(wheels, work / "tmp" / "wheels")
        say(f"installing {len(names)} wheels into {VENV} (chroot)")
        run_tool(["chroot", str(work), "python3", "-m", "venv", VENV], "python3 -m venv in the image")
        run_tool(["chroot", str(work), f"{VENV}/bin/pip", "install", "-q", "--no-index", "--no-compile",
              "--find-links", "/tmp/wheels", *[f"/tmp/wheels/{n}" for n in names]], "pip install in the image",
             env={"PATH": ENV_PATH, "HOME": "/root", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        shutil.rmtree(work / "tmp" / "wheels")
        say(f"docker import as {tag}")
        tar = subprocess.Popen(["tar", "-C", str(work), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None  # stdout=PIPE
        try:
            img = dc.api.import_image_from_stream(tar.stdout, repository=tag.split(":")[0], tag=tag.split(":")[1],
                                                  changes=[f"ENV PATH={ENV_PATH}", 'ENTRYPOINT ["sleep", "infinity"]'])
        finally:
            tar.stdout.close()
            tar.wait()
        if tar.returncode != 0 or "error" in str(img).lower():
            raise TestbedError(f"docker import failed: {str(img)[-500:]}")
        return tag
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build(tag: str = DEFAULT_TAG, say: Callable[[str], None] = lambda m: None, force: bool = False) -> dict:
    """Build ``tag`` offline; returns {"tag", "id", "cached", "seconds", "key"}."""
    docker = docker_sdk()
    if os.geteuid() != 0:
        raise TestbedError("building the worker image needs root (debootstrap, chroot)", "run with sudo")
    t0 = time.monotonic()
    dc = client()
    make_dirs(cache_dir(), CACHE_ENV)
    src = workloads_dir()
    wheels_key = _key(torch_requirement(), PYTHON_PACKAGES)
    key = _key(SUITE, MIRROR, PACKAGES, wheels_key, _tree_hash(src))
    if not force:
        try:
            img = dc.images.get(tag)
            if img.labels.get("testbed.content") == key:
                say(f"{tag} is up to date (content key {key})")
                return {"tag": tag, "id": img.id, "cached": True, "seconds": time.monotonic() - t0, "key": key}
        except docker.errors.ImageNotFound:
            pass
    base = _base_rootfs(say)
    runtime = _runtime_image(dc, base, _wheels(say), say)
    say(f"adding the workloads package -> {tag}")
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tar:
        dockerfile = (f"FROM {runtime}\nCOPY workloads {SITE}/workloads\n"
                      f'LABEL testbed.content="{key}"\nENV PATH={ENV_PATH}\nENTRYPOINT ["sleep", "infinity"]\n').encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        tar.add(str(src), arcname="workloads", filter=lambda ti: None if "__pycache__" in ti.name else ti)
    ctx.seek(0)
    try:
        img, _ = dc.images.build(fileobj=ctx, custom_context=True, tag=tag, network_mode="none", rm=True,
                                 forcerm=True, pull=False)
    except docker.errors.BuildError as e:
        raise TestbedError(f"building {tag} failed: {e}") from None
    return {"tag": tag, "id": img.id, "cached": False, "seconds": time.monotonic() - t0, "key": key}


def status(tag: str = DEFAULT_TAG) -> tuple[bool, str]:
    """Whether ``tag`` exists on the local engine (for `testbed doctor`)."""
    try:
        docker = docker_sdk()
        dc = docker.from_env(timeout=10)
        try:
            img = dc.images.get(tag)
            return True, f"{tag} ({img.short_id}, {img.attrs.get('Size', 0) / 1e6:.0f} MB)"
        finally:
            dc.close()
    except TestbedError as e:
        return False, f"{e.message} ({e.hint})"
    except Exception as e:  # engine down or image missing: say which
        return False, f"{tag}: {type(e).__name__}: {str(e)[:120]}"
