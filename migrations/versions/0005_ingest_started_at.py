"""runs.ingest_started_at: when the current ingest task actually began (not when it was sent), so
the analyzing reaper's deadline does not count time spent waiting in the queue

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 09:10:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('ingest_started_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('ingest_started_at')
