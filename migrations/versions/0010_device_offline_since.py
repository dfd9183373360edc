"""devices.offline_since: when a device went offline (NULL while it is not), so the reaper can end
the queued runs of a device offline past SME2_DEVICE_LOST_S and reports can say since when;
experiments.warnings: what the submission left out and why (a device offline past that bound),
shown with every report of the experiment.

Devices already offline are stamped with their last update, the best time known for them.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 19:30:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('devices') as batch:
        batch.add_column(sa.Column('offline_since', sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE devices SET offline_since = updated_at WHERE state = 'offline'")
    with op.batch_alter_table('experiments') as batch:
        batch.add_column(sa.Column('warnings', sa.JSON(), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == 'sqlite':
        # SQLite (>= 3.35) drops a column in place. A batch operation would copy and drop the
        # table, and with foreign keys on (server/store/db.py) dropping experiments cascades to every
        # run, result and artifact (devices: every run's device set to NULL).
        op.execute('ALTER TABLE experiments DROP COLUMN warnings')
        op.execute('ALTER TABLE devices DROP COLUMN offline_since')
        return
    op.drop_column('experiments', 'warnings')
    op.drop_column('devices', 'offline_since')
