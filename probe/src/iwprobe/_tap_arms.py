"""The arms of either method behind one surface: which to use, and removing a record of either.

(:mod:`iwprobe._tap_bpf` is imported only where a BPF method is used: every ``iwprobe``
command builds the ``tap`` parser, which reads :data:`METHODS` from here.)

:mod:`iwprobe._tap_bpf` (one ``sock_ops`` program) and :mod:`iwprobe._tap_rules` (nftables,
policy routes, the sysctl) each install, renew and remove their own arms; this module picks one
(``--arms``), and removes or reads whatever ``tap-installed.json`` records -- ``disable``,
``cleanup`` and an agent's start do not know which method the last agent used.
"""

from __future__ import annotations

import logging
from typing import Optional, Protocol

from ._tap_rules import ArmsError, Installed, NftArms, TapPlan, load_installed
from ._tap_rules import lease_remaining_s as nft_lease_remaining_s
from ._tap_rules import remove as nft_remove

log = logging.getLogger("iwprobe.tap")

#: ``--arms`` choices.
METHODS = ("auto", "bpf", "nft")


class Arms(Protocol):
    """What the agent holds: install a plan, keep its lease, remove it."""

    @property
    def method(self) -> str: ...

    def install(self, plan: TapPlan, state_path: str) -> Installed: ...

    def renew_lease(self, plan: TapPlan) -> None: ...

    def remove(self, state_path: str, plan: Optional[TapPlan] = None) -> list[str]: ...


class AutoArms:
    """``--arms auto``: the BPF program where this kernel and the agent's capabilities allow it
    (:mod:`iwprobe._tap_bpf`), else nftables and policy routes (:mod:`iwprobe._tap_rules`);
    decided at the first install and said once in the log."""

    def __init__(self, cgroup: Optional[str]) -> None:
        from ._tap_bpf import BpfArms

        self._bpf = BpfArms(cgroup)
        self.chosen: Optional[Arms] = None

    @property
    def method(self) -> str:
        return self.chosen.method if self.chosen is not None else "auto"

    def install(self, plan: TapPlan, state_path: str) -> Installed:
        if self.chosen is None:
            try:
                installed = self._bpf.install(plan, state_path)
            except ArmsError as error:
                log.warning("the BPF arms are not available here (%s): using nftables and policy routes", error)
                self.chosen = NftArms()
            else:
                self.chosen = self._bpf
                return installed
        return self.chosen.install(plan, state_path)

    def renew_lease(self, plan: TapPlan) -> None:
        if self.chosen is None:
            raise ArmsError("no arms installed")
        self.chosen.renew_lease(plan)

    def remove(self, state_path: str, plan: Optional[TapPlan] = None) -> list[str]:
        if self.chosen is not None:
            return self.chosen.remove(state_path, plan)
        return remove(state_path, plan)


def make_arms(method: str, cgroup: Optional[str] = None) -> Arms:
    if method == "bpf":
        from ._tap_bpf import BpfArms

        return BpfArms(cgroup)
    if method == "nft":
        return NftArms()
    if method == "auto":
        return AutoArms(cgroup)
    raise ValueError(f"unknown arms method {method!r}")


def remove(state_path: str, plan: Optional[TapPlan] = None) -> list[str]:
    """Remove the arms ``tap-installed.json`` records, of either method (or, without it, the nft
    table and ``plan``'s rules)."""
    installed = load_installed(state_path)
    if installed is not None and installed.method == "bpf":
        from ._tap_bpf import end_lease

        return end_lease(state_path)
    return nft_remove(state_path, plan)


def lease_remaining_s(state_path: str) -> Optional[float]:
    """Seconds the recorded arms stay in force without their agent (``None``: none in force)."""
    installed = load_installed(state_path)
    if installed is not None and installed.method == "bpf":
        from ._tap_bpf import lease_remaining_s as bpf_lease_remaining_s

        return bpf_lease_remaining_s(state_path)
    return nft_lease_remaining_s()
