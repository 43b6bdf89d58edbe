"""Whether this host has a TPU chip (import-light: the core and the runners ask it)."""

from __future__ import annotations

from pathlib import Path

# PCI vendor id of Google's TPU chips (what tpu-info and libtpu look for under /sys/bus/pci/devices)
GOOGLE_PCI_VENDOR = "0x1ae0"


def has_tpu(pci_devices: Path = Path("/sys/bus/pci/devices")) -> bool:
    try:
        return any((device / "vendor").read_text().strip() == GOOGLE_PCI_VENDOR for device in pci_devices.iterdir())
    except OSError:
        return False


def compiles_without_running(device: str) -> bool:
    """A ``device: tpu`` entry on this host compiles for its TPU and runs nothing (a runner with
    ``tpu_targets_on_cpu_host``): no traffic sweep, no canary, the load unproven until a TPU host verifies it."""
    return device == "tpu" and not has_tpu()
