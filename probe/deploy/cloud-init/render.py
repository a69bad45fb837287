#!/usr/bin/env python3
"""Render the cloud-init user-data of a probe VM (standard library only).

    render.py --collector https://collector.example.org --token TOKEN --name probe-jnb-1 \
        --region africa [--country ZA] [--asn 37100] [--pyz ../../dist/iwprobe.pyz] > user-data

The zipapp is embedded (gzip + base64), so the VM needs nothing but python3.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import pathlib
import re
import shlex
import string
import sys

HERE = pathlib.Path(__file__).resolve().parent
_SAFE = re.compile(r"^[A-Za-z0-9._:/@+=-]+$")


def render(collector: str, token: str, name: str, region: str, pyz: pathlib.Path, country: str = "", asn: str = "") -> str:
    for label, value in (("collector", collector), ("token", token), ("name", name), ("region", region)):
        if not _SAFE.match(value):
            raise ValueError(f"--{label} may only contain letters, digits and ._:/@+=- (got {value!r})")
    extra = ""
    if country:
        extra += " --country " + shlex.quote(country)
    if asn:
        extra += " --asn " + str(int(asn))
    template = string.Template((HERE / "user-data.yaml.tmpl").read_text(encoding="utf-8"))
    unit = (HERE.parent / "systemd" / "iwprobe.service").read_bytes()
    return template.substitute(
        pyz_gz_b64=base64.b64encode(gzip.compress(pyz.read_bytes(), mtime=0)).decode("ascii"),
        unit_b64=base64.b64encode(unit).decode("ascii"),
        collector=collector,
        token=token,
        name=name,
        region=region,
        extra_enroll_args=extra,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collector", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--country", default="")
    parser.add_argument("--asn", default="")
    parser.add_argument("--pyz", type=pathlib.Path, default=HERE.parent.parent / "dist" / "iwprobe.pyz")
    args = parser.parse_args()
    if not args.pyz.exists():
        parser.error(f"{args.pyz} does not exist; run probe/deploy/build-pyz.sh first")
    try:
        sys.stdout.write(render(args.collector, args.token, args.name, args.region, args.pyz, args.country, args.asn))
    except ValueError as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
