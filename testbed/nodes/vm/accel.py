"""QEMU on this host: which accelerator runs a guest (KVM where it works, else TCG), and
the guest kernel arguments that keep TCG's clocks honest."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import read_json
from testbed.nodes.vm.image import cache_dir

QEMU = "qemu-system-x86_64"
TCG_CPU = "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+arat"
"""TCG's CPU model: x86-64-v2 (numpy's baseline) and ARAT. Without ARAT the guest's local
APIC timer may stop in deep idle, and microvm has no HPET to stand in, so the kernel
never switches to high-resolution timers: every netem delay and HTB wake-up then rounds
to a 4 ms tick (measured: 10 ms of delay gave 12 ms). ``-cpu max`` hangs the guest
kernel's TSC calibration on microvm (measured), so it is not used."""

def _accel_cache() -> Path:
    return cache_dir() / "accel.json"


def probe_kvm(kernel: str, initrd: str, timeout: float = 20.0) -> tuple[bool, str]:
    """Whether a guest boots with KVM here: boot the initramfs with ``tb.probe`` and wait
    for its line on the serial port. A host whose KVM cannot run the guest (e.g. a nested
    paravirtual one) stops the guest instead; that is a no."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "/dev/kvm missing or not accessible"
    argv = [QEMU, "-M", "microvm,pit=on,pic=on,rtc=on", "-accel", "kvm", "-cpu", "host", "-m", "256",
            "-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio", "-kernel", kernel, "-initrd", initrd,
            "-append", "console=ttyS0 panic=-1 quiet tb.probe=1"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        out = r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    except OSError as e:
        return False, str(e)
    if "testbed-init: probe ok" in out:
        return True, "a test guest booted with KVM"
    tail = out.strip().splitlines()[-1:] or ["no output"]
    return False, f"a test guest did not boot with KVM ({tail[0][:160]})"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def known_kvm(kernel: str | None = None) -> tuple[bool, str] | None:
    """What the KVM probe found during this host boot (with ``kernel``; None: any), or None."""
    try:
        data = read_json(_accel_cache(), "json", "KVM probe cache")
    except (OSError, ValueError, TestbedError):
        return None
    if not isinstance(data, dict) or data.get("boot") != _boot_id() or \
            (kernel is not None and data.get("kernel") != kernel):
        return None
    return bool(data.get("ok")), str(data.get("detail", ""))


def choose_accel(want: str, kernel: str, initrd: str) -> tuple[str, str | None]:
    """(accel, warning): KVM when asked or when ``auto`` finds it working (result cached
    per host boot), else TCG."""
    if want == "tcg":
        return "tcg", None
    found = known_kvm(kernel)
    if found is None:
        found = probe_kvm(kernel, initrd)
        try:
            _accel_cache().parent.mkdir(parents=True, exist_ok=True)
            _accel_cache().write_text(json.dumps({"boot": _boot_id(), "kernel": kernel, "ok": found[0],
                                                  "detail": found[1]}))
        except OSError:
            pass
    ok, detail = found
    if want == "kvm":
        if not ok:
            raise TestbedError(f"accel: kvm, but {detail}", "use accel: tcg (slow) or auto, or fix KVM on this host")
        return "kvm", None
    if ok:
        return "kvm", None
    return "tcg", f"VM workers run under TCG (software emulation, much slower than KVM): {detail}"


# ---------------------------------------------------------------------- actions


def host_tsc_khz() -> int | None:
    """The host CPU's TSC rate, which a TCG guest's TSC runs at (QEMU reads the host's)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return int(float(line.split(":")[1]) * 1000)
    except (OSError, ValueError):
        pass
    return None


def tcg_clock_args() -> str:
    """Kernel arguments that spare a TCG guest its timer calibration. Under load (several
    guests booting on a few cores) the PIT calibration fails and the boot then hangs
    (measured: 4 of 4 guests booting at once on 2 cores; 0 of 4 with these). A TCG guest's
    TSC is the host's on every vCPU, so it is declared reliable: with 2 vCPUs the guest's
    TSC sync check failed, the clocksource fell back to jiffies, and high-resolution timers
    (netem's delays, HTB's wake-ups) went with it (measured: 10 ms of delay gave 12 ms)."""
    khz = host_tsc_khz()
    if not khz:
        return " no_timer_check tsc=reliable"
    return f" tsc_early_khz={khz} lpj={khz * 1000 // 250} no_timer_check tsc=reliable"
