"""Which CPU the native kernels are compiled for: this machine's, or a named cross target.

On x86 the build takes `-march=native`. On 64-bit Arm (Jetson) it spells the -march out
from /proc/cpuinfo's Features instead: the same rule serves the cross targets below, which
name the CPU they are for, and the flags land in the library's digest for all to see.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """A CPU to cross-compile for: the compiler that builds for it ($CXX overrides it)
    and its -march."""

    name: str
    compiler: str
    march: str

    def chosen_compiler(self) -> str:
        return os.environ.get("CXX") or self.compiler


CROSS = "aarch64-linux-gnu-g++"  # Debian/Ubuntu's g++-aarch64-linux-gnu
TARGETS = {
    "aarch64": Target("aarch64", CROSS, "armv8-a"),  # any 64-bit Arm: NEON, no dot products
    # Jetson Orin's Cortex-A78AE: Armv8.2-A with the dot product and half precision extensions
    "jetson-orin": Target("jetson-orin", CROSS, "armv8.2-a+dotprod+fp16"),
}

# Features Linux lists on Armv8.1 (LSE atomics, rounding doubling multiply-add) and v8.2
# (DC CVAP) CPUs: all three there, the base is armv8.2-a, whose instructions the compiler
# may then use anywhere; a CPU short of one gets armv8-a, so it never meets one it lacks.
ARMV82_MARKERS = ("atomics", "asimdrdm", "dcpop")
# Feature(s) -> the -march extension they allow: asimddp the dot product (sdot, MatMulInt8's
# NEON path), fphp and asimdhp half precision arithmetic (scalar and vector).
ARM_EXTENSIONS = ((("asimddp",), "+dotprod"), (("fphp", "asimdhp"), "+fp16"))


def arm_march(features: set[str]) -> str:
    """The -march for a 64-bit Arm CPU whose /proc/cpuinfo Features are `features`."""
    base = "armv8.2-a" if all(f in features for f in ARMV82_MARKERS) else "armv8-a"
    extras = [ext for needs, ext in ARM_EXTENSIONS if all(f in features for f in needs)]
    return base + "".join(extras)


def arm_features(cpuinfo: str) -> set[str]:
    """The first CPU's Features from /proc/cpuinfo text (empty where there is no such line)."""
    for line in cpuinfo.splitlines():
        if line.startswith("Features"):
            return set(line.partition(":")[2].split())
    return set()


def is_arm64() -> bool:
    return platform.machine().lower() in ("aarch64", "arm64")


def native_march_flag(cpuinfo: str) -> str:
    """The -march for this machine: x86's -march=native, Arm's from its Features."""
    if is_arm64():
        return f"-march={arm_march(arm_features(cpuinfo))}"
    return "-march=native"

