"""send paths (wire v8): an origin observation's send_path and segmentation_offload

How the origin wrote a response (``writev``, ``sendfile``, ``mss-writes``, ``paced``) and what
its device did with TCP's large sends (``tso``, ``gso``, ``off``), as the origin said in its
observation.  Both ``text NOT NULL DEFAULT ''``: the empty string is "not said", what every
observation stored before (and every one an origin older than wire v8 uploads) holds; each is
checked against the wire's values.  They stay on the observation: the join copies the server's
numbers onto the trial, not how the observation was made (nor its ``arm``, ``tls_version`` or
``family``).

Revision ID: 0015_send_paths
Revises: 0014_trial_traces
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_send_paths"
down_revision: str | None = "0014_trial_traces"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The values as wire v8 defines them (``wire.SEND_PATHS``, ``wire.SEGMENTATION_OFFLOADS``),
# written out: a migration must not change when the code does.
_CHECKS = (
    ("send_path", "send_path_known", "send_path IN ('', 'writev', 'sendfile', 'mss-writes', 'paced')"),
    ("segmentation_offload", "segmentation_offload_known", "segmentation_offload IN ('', 'tso', 'gso', 'off')"),
)


def upgrade() -> None:
    # A constant default: PostgreSQL stores it in the catalogue, no rewrite of the table.
    for column, constraint, condition in _CHECKS:
        op.add_column("origin_observations", sa.Column(column, sa.Text(), server_default="", nullable=False))
        op.create_check_constraint(constraint, "origin_observations", condition)


def downgrade() -> None:
    for column, constraint, _ in _CHECKS:
        op.drop_constraint(op.f(f"ck_origin_observations_{constraint}"), "origin_observations", type_="check")
        op.drop_column("origin_observations", column)
