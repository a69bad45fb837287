"""iwprobe: the iwscope measurement agent (probe, instrumented origin, tap), stdlib only.

Public surface (everything else, in ``_``-prefixed modules, is private):

* :mod:`iwprobe.wire` -- the wire format shared with the collector (its version:
  :data:`iwprobe.wire.WIRE_VERSION`);
* :mod:`iwprobe.sizes` -- response-size models (``websearch``);
* :func:`fetch`, :class:`FetchResult` -- one measured fetch over a fresh connection;
* :class:`ConnectionCapture`, :class:`Packet`, :func:`capture_status` -- one connection's
  packets (``AF_PACKET``, root); :func:`infer`, :class:`Inference` -- the server's initial
  window from them; :func:`census`, :class:`CensusResult` -- the IW of any HTTP(S) server;
* :func:`read_tcp_info`, :func:`parse_tcp_info` -- ``TCP_INFO`` by the kernel's length;
* :class:`Origin`, :class:`OriginConfig`, :class:`RoutePlan`, :func:`setup_routes` -- the origin;
  :class:`Arm`, :func:`parse_arms` -- its IW arms (``3,10,10p,32,learned``);
* :class:`Spool`, :class:`SpoolFull`, :class:`Uploader` -- the durable journal and its upload;
* :class:`ProbeAgent` -- the ``iwprobe run`` daemon; :class:`CollectorClient`,
  :class:`CollectorError` -- JSON to and from the collector;
* :data:`BACKGROUND_WARMUP_RTTS` -- round trips a background flow runs alone before a round's
  short flows start (the lab sizes its fairness plans' background flows with it).

Names load lazily, so ``import iwprobe.wire`` (what the collector does) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "fetch": "_fetch",
    "FetchResult": "_fetch",
    "ConnectionCapture": "_capture",
    "Packet": "_capture",
    "capture_status": "_capture",
    "infer": "_iwinfer",
    "Inference": "_iwinfer",
    "census": "_census",
    "CensusResult": "_census",
    "read_tcp_info": "_tcpinfo",
    "parse_tcp_info": "_tcpinfo",
    "Origin": "_origin",
    "OriginConfig": "_origin_config",
    "RoutePlan": "_routes",
    "setup_routes": "_routes",
    "Arm": "_arms",
    "parse_arms": "_arms",
    "Spool": "_spool",
    "SpoolFull": "_spool",
    "Uploader": "_upload",
    "ProbeAgent": "_agent",
    "BACKGROUND_WARMUP_RTTS": "_agent",
    "CollectorClient": "_collector",
    "CollectorError": "_collector",
}

__all__ = ["__version__", "wire", "sizes", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    if name in ("wire", "sizes"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'iwprobe' has no attribute {name!r}")
