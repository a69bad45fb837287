"""``iwscope campaigns``: create campaigns (ordinary, census, passive), change a passive
campaign's shares, bundle campaigns.  Registered on the ``iwscope`` group by :mod:`iwscope.cli`;
every heavy import happens inside the command that needs it, so ``iwscope --help`` stays fast."""

from __future__ import annotations

from typing import Any

import click


@click.group()
def campaigns() -> None:
    """Measurement campaigns (also: POST /api/v1/campaigns with an admin token)."""


def _int_list(text: str | None) -> list[int] | None:
    return [int(part) for part in text.split(",") if part.strip()] if text else None


def _arm_list(text: str | None) -> list[int | str] | None:
    """``3,10,10p,10q``: plain arms as IWs, other arms by label (the API checks them)."""
    parts = [part.strip() for part in (text or "").split(",") if part.strip()]
    return [int(part) if part.isdigit() else part for part in parts] or None


@campaigns.command("create")
@click.option("--name", required=True)
@click.option("--origin", "origin_ids", multiple=True, help="origin id (repeatable; an ordinary campaign needs one)")
@click.option(
    "--arms",
    default=None,
    help="IW arms, e.g. 3,10 (an ordinary campaign needs them); labels too: 10p paced, 10q over HTTP/3, learned",
)
@click.option(
    "--census-url",
    "census_urls",
    multiple=True,
    help="a census campaign instead: infer the IW of this http(s) server (repeatable; a URL of an "
    "object of >= 100 KB or a server that answers Range; probes must run as root)",
)
@click.option("--sizes", default=None, help="object sizes in bytes, e.g. 10000,100000")
@click.option("--size-dist", default=None, help="named size distribution instead of --sizes")
@click.option("--sizes-per-round", default=1, show_default=True, type=int)
@click.option("--repetitions", default=1, show_default=True, type=int)
@click.option("--interval", "interval_s", default=0.0, show_default=True, type=float, help="seconds between rounds")
@click.option("--region", "regions", multiple=True, help="probe region taking part (repeatable; default: all)")
@click.option("--starts-at", default=None, help="RFC 3339 start (default: now)")
@click.option("--ends-at", default=None, help="RFC 3339 end (default: open)")
@click.option(
    "--duration",
    "duration_s",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="time box in seconds from the start (instead of --ends-at)",
)
@click.option(
    "--target-ci-ms",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="adaptive: each probe stops once the RTT and bandwidth buckets it feeds have a 95 %% "
    "interval of at most +- this many ms (needs --duration or --ends-at; --repetitions "
    "is then a maximum)",
)
@click.option("--no-calibrate", is_flag=True, help="skip the path calibration before the first round")
@click.option(
    "--trace-share",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="share of rounds whose trials the probes upload as packet traces (wire v7; probes running as root)",
)
@click.option(
    "--server",
    "server_ids",
    multiple=True,
    help="a passive campaign instead: split the real users of this server (iwprobe tap) into arms "
    "(repeatable; needs --passive-arm and --duration or --ends-at)",
)
@click.option(
    "--passive-arm",
    "passive_arms",
    multiple=True,
    metavar="ARM:BP",
    help="passive: an arm and its share of client prefixes in basis points, e.g. default:9000 16:500 "
    "(repeatable; shares sum to 10000)",
)
@click.option(
    "--passive-port",
    "passive_ports",
    multiple=True,
    type=click.IntRange(1, 65535),
    help="passive: a port whose connections are split (repeatable; default: the servers' enrolled ports)",
)
@click.option(
    "--sample-share",
    default=None,
    type=click.FloatRange(0, 1),
    help="passive: share of connections uploaded as raw records (default 0.01)",
)
@click.option("--prefix-v4", default=None, type=int, help="passive: IPv4 prefix length hashed (16-24, default 24)")
@click.option("--prefix-v6", default=None, type=int, help="passive: IPv6 prefix length hashed (32-64, default 48)")
@click.option("--seed", "assignment_seed", default=None, type=int, help="passive: assignment seed (0..2^32-1; default: random)")
@click.option(
    "--flush-interval",
    "flush_interval_s",
    default=None,
    type=int,
    help="passive: seconds between the servers' uploads (default 60)",
)
def campaigns_create(
    name: str,
    origin_ids: tuple[str, ...],
    arms: str | None,
    census_urls: tuple[str, ...],
    sizes: str | None,
    size_dist: str | None,
    sizes_per_round: int,
    repetitions: int,
    interval_s: float,
    regions: tuple[str, ...],
    starts_at: str | None,
    ends_at: str | None,
    duration_s: float | None,
    target_ci_ms: float | None,
    no_calibrate: bool,
    trace_share: float,
    server_ids: tuple[str, ...],
    passive_arms: tuple[str, ...],
    passive_ports: tuple[int, ...],
    sample_share: float | None,
    prefix_v4: int | None,
    prefix_v6: int | None,
    assignment_seed: int | None,
    flush_interval_s: int | None,
) -> None:
    """Create a campaign and print its id alone on stdout."""
    from fastapi import HTTPException
    from pydantic import ValidationError

    from iwprobe import wire
    from iwscope.campaigns.schemas import CampaignIn
    from iwscope.campaigns.services import create_campaign
    from iwscope.db import session_scope

    fields: dict[str, Any] = {
        "name": name,
        "origin_ids": list(origin_ids),
        "arms": _arm_list(arms),
        "sizes": _int_list(sizes),
        "size_dist": size_dist,
        "probe_regions": list(regions) or None,
        "starts_at": starts_at or wire.utc_timestamp(),
        "ends_at": ends_at,
        "duration_s": duration_s,
        "target_ci_ms": target_ci_ms,
        "census_urls": list(census_urls) or None,
        "trace_share": trace_share,
    }
    rounds = {
        "sizes_per_round": sizes_per_round,
        "repetitions": repetitions,
        "interval_s": interval_s,
        "calibrate": not no_calibrate,
    }
    if server_ids:
        # A passive campaign has no rounds: pass only what was given, so CampaignIn names it.
        fields.update({key: value for key, value in rounds.items() if value != _ROUND_DEFAULTS[key]})
        fields.update(
            {
                "server_ids": list(server_ids),
                "passive_arms": _passive_arms(passive_arms),
                "passive_ports": list(passive_ports) or None,
                "sample_share": sample_share,
                "prefix_v4": prefix_v4,
                "prefix_v6": prefix_v6,
                "assignment_seed": assignment_seed,
                "flush_interval_s": flush_interval_s,
            }
        )
    else:
        fields.update(rounds)
        if passive_arms or passive_ports:
            raise click.BadParameter("--passive-arm and --passive-port need --server (a passive campaign)")
    try:
        campaign = CampaignIn.model_validate(fields)
        with session_scope() as session:
            created = create_campaign(session, campaign)
            campaign_id = created.id
    except (ValidationError, ValueError) as error:
        raise click.BadParameter(str(error)) from None
    except HTTPException as error:
        raise click.ClickException(str(error.detail)) from None
    click.echo(campaign_id)


#: What ``campaigns create`` passes for the rounds when not told otherwise.
_ROUND_DEFAULTS: dict[str, Any] = {"sizes_per_round": 1, "repetitions": 1, "interval_s": 0.0, "calibrate": True}


def _passive_arms(specs: tuple[str, ...]) -> list[dict[str, Any]] | None:
    """``ARM:BP`` options (``default:9000``, ``16:500``) as the API's ``passive_arms``."""
    arms: list[dict[str, Any]] = []
    for spec in specs:
        arm, separator, share = spec.rpartition(":")
        if not separator or not arm or not share.isdigit():
            raise click.BadParameter(f"{spec!r}: give ARM:BP, e.g. default:9000 or 16:500", param_hint="--passive-arm")
        arms.append({"arm": arm, "share_bp": int(share)})
    return arms or None


@campaigns.command("shares")
@click.argument("campaign_id", type=click.IntRange(min=1))
@click.option(
    "--passive-arm",
    "passive_arms",
    multiple=True,
    required=True,
    metavar="ARM:BP",
    help="the arms and their new shares in basis points (repeatable; summing to 10000)",
)
def campaigns_shares(campaign_id: int, passive_arms: tuple[str, ...]) -> None:
    """Change the arms or shares of passive campaign N (a share sweep: 5 % -> 25 % -> 50 % treated);
    a change starts the campaign's next phase, printed alone on stdout."""
    from fastapi import HTTPException
    from pydantic import ValidationError

    from iwscope.campaigns.models import Campaign
    from iwscope.campaigns.schemas import CampaignPatch
    from iwscope.campaigns.services import update_campaign
    from iwscope.db import session_scope

    try:
        patch = CampaignPatch.model_validate({"passive_arms": _passive_arms(passive_arms)})
        with session_scope() as session:
            campaign = session.get(Campaign, campaign_id, with_for_update=True)
            if campaign is None:
                raise click.ClickException(f"no campaign {campaign_id}")
            phase = update_campaign(session, campaign, patch).phase
    except ValidationError as error:
        raise click.BadParameter(str(error)) from None
    except HTTPException as error:
        raise click.ClickException(str(error.detail)) from None
    click.echo(phase)


@campaigns.command("bundle")
@click.argument("campaign_ids", nargs=-1, required=True, type=click.IntRange(min=1))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="directory of the bundle (data/*.parquet, campaigns.json, versions.json, manifest.json)",
)
def campaigns_bundle(campaign_ids: tuple[int, ...], out_dir: str) -> None:
    """Write a reproducibility bundle of these campaigns: their data as Parquet, their
    configuration, the software versions (iwscope.exports.bundle)."""
    import pathlib

    from iwscope.db import session_scope
    from iwscope.exports.bundle import BundleError, write_bundle

    try:
        with session_scope() as session:
            manifest = write_bundle(session, list(campaign_ids), pathlib.Path(out_dir))
    except BundleError as error:
        raise click.BadParameter(str(error)) from None
    for table, count in manifest["rows"].items():
        click.echo(f"{table}\t{count}")
    click.echo(f"bundle: {out_dir}")
