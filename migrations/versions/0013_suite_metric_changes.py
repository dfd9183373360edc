"""Suite changes of other metrics than latency, alerted as latency's are: suite_changes.metric
(latency, a memory figure, an LLM phase), one change per point and metric (the unique point_id
becomes unique point_id + metric); suites.memory_threshold, the smallest memory change that
alerts; suite_points.llm, each point's LLM phase samples (time to first token, prefill and
decode tokens/s per generation and session), copied into the point as its latency samples are, so
the detector reads a series without parsing every run's analysis each night. NULL for points
recorded before it.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 10:00:00.000000
"""
import warnings
from contextlib import contextmanager

from alembic import op
import sqlalchemy as sa


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

# The unnamed UNIQUE (point_id) of 0007, named when SQLite's table is reflected for the batch copy.
NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


@contextmanager
def _quiet():
    """Reflecting suite_changes reflects the suites it refers to, whose lower(name) index (0009)
    SQLAlchemy cannot reflect on SQLite and says so; the copy does not touch that table."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Skipped unsupported reflection of expression-based index")
        yield


def upgrade() -> None:
    with op.batch_alter_table('suites') as batch:
        batch.add_column(sa.Column('memory_threshold', sa.Float(), nullable=False, server_default='0.05'))
    with op.batch_alter_table('suite_points') as batch:
        batch.add_column(sa.Column('llm', sa.JSON(), nullable=True))
    # UNIQUE (point_id): unnamed in 0007 (PostgreSQL names it suite_changes_point_id_key; on SQLite
    # the naming convention names it when the table is reflected), named by a downgrade of this.
    with _quiet():
        uq = next(c for c in sa.inspect(op.get_bind()).get_unique_constraints('suite_changes')
                  if c['column_names'] == ['point_id'])
    if op.get_bind().dialect.name == 'sqlite':
        # suite_changes is a leaf (no table refers to it): copying it cascades nowhere.
        with _quiet(), op.batch_alter_table('suite_changes', recreate='always', naming_convention=NAMING) as batch:
            batch.add_column(sa.Column('metric', sa.String(length=32), nullable=False, server_default='latency'))
            batch.drop_constraint(uq['name'] or 'uq_suite_changes_point_id', type_='unique')
            batch.create_unique_constraint('uq_suite_changes_point_metric', ['point_id', 'metric'])
        return
    op.add_column('suite_changes', sa.Column('metric', sa.String(length=32), nullable=False,
                                             server_default='latency'))
    op.drop_constraint(uq['name'], 'suite_changes', type_='unique')
    op.create_unique_constraint('uq_suite_changes_point_metric', 'suite_changes', ['point_id', 'metric'])


def downgrade() -> None:
    # Only latency changes fit the one-change-per-point table again.
    op.execute("DELETE FROM suite_changes WHERE metric <> 'latency'")
    if op.get_bind().dialect.name == 'sqlite':
        with _quiet(), op.batch_alter_table('suite_changes', recreate='always') as batch:
            batch.drop_constraint('uq_suite_changes_point_metric', type_='unique')
            batch.drop_column('metric')
            batch.create_unique_constraint('suite_changes_point_id_key', ['point_id'])
        # In place, as 0010 does: a batch copy of these tables would cascade through the foreign keys.
        op.execute('ALTER TABLE suite_points DROP COLUMN llm')
        op.execute('ALTER TABLE suites DROP COLUMN memory_threshold')
        return
    op.drop_constraint('uq_suite_changes_point_metric', 'suite_changes', type_='unique')
    op.drop_column('suite_changes', 'metric')
    op.create_unique_constraint('suite_changes_point_id_key', 'suite_changes', ['point_id'])
    op.drop_column('suite_points', 'llm')
    op.drop_column('suites', 'memory_threshold')
