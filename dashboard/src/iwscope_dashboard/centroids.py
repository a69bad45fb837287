"""Where the world map draws each region: a representative centroid per region name.

Presentation only (the map of the Regions page): the analysis results name regions, they do
not place them.
"""

from __future__ import annotations

#: A representative centroid (lat, lon) per region name, for the world map.  Names are
#: matched case-insensitively with ``_``/space folded to ``-``.
REGION_CENTROIDS: dict[str, tuple[float, float]] = {
    "africa": (2.0, 21.0),
    "north-africa": (27.0, 17.0),
    "west-africa": (10.0, -2.0),
    "east-africa": (0.0, 36.0),
    "southern-africa": (-25.0, 25.0),
    "central-africa": (0.0, 20.0),
    "europe": (50.0, 10.0),
    "western-europe": (48.0, 4.0),
    "eastern-europe": (50.0, 28.0),
    "northern-europe": (60.0, 15.0),
    "southern-europe": (41.0, 12.0),
    "asia": (34.0, 100.0),
    "east-asia": (35.0, 115.0),
    "south-asia": (22.0, 79.0),
    "southeast-asia": (5.0, 110.0),
    "central-asia": (45.0, 68.0),
    "middle-east": (29.0, 45.0),
    "north-america": (45.0, -100.0),
    "central-america": (15.0, -88.0),
    "caribbean": (18.0, -72.0),
    "south-america": (-15.0, -60.0),
    "oceania": (-25.0, 140.0),
    "australia": (-25.0, 134.0),
    "us-east": (38.0, -78.0),
    "us-west": (38.0, -121.0),
    "eu-west": (51.0, -2.0),
    "eu-central": (50.0, 9.0),
    "ap-southeast": (1.3, 103.8),
    "ap-northeast": (35.7, 139.7),
    "sa-east": (-23.5, -46.6),
    "af-south": (-33.9, 18.4),
    "me-south": (26.0, 50.5),
    "lab": (0.0, 0.0),
}


def region_centroid(region: str) -> tuple[float | None, float | None]:
    """``(lat, lon)`` of ``region``'s centroid, ``(None, None)`` for a region the table lacks (not drawn)."""
    lat_lon = REGION_CENTROIDS.get(region.strip().lower().replace("_", "-").replace(" ", "-"))
    return lat_lon if lat_lon is not None else (None, None)
