"""The lab twin's result as Markdown and files (``twin.json``, ``twin.md``): every predicted
number sits in a column named a prediction."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from iwscope_dashboard.figures import arm_name
from iwscope_lab.reproduce import json_default
from iwscope_lab.twin import TwinResult


def _fmt(estimate: dict[str, Any]) -> str:
    if estimate.get("ms") is None:
        return f"n too small ({estimate.get('n_pairs', 0)} pairs)"
    ci = estimate.get("ci_ms")
    return f"{estimate['ms']:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "") + f" (n={estimate['n_pairs']})"


def _buffer(path: dict[str, Any]) -> str:
    if path["buffer_bytes"] is None:
        return f"no limit ({path['buffer_fit']}; queue seen {path['queue_seen_bytes'] / 1000:.0f} KB)"
    return f"{path['buffer_bytes'] / 1000:.0f} KB (queue seen)"


def twin_markdown(result: TwinResult) -> str:
    """The twin's result as Markdown; every predicted number is in a column named a prediction."""
    base, treat = result.baseline_iw, result.treatment_iw
    lines = [
        f"# Lab twin of campaign {result.campaign_id} (twin campaign {result.twin_campaign_id})",
        "",
        f"Improvement of each arm over IW{base}, ms, paired, 95 % intervals. Columns marked **prediction** are the "
        "twins' what-if results, not measurements.",
        "",
        "## Paths: the fitted link and the fit check",
        "",
        f"| probe | region | bucket | RTT (ms) | rate | loss | buffer (fit) | measured IW{treat} | twin IW{treat} | overlap |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in result.paths:
        path = entry["path"]
        rate = "-" if path["rate_bps"] is None else f"{path['rate_bps'] / 1e6:.3g} Mbit/s"
        lines.append(
            f"| {path['probe_name']} | {path['region']} | {entry['bucket']} | {path['rtt_ms']:.1f} | {rate} "
            f"| {100 * path['loss']:.2f} % "
            f"| {_buffer(path)} | {_fmt(entry['fit']['measured'])} "
            f"| {_fmt(entry['fit']['twin'])} | {entry['fit']['overlap']} |"
        )
    judged = [entry["fit"]["overlap"] for entry in result.paths if entry["fit"]["overlap"] is not None]
    lines += ["", f"Fit: intervals overlap on {sum(judged)} of {len(judged)} paths with both intervals."]
    lines += [
        "",
        "Per RTT bucket (measured: the bucket's paths with a twin estimate; twin: their twins weighted by the measured pairs):",
        "",
        f"| bucket | paths | measured IW{treat} | twin IW{treat} | overlap |",
        "|---|---|---|---|---|",
    ]
    for bucket in result.buckets:
        fit = bucket["fit"]
        lines.append(
            f"| {bucket['bucket']} | {fit['paths']} | {_fmt(fit['measured'])} | {_fmt(fit['twin'])} | {fit['overlap']} |"
        )
    if result.what_if:
        lines += ["", "## Predictions per RTT bucket (**prediction**)", ""]
        lines += ["| bucket | paths | " + " | ".join(f"{arm_name(arm)} (prediction)" for arm in result.what_if) + " |"]
        lines += ["|---|---|" + "---|" * len(result.what_if)]
        for bucket in result.buckets:
            lines.append(
                f"| {bucket['bucket']} | {bucket['paths']} | "
                + " | ".join(_fmt(bucket["predicted"][arm]) for arm in result.what_if)
                + " |"
            )
    if result.compare_arm is not None:
        arm = result.compare_arm
        lines += [
            "",
            f"## Held out: {arm_name(arm)}, measured vs the twins' prediction",
            "",
            f"| path or bucket | measured {arm_name(arm)} | {arm_name(arm)} (prediction) | overlap |",
            "|---|---|---|---|",
        ]
        for entry in result.paths:
            held = entry["held_out"]
            lines.append(
                f"| {entry['path']['probe_name']} | {_fmt(held['measured'])} | {_fmt(held['predicted'])} | {held['overlap']} |"
            )
        for bucket in result.buckets:
            held = bucket["held_out"]
            name = f"{bucket['bucket']} ({held['paths']} paths)"
            lines.append(f"| {name} | {_fmt(held['measured'])} | {_fmt(held['predicted'])} | {held['overlap']} |")
        judged = [entry["held_out"]["overlap"] for entry in result.paths if entry["held_out"]["overlap"] is not None]
        lines += ["", f"Held out: intervals overlap on {sum(judged)} of {len(judged)} paths with both intervals."]
    return "\n".join(lines) + "\n"


def write_outputs(result: TwinResult, out_dir: pathlib.Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "twin.json").write_text(json.dumps(result.to_dict(), indent=2, default=json_default) + "\n")
    (out_dir / "twin.md").write_text(twin_markdown(result))
